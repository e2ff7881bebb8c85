"""What is being estimated: the training (or inference) step a user wants to run.

A `Workload` is a frozen, keyword-only description of one step: batch, sequence length (or image
size), mode, precision, optimizer and memory techniques. It is validated on construction, so a
bad value fails early with a message that quotes it and says the fix.

Example:
    >>> from memfit import Workload
    >>> Workload(batch_size=4, seq_len=512, precision="bf16-mixed", optimizer="adamw")
    Workload(batch_size=4, seq_len=512, ...)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from memfit.errors import BadInputError, closest

#: Precision recipes. "-mixed" keeps fp32 weights and runs matmuls under autocast (CUDA policy);
#: "-true" casts the whole model (weights, gradients, optimizer state) to the 16-bit dtype.
PRECISIONS = ("fp32", "fp16-mixed", "bf16-mixed", "fp16-true", "bf16-true")

#: Optimizers, laid out in memory as their CUDA implementations keep state.
OPTIMIZERS = (
    "sgd",
    "sgd-momentum",
    "adam",
    "adamw",
    "adamw-fused",
    "adafactor",
    "adamw-8bit",
    "lion",
    "none",
)

MODES = ("train", "inference")
CHECKPOINTING = ("off", "blocks")
ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True, kw_only=True)
class LoraConfig:
    """LoRA adapters on the named linear layers; the base model is frozen.

    Attributes:
        rank: adapter rank r (A is r x in_features, B is out_features x r).
        alpha: scaling numerator (scale = alpha / rank); does not change memory.
        targets: module-name suffixes to adapt, e.g. ("q_proj", "v_proj"). Empty means
            "every nn.Linear inside the repeated blocks".
    """

    rank: int
    alpha: float = 16.0
    targets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.rank <= 0:
            raise BadInputError(f"LoRA rank must be a positive integer, got {self.rank!r}.")

    @property
    def label(self) -> str:
        """How reports and `apply_` name the technique."""
        return f"LoRA r={self.rank}"


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One training or inference step.

    Attributes:
        batch_size: micro-batch size (samples per forward).
        seq_len: tokens per sample for text models; ignored for images.
        image_size: side of the square input image for vision models.
        mode: "train" (forward, backward, optimizer step) or "inference" (forward under no_grad).
        precision: one of PRECISIONS.
        optimizer: one of OPTIMIZERS; "none" runs forward + backward without a step.
        grad_accum: gradient-accumulation steps (micro-batches per optimizer step).
        checkpointing: "off" or "blocks" (non-reentrant checkpoint on every repeated block).
        checkpoint_first: with checkpointing "blocks", checkpoint only the first k repeated
            blocks (those nearest the input, whose recomputation happens last in backward,
            when the later blocks' activations are already freed); None means all.
        lora: LoRA adapters, or None.
        freeze: module-name prefixes whose parameters are frozen (no grad, no optimizer state).
        attention: "sdpa" (PyTorch scaled_dot_product_attention) or "eager" (explicit softmax).
        gpu: target GPU name from the catalog (decides the attention kernel and "fits"), or None.
        offload_optimizer: keep optimizer state on the CPU and run the update there (gradients
            go down and parameters come back over PCIe each step).
        embedding_on_cpu: keep the input embedding table (weights, gradients, optimizer state)
            on the CPU; its output is moved to the GPU.
        tie_embeddings: share one matrix between input embedding and output projection.
        gpus: data-parallel GPUs. Above 1, parameters, gradients and optimizer state are
            sharded over them with FSDP2 (`fully_shard` on each repeated block, then the root;
            ZeRO-3); `batch_size` is per GPU. The estimate is of one rank.
        fsdp_autocast: with `gpus` above 1 and a "-mixed" precision, run autocast over fp32
            FSDP2 shards (fp32 all-gathers). False (the default) is what FSDP2 users write:
            `MixedPrecisionPolicy(param_dtype=<16-bit>, reduce_dtype=float32)`, bf16/fp16
            all-gathers and compute, fp32 gradient reduction and shards, no autocast.
        steps: training steps traced; the first is warm-up (optimizer state is created), the
            later ones are steady state. Two is enough for every optimizer memfit knows.
    """

    batch_size: int = 1
    seq_len: int | None = None
    image_size: int | None = None
    mode: str = "train"
    precision: str = "fp32"
    optimizer: str = "adamw"
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
    fsdp_autocast: bool = False
    steps: int = 2

    def __post_init__(self) -> None:
        _positive("batch_size", self.batch_size, "--batch")
        if self.seq_len is not None:
            _positive("seq_len", self.seq_len, "--seq")
        if self.image_size is not None:
            _positive("image_size", self.image_size, "--image-size")
        _positive("grad_accum", self.grad_accum, "--grad-accum")
        _positive("steps", self.steps, "steps")
        _positive("gpus", self.gpus, "--gpus")
        check_choice("mode", self.mode, MODES)
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("checkpointing", self.checkpointing, CHECKPOINTING)
        if self.checkpoint_first is not None:
            if self.checkpointing != "blocks":
                raise BadInputError(
                    "checkpoint_first needs checkpointing='blocks' (--checkpointing blocks)."
                )
            if isinstance(self.checkpoint_first, bool) or self.checkpoint_first < 0:
                raise BadInputError(
                    f"checkpoint_first must be a block count >= 0, got {self.checkpoint_first!r}."
                )
        check_choice("attention", self.attention, ATTENTION)
        if self.gpus > 1 and (self.offload_optimizer or self.embedding_on_cpu):
            raise BadInputError(
                "With FSDP over several GPUs (--gpus), memfit does not model optimizer offload or "
                "an embedding on the CPU (FSDP2 has its own CPUOffloadPolicy). Drop one of them."
            )
        if self.fsdp_autocast and not (self.gpus > 1 and self.mixed):
            raise BadInputError(
                "fsdp_autocast chooses how FSDP2 runs a '-mixed' precision over several GPUs; "
                f"it does not apply to gpus={self.gpus} with precision {self.precision!r}. "
                "Drop it, or use gpus > 1 with bf16-mixed or fp16-mixed."
            )
        if self.embedding_on_cpu and self.tie_embeddings:
            raise BadInputError(
                "--embedding-on-cpu and --tie-embeddings conflict: a tied output projection "
                "would have to run on the CPU too. Choose one."
            )

    @property
    def training(self) -> bool:
        return self.mode == "train"

    @property
    def compute_dtype_name(self) -> str:
        """The dtype matmuls run in: "float32", "float16" or "bfloat16"."""
        if self.precision.startswith("fp16"):
            return "float16"
        if self.precision.startswith("bf16"):
            return "bfloat16"
        return "float32"

    @property
    def mixed(self) -> bool:
        return self.precision.endswith("-mixed")

    @property
    def autocast(self) -> bool:
        """Whether the step runs under autocast: "-mixed", except with FSDP2's
        MixedPrecisionPolicy (several GPUs without `fsdp_autocast`), which casts instead."""
        return self.mixed and (self.gpus == 1 or self.fsdp_autocast)

    @property
    def fsdp_param_dtype(self) -> str | None:
        """The dtype FSDP2's MixedPrecisionPolicy all-gathers and computes in, or None."""
        if self.gpus > 1 and self.mixed and not self.fsdp_autocast:
            return self.compute_dtype_name
        return None

    @property
    def pure_low_precision(self) -> bool:
        return self.precision.endswith("-true")

    def with_(self, **changes: Any) -> Workload:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)


def _positive(name: str, value: object, flag: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise BadInputError(
            f"{name} must be a positive integer, got {value!r}. Pass e.g. {flag} 1."
        )


def check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise BadInputError(
            f"Unknown {name} {value!r}.{closest(value, list(allowed))} "
            f"Choose one of: {', '.join(allowed)}."
        )
