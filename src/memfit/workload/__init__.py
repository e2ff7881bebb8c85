"""What is being estimated: the training (or inference) step a user wants to run.

A `Workload` is a frozen, keyword-only description of one step: batch, sequence length (or image
size), mode, precision, optimizer and memory techniques. It is validated on construction, so a
bad value fails early with a message that quotes it and says the fix. Messages name the Python
parameters (`batch_size=1`); the CLI rewrites them to its flags (`--batch 1`).

An option that does not apply to the step is an error, never ignored: a training-only option
(an optimizer, gradient accumulation, checkpointing, LoRA, offload, frozen prefixes) with
`mode="inference"`, here; an option the model has no use for (`seq_len` on a vision model,
`image_size` on a text model) when the model is known (`memfit.estimate`).

Example:
    >>> from memfit import Workload
    >>> Workload(batch_size=4, seq_len=512, precision="bf16-mixed", optimizer="adamw")
    Workload(batch_size=4, seq_len=512, ...)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from memfit.errors import BadInputError
from memfit.optimizers import DEFAULT_OPTIMIZER, NO_OPTIMIZER, is_paged
from memfit.precision import Precision, precision_of
from memfit.workload.checks import (
    check_choice,
    check_ddp,
    check_quantize,
    check_step_in_backward,
    check_teacher,
    is_int,
    names,
    positive,
)
from memfit.workload.choices import (
    ACTIVATION_OFFLOAD,
    ATTENTION,
    AUTO_PRECISION,
    CACHES,
    CHECKPOINTING,
    DISTILL_LOSSES,
    FSDP_MIXED,
    MODES,
    OPTIMIZERS,
    PRECISIONS,
    QUANTIZE,
    TEACHER_PRECISIONS,
)

__all__ = [
    "ACTIVATION_OFFLOAD",
    "ATTENTION",
    "AUTO_PRECISION",
    "CACHES",
    "CHECKPOINTING",
    "DISTILL_LOSSES",
    "FSDP_MIXED",
    "MODES",
    "OPTIMIZERS",
    "PRECISIONS",
    "QUANTIZE",
    "TEACHER_PRECISIONS",
    "LoraConfig",
    "Workload",
    "check_choice",
]


@dataclass(frozen=True, kw_only=True)
class LoraConfig:
    """LoRA adapters on the named linear layers; the base model is frozen.

    Attributes:
        rank: adapter rank r (A is r x in_features, B is out_features x r).
        alpha: scaling numerator (scale = alpha / rank); does not change memory.
        targets: module-name suffixes to adapt, e.g. ("q_proj", "v_proj"), or the same as one
            comma-separated string, "q_proj,v_proj" (the form `--lora-targets` takes); kept as a
            tuple. Empty means "every nn.Linear inside the repeated blocks".
    """

    rank: int
    alpha: float = 16.0
    targets: str | Sequence[str] = ()

    def __post_init__(self) -> None:
        if not is_int(self.rank) or self.rank <= 0:
            raise BadInputError(
                f"LoRA rank must be a positive integer, got {self.rank!r}. "
                "Pass e.g. LoraConfig(rank=8)."
            )
        if (
            isinstance(self.alpha, bool)
            or not isinstance(self.alpha, (int, float))
            or self.alpha <= 0
        ):
            raise BadInputError(f"LoRA alpha must be a positive number, got {self.alpha!r}.")
        object.__setattr__(self, "targets", names("LoRA targets", self.targets))

    @property
    def label(self) -> str:
        """How reports and `apply_` name the technique."""
        return f"LoRA r={self.rank}"


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One training or inference step.

    Attributes:
        batch_size: micro-batch size (samples per forward).
        seq_len: tokens per sample for text (and audio-decoder) models; None: 512, or the
            model's own length. Given for a model whose input is not tokens, an error.
        image_size: side of the square input image for vision models; None: the model's own.
            Given for a model whose input is not an image, an error.
        mode: "train" (forward, backward, optimizer step) or "inference" (forward under no_grad).
            The options below that only change training (optimizer, grad_accum, checkpointing,
            lora, freeze, offload_optimizer) are errors with "inference".
        precision: one of PRECISIONS, or "auto" (inference, generation: the checkpoint's dtype).
        optimizer: one of OPTIMIZERS; "none" runs forward + backward without a step. None (not
            given): "adamw" in training, "none" in inference. Read after construction, it is
            always one of OPTIMIZERS.
        grad_accum: gradient-accumulation steps (micro-batches per optimizer step).
        checkpointing: "off" or "blocks" (non-reentrant checkpoint on every repeated block).
        checkpoint_first: with checkpointing "blocks", checkpoint only the first k repeated
            blocks (those nearest the input, whose recomputation happens last in backward,
            when the later blocks' activations are already freed); None means all.
        lora: LoRA adapters, or None.
        freeze: module-name prefixes whose parameters are frozen (no grad, no optimizer state);
            a tuple, or one comma-separated string.
        attention: "sdpa" (PyTorch scaled_dot_product_attention) or "eager" (explicit softmax).
        gpu: target GPU name from the catalog (decides the attention kernel and "fits"), or a
            card limited to a budget ("rtx-4090@12GiB", a bare "12GiB"), or None.
        offload_optimizer: keep optimizer state on the CPU and run the update there (gradients
            go down and parameters come back over PCIe each step).
        embedding_on_cpu: keep the input embedding table (weights, gradients, optimizer state)
            on the CPU; its output is moved to the GPU.
        tie_embeddings: share one matrix between input embedding and output projection.
        gpus: data-parallel GPUs. Above 1, parameters, gradients and optimizer state are
            sharded over them with FSDP2 (`fully_shard` on each repeated block, then the root;
            ZeRO-3), or with `ddp` each GPU holds the whole model; `batch_size` is per GPU.
            The estimate is of one rank.
        ddp: the `gpus` run DistributedDataParallel (memfit.estimator.ddp): each holds the
            whole step plus DDP's gradient buckets (a second copy of the gradients, as
            `gradient_as_bucket_view=False`, PyTorch's default, keeps them).
        fsdp_mixed: with `gpus` above 1 and a "-mixed" precision, how FSDP2 runs it (one of
            FSDP_MIXED). "policy" (the default) is what FSDP2 users write:
            `MixedPrecisionPolicy(param_dtype=<16-bit>, reduce_dtype=float32)`, bf16/fp16
            all-gathers and compute, fp32 gradient reduction and shards, no autocast.
            "autocast": autocast over fp32 shards (fp32 all-gathers). "accelerate": what
            `accelerate launch` and the HF Trainer run (accelerate's `set_mixed_precision` and
            native AMP): `MixedPrecisionPolicy(param_dtype=, reduce_dtype=, output_dtype=
            <16-bit>)` with the forward under autocast too.
        steps: training steps traced; the first is warm-up (optimizer state is created), the
            later ones are steady state. Two is enough for every optimizer memfit knows.
        quantize: quantized base weights, one of QUANTIZE, or None. In training the quantized
            weights are frozen, so it needs `lora` (QLoRA).
        prepare_kbit: apply peft's `prepare_model_for_kbit_training` casts (the non-quantized
            parameters to float32) to a quantized model, as QLoRA users do; needs `quantize`.
        optimizer_in_backward: step each parameter from its post-accumulate-grad hook and
            free its gradient at once, so no full set of gradients exists. Excludes gradient
            accumulation, fp16-mixed (loss scaling unscales all gradients at once) and
            optimizer offload.
        offload_activations: keep the tensors autograd saves for backward in pinned CPU memory:
            False, or one of ACTIVATION_OFFLOAD ("save_on_cpu": PyTorch's
            `torch.autograd.graph.save_on_cpu(pin_memory=True)`; "torchtune": its filters keep
            parameters and tiny tensors on the device). True means "save_on_cpu"; read after
            construction it is False or a variant name.
        chunked_loss: compute the cross-entropy over this many chunks of the sequence, so the
            float32 logits are never all alive; None: one piece, as the model does.
        fsdp_cpu_offload: FSDP2's CPUOffloadPolicy: parameters, gradients and optimizer state on
            the CPU, the optimizer step on the CPU (also with gpus=1).
        host_memory: the host RAM budget for what lives on the CPU ("64GiB"); None: this
            machine's RAM.
        prompt_len: with mode="generate", tokens of the prompt (prefill); None: 512.
        new_tokens: with mode="generate", tokens generated after the prompt (decode steps).
        num_beams: with mode="generate", beams of beam search (1: greedy).
        cache: with mode="generate", the KV cache, one of CACHES.
        tp: tensor-parallel GPUs for generation (weights and KV heads split; one rank estimated).
        teacher: knowledge distillation from this teacher (a model source, as `model` takes
            it): each micro-batch runs the student, then the frozen teacher under no_grad, and
            the KD loss of both logits (memfit.techniques.distillation.config). Training only.
        teacher_precision: the teacher's weights, one of TEACHER_PRECISIONS; None: the
            student's compute dtype.
        teacher_quantize: the teacher's weights quantized, one of QUANTIZE.
        distill_loss: one of DISTILL_LOSSES ("chunked-kl": both logits over chunks of the
            positions, never all alive).
        teacher_top_k: offline distillation: the teacher's top-k logits and their token ids,
            computed beforehand, come with the batch; no teacher runs in the step.
    """

    batch_size: int = 1
    seq_len: int | None = None
    image_size: int | None = None
    mode: str = "train"
    precision: str = "fp32"
    # None until __post_init__ resolves it from the mode; a str on every constructed Workload.
    optimizer: str = None  # type: ignore[assignment]
    grad_accum: int = 1
    checkpointing: str = "off"
    checkpoint_first: int | None = None
    lora: LoraConfig | None = None
    freeze: tuple[str, ...] = ()
    attention: str = "sdpa"
    gpu: str | None = None
    offload_optimizer: bool = False
    embedding_on_cpu: bool = False
    tie_embeddings: bool = False
    gpus: int = 1
    ddp: bool = False
    fsdp_mixed: str = "policy"
    steps: int = 2
    quantize: str | None = None
    prepare_kbit: bool = False
    optimizer_in_backward: bool = False
    offload_activations: bool | str = False
    chunked_loss: int | None = None
    fsdp_cpu_offload: bool = False
    host_memory: str | None = None
    prompt_len: int | None = None
    new_tokens: int = 128
    num_beams: int = 1
    cache: str = "dynamic"
    tp: int = 1
    teacher: str | None = None
    teacher_precision: str | None = None
    teacher_quantize: str | None = None
    distill_loss: str = "kl"
    teacher_top_k: int | None = None
    #: Whether the optimizer was given, not resolved from the mode (see `with_`).
    _optimizer_given: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check_values()
        object.__setattr__(self, "_optimizer_given", self.optimizer is not None)
        if self.optimizer is None:
            default = DEFAULT_OPTIMIZER if self.mode == "train" else NO_OPTIMIZER
            object.__setattr__(self, "optimizer", default)
        self._check_inference()
        self._check_combinations()

    def _check_values(self) -> None:
        """Each field on its own: types, ranges, choices."""
        positive("batch_size", self.batch_size)
        if self.seq_len is not None:
            positive("seq_len", self.seq_len)
        if self.image_size is not None:
            positive("image_size", self.image_size)
        positive("grad_accum", self.grad_accum)
        positive("steps", self.steps)
        positive("gpus", self.gpus)
        check_choice("mode", self.mode, MODES)
        check_choice("precision", self.precision, (*PRECISIONS, AUTO_PRECISION))
        if self.precision == AUTO_PRECISION and self.mode == "train":
            raise BadInputError(
                "precision='auto' (the checkpoint's dtype) is for inference and generation; a "
                "training step needs a recipe. Use e.g. precision='bf16-mixed', or mode='generate'."
            )
        if self.optimizer is not None:
            check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("checkpointing", self.checkpointing, CHECKPOINTING)
        check_choice("attention", self.attention, ATTENTION)
        if self.quantize is not None:
            check_choice("quantize", self.quantize, QUANTIZE)
        if self.prompt_len is not None:
            positive("prompt_len", self.prompt_len)
        positive("new_tokens", self.new_tokens)
        positive("num_beams", self.num_beams)
        positive("tp", self.tp)
        check_choice("cache", self.cache, CACHES)
        if self.chunked_loss is not None and (
            not is_int(self.chunked_loss) or self.chunked_loss < 2
        ):
            raise BadInputError(
                f"chunked_loss must be a number of chunks >= 2, got {self.chunked_loss!r}. "
                "Pass e.g. chunked_loss=8, or leave it out for the model's own loss."
            )
        if self.host_memory is not None:
            from memfit.units import parse_bytes

            if not isinstance(self.host_memory, str):
                raise BadInputError(
                    f"host_memory must be a size such as '64GiB', got {self.host_memory!r}."
                )
            parse_bytes(self.host_memory)  # a bad size raises, saying the form
        if self.offload_activations is True:
            object.__setattr__(self, "offload_activations", ACTIVATION_OFFLOAD[0])
        if self.offload_activations is not False:
            check_choice("offload_activations", self.offload_activations, ACTIVATION_OFFLOAD)
        for flag in (
            "offload_optimizer",
            "embedding_on_cpu",
            "tie_embeddings",
            "prepare_kbit",
            "optimizer_in_backward",
            "fsdp_cpu_offload",
        ):
            if not isinstance(getattr(self, flag), bool):
                raise BadInputError(f"{flag} must be True or False, got {getattr(self, flag)!r}.")
        if self.lora is not None and not isinstance(self.lora, LoraConfig):
            raise BadInputError(
                f"lora must be a LoraConfig or None, got {self.lora!r}. "
                "Pass e.g. lora=LoraConfig(rank=8)."
            )
        object.__setattr__(self, "freeze", names("freeze", self.freeze))
        if self.checkpoint_first is not None and (
            not is_int(self.checkpoint_first) or self.checkpoint_first < 0
        ):
            raise BadInputError(
                f"checkpoint_first must be a block count >= 0, got {self.checkpoint_first!r}."
            )
        if self.gpu is not None and not isinstance(self.gpu, str):
            raise BadInputError(
                f"gpu must be a GPU name such as 'rtx-4090' (see `memfit gpus`), got {self.gpu!r}."
            )
        if self.gpu is not None:
            # Here, not at the top: the GPU catalog is only needed when a GPU is named.
            from memfit.cuda.target import get_gpu

            get_gpu(self.gpu)  # an unknown name or a bad budget raises, naming the closest

    def _check_inference(self) -> None:
        """A training-only option with mode="inference" would be ignored: say so instead."""
        if self.training:
            return
        given = []
        if self._optimizer_given and self.optimizer != NO_OPTIMIZER:
            given.append(f"optimizer={self.optimizer!r}")
        if self.grad_accum != 1:
            given.append(f"grad_accum={self.grad_accum}")
        if self.checkpointing != "off":
            given.append(f"checkpointing={self.checkpointing!r}")
        if self.lora is not None:
            given.append(f"lora=LoraConfig(rank={self.lora.rank})")
        if self.offload_optimizer:
            given.append("offload_optimizer=True")
        if self.freeze:
            given.append(f"freeze={self.freeze!r}")
        for flag in ("optimizer_in_backward", "fsdp_cpu_offload"):
            if getattr(self, flag):
                given.append(f"{flag}=True")
        if self.offload_activations:
            given.append(f"offload_activations={self.offload_activations!r}")
        if self.chunked_loss is not None:
            given.append(f"chunked_loss={self.chunked_loss}")
        if self.teacher is not None:
            given.append(f"teacher={self.teacher!r}")
        if given:
            it = "it" if len(given) == 1 else "them"
            raise BadInputError(
                f"{', '.join(given)}: only a training step uses {it}, and mode is {self.mode!r} "
                "(forwards under no_grad: no gradients, no optimizer step, nothing to "
                f"recompute). Drop {it}, or use mode='train'."
            )

    def _check_generation(self) -> None:
        """The generation options apply to mode="generate" only, and seq_len does not."""
        defaults = {"prompt_len": None, "new_tokens": 128, "num_beams": 1, "cache": "dynamic",
                    "tp": 1}  # fmt: skip
        if self.mode != "generate":
            given = [
                f"{k}={getattr(self, k)!r}" for k, d in defaults.items() if getattr(self, k) != d
            ]
            if given:
                it = "it" if len(given) == 1 else "them"
                raise BadInputError(
                    f"{', '.join(given)}: only mode='generate' uses {it}, and mode is "
                    f"{self.mode!r}. Use mode='generate', or drop {it}."
                )
            return
        if self.seq_len is not None:
            raise BadInputError(
                f"seq_len={self.seq_len} with mode='generate': a generation has a prompt and new "
                f"tokens. Use prompt_len={self.seq_len} (and new_tokens=...) instead."
            )
        if self.gpus > 1:
            raise BadInputError(
                f"gpus={self.gpus} with mode='generate': generation over several GPUs splits "
                f"the model with tensor parallelism. Use tp={self.gpus} instead."
            )

    @property
    def _paged_optimizer(self) -> bool:
        return is_paged(self.optimizer)

    def _check_combinations(self) -> None:
        """Options that are fine alone and conflict together."""
        self._check_generation()
        if self.checkpoint_first is not None and self.checkpointing != "blocks":
            raise BadInputError("checkpoint_first needs checkpointing='blocks'.")
        if self.fsdp_cpu_offload and self._paged_optimizer:
            raise BadInputError(
                f"fsdp_cpu_offload=True with optimizer={self.optimizer!r}: the optimizer steps "
                "on FSDP2's CPU shards, where paged state is plain CPU memory. Use "
                f"optimizer={DEFAULT_OPTIMIZER!r} with it, or drop fsdp_cpu_offload."
            )
        if self.offload_optimizer and self._paged_optimizer:
            raise BadInputError(
                f"offload_optimizer=True with optimizer={self.optimizer!r}: a paged optimizer "
                "keeps its state in CUDA unified memory, which pages to the host by itself. "
                f"Drop offload_optimizer, or use optimizer={DEFAULT_OPTIMIZER!r} with it."
            )
        if self.training and self.offload_optimizer and self.optimizer == NO_OPTIMIZER:
            raise BadInputError(
                "offload_optimizer=True moves optimizer state to the CPU, and optimizer is "
                f"'none'. Name an optimizer (e.g. optimizer={DEFAULT_OPTIMIZER!r}) or drop "
                "offload_optimizer."
            )
        if self.gpus > 1 and (self.offload_optimizer or self.embedding_on_cpu):
            raise BadInputError(
                f"With several GPUs (gpus={self.gpus}), memfit does not model "
                "offload_optimizer or embedding_on_cpu (FSDP2 has its own CPUOffloadPolicy). "
                "Drop one of them."
            )
        check_choice("fsdp_mixed", self.fsdp_mixed, FSDP_MIXED)
        if self.fsdp_mixed != "policy" and not (self.gpus > 1 and self.mixed and not self.ddp):
            raise BadInputError(
                "fsdp_mixed chooses how FSDP2 runs a '-mixed' precision over several GPUs; "
                f"fsdp_mixed={self.fsdp_mixed!r} does not apply to gpus={self.gpus}"
                f"{' with ddp' if self.ddp else ''} and precision {self.precision!r}. Drop "
                "it, or use gpus > 1 (FSDP2) with bf16-mixed or fp16-mixed."
            )
        check_quantize(self)
        check_teacher(self)
        check_step_in_backward(self)
        check_ddp(self)
        if self.fsdp_cpu_offload and (self.offload_optimizer or self.embedding_on_cpu):
            raise BadInputError(
                "fsdp_cpu_offload already keeps parameters, gradients and optimizer state on "
                "the CPU; offload_optimizer and embedding_on_cpu do not combine with it. Drop "
                "them, or drop fsdp_cpu_offload."
            )
        if self.embedding_on_cpu and self.tie_embeddings:
            raise BadInputError(
                "embedding_on_cpu and tie_embeddings conflict: a tied output projection "
                "would have to run on the CPU too. Choose one."
            )

    @property
    def optimizer_on_cpu(self) -> bool:
        """Whether the optimizer's state lives, and its step runs, on the CPU: optimizer
        offload, or FSDP2's CPU offload."""
        return self.offload_optimizer or self.fsdp_cpu_offload

    @property
    def training(self) -> bool:
        return self.mode == "train"

    @property
    def recipe(self) -> Precision:
        """The precision as a value (memfit.precision). "auto" (the checkpoint's dtype, resolved
        by the estimate: memfit.estimator.resolve_precision) reads as fp32 until then."""
        return precision_of("fp32" if self.precision == AUTO_PRECISION else self.precision)

    @property
    def compute_dtype_name(self) -> str:
        """The dtype matmuls run in: "float32", "float16" or "bfloat16"."""
        return self.recipe.dtype_name

    @property
    def fsdp(self) -> bool:
        """Whether FSDP2 shards the model: over several GPUs without `ddp`, or over one with
        its CPU offload."""
        return (self.gpus > 1 and not self.ddp) or self.fsdp_cpu_offload

    @property
    def mixed(self) -> bool:
        return self.recipe.mixed

    @property
    def autocast(self) -> bool:
        """Whether the step runs under autocast: "-mixed", except with FSDP2's
        MixedPrecisionPolicy alone (several GPUs, `fsdp_mixed="policy"`), which casts
        instead."""
        return self.mixed and (self.gpus == 1 or self.ddp or self.fsdp_mixed != "policy")

    @property
    def fsdp_param_dtype(self) -> str | None:
        """The dtype FSDP2's MixedPrecisionPolicy all-gathers and computes in, or None."""
        if self.gpus > 1 and not self.ddp and self.mixed and self.fsdp_mixed != "autocast":
            return self.compute_dtype_name
        return None

    @property
    def fsdp_reduce_dtype(self) -> str | None:
        """The dtype of FSDP2's gradient reduction (and of its forward outputs) when it is not
        the shards' float32: the 16-bit dtype with accelerate's policy, else None."""
        return self.compute_dtype_name if self.fsdp_mixed == "accelerate" else None

    @property
    def pure_low_precision(self) -> bool:
        return self.recipe.pure

    def with_(self, **changes: Any) -> Workload:
        """A copy with some fields changed (validated again).

        An optimizer that was not given follows the mode: `Workload().with_(mode="inference")`
        has no optimizer, as `Workload(mode="inference")` has none.
        """
        if "mode" in changes and "optimizer" not in changes and not self._optimizer_given:
            changes["optimizer"] = None
        return replace(self, **changes)
