"""One frozen, keyword-only config per memory technique: what the planner recommends, what
`memfit.apply_` applies, and what the estimator reads (through `Workload`, see
`configs_from_workload`).

Example:
    >>> import memfit
    >>> from memfit.techniques import CheckpointConfig, PrecisionConfig, OptimizerConfig
    >>> setup = memfit.apply_(model, [CheckpointConfig(), PrecisionConfig(precision="bf16-mixed"),
    ...                               OptimizerConfig(name="adamw", lr=1e-4)])
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.errors import BadInputError
from memfit.workload import OPTIMIZERS, PRECISIONS, LoraConfig, Workload, _choice

#: Ops whose outputs selective checkpointing keeps by default: the matmuls and attention kernels,
#: the expensive ops to recompute (the policy torchtitan uses for "selective op" checkpointing).
#: Everything else (activations, norms, elementwise) is recomputed in backward.
DEFAULT_SAVE_OPS = (
    "mm",
    "addmm",
    "bmm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
)

CHECKPOINT_POLICIES = ("full", "selective")


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Non-reentrant activation checkpointing on repeated blocks.

    Attributes:
        blocks: module paths to wrap; None finds the repeated blocks (the largest
            nn.ModuleList / nn.Sequential of identical modules: HF decoder layers, encoder
            layers, ResNet stages' blocks ...).
        first: wrap only the first k of those blocks (the planner's least-recompute choice);
            None wraps all.
        policy: "full" recomputes the whole block in backward; "selective" keeps the outputs of
            `save_ops` (matmuls, attention) and recomputes the rest
            (torch.utils.checkpoint.create_selective_checkpoint_contexts).
        save_ops: aten op names whose outputs the selective policy saves.
    """

    blocks: tuple[str, ...] | None = None
    first: int | None = None
    policy: str = "full"
    save_ops: tuple[str, ...] = DEFAULT_SAVE_OPS

    def __post_init__(self) -> None:
        _choice("checkpoint policy", self.policy, CHECKPOINT_POLICIES)
        if self.first is not None and (isinstance(self.first, bool) or self.first < 0):
            raise BadInputError(f"CheckpointConfig.first must be >= 0, got {self.first!r}.")


@dataclass(frozen=True, kw_only=True)
class PrecisionConfig:
    """Mixed ("-mixed": fp32 weights, autocast; GradScaler with fp16) or pure ("-true": the
    model cast to the 16-bit dtype) precision. One of workload.PRECISIONS."""

    precision: str = "bf16-mixed"

    def __post_init__(self) -> None:
        _choice("precision", self.precision, PRECISIONS)


@dataclass(frozen=True, kw_only=True)
class AccumulationConfig:
    """Split each batch into `steps` micro-batches; the optimizer steps once per batch.

    The loss of each micro-batch is weighted by its share of the samples, so the gradient equals
    that of the whole batch (for a mean-reduced loss). Gradients are synchronised across ranks
    on the last micro-batch only (DDP `no_sync`, FSDP2 `set_requires_gradient_sync`).
    """

    steps: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise BadInputError(
                f"Gradient accumulation steps must be a positive integer, got {self.steps!r}."
            )


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """The optimizer, by memfit name (workload.OPTIMIZERS), with its learning rate.

    "adamw-8bit" is bitsandbytes' AdamW8bit (`pip install memfit[bnb]`). With `offload`, the
    state and the update live on the CPU (memfit.offload.CpuOffloadOptimizer).
    """

    name: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    offload: bool = False

    def __post_init__(self) -> None:
        _choice("optimizer", self.name, OPTIMIZERS)
        if self.name == "none":
            raise BadInputError(
                "OptimizerConfig(name='none') builds nothing; leave the config out instead."
            )
        if not self.lr > 0:
            raise BadInputError(f"Learning rate must be > 0, got {self.lr!r}.")


@dataclass(frozen=True, kw_only=True)
class FreezeConfig:
    """Freeze the parameters under these module-name prefixes (no gradient, no state)."""

    prefixes: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class EmbeddingOnCpuConfig:
    """Keep the input embedding table on the CPU: the lookup runs there, its output is moved
    to the model's device, and its gradient and optimizer state stay on the CPU.

    Attributes:
        module: path of the embedding; None takes `model.get_input_embeddings()`.
    """

    module: str | None = None


@dataclass(frozen=True, kw_only=True)
class TieEmbeddingsConfig:
    """One matrix for the input embedding and the output projection (and, for encoder-decoder
    models, one embedding shared by encoder and decoder)."""


@dataclass(frozen=True, kw_only=True)
class FSDPConfig:
    """Shard parameters, gradients and optimizer state with FSDP2 (`fully_shard`) per block,
    then the root, over the initialised default process group.

    Attributes:
        reshard_after_forward: free the gathered parameters of a block after its forward
            (ZeRO-3); False keeps them until backward (ZeRO-2-like, more memory, less traffic).
    """

    reshard_after_forward: bool = True


TechniqueConfig = (
    CheckpointConfig
    | PrecisionConfig
    | AccumulationConfig
    | OptimizerConfig
    | FreezeConfig
    | EmbeddingOnCpuConfig
    | TieEmbeddingsConfig
    | FSDPConfig
    | LoraConfig
)


def configs_from_workload(w: Workload, *, lr: float = 1e-3) -> list[TechniqueConfig]:
    """The technique configs that turn a model into the step `w` describes."""
    if w.offload_optimizer and (not w.training or w.optimizer == "none"):
        raise BadInputError("offload_optimizer needs a training workload with an optimizer.")
    out: list[TechniqueConfig] = []
    if w.freeze:
        out.append(FreezeConfig(prefixes=w.freeze))
    if w.tie_embeddings:
        out.append(TieEmbeddingsConfig())
    if w.lora is not None:
        out.append(w.lora)
    if w.precision != "fp32":
        out.append(PrecisionConfig(precision=w.precision))
    if w.embedding_on_cpu:
        out.append(EmbeddingOnCpuConfig())
    if w.checkpointing != "off":
        out.append(CheckpointConfig(first=w.checkpoint_first))
    if w.gpus > 1:
        out.append(FSDPConfig())
    if w.grad_accum > 1:
        out.append(AccumulationConfig(steps=w.grad_accum))
    if w.training and w.optimizer != "none":
        out.append(OptimizerConfig(name=w.optimizer, lr=lr, offload=w.offload_optimizer))
    return out
