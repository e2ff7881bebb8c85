"""A real training run read into what memfit estimates: a `ModelSpec` and the pieces of a
`Workload` that the model, its first batch and its optimizer decide.

Nothing of the user's run is changed or allocated:
- the model is estimated through a *meta copy* (`meta_copy`): the module tree deep-copied with
  every parameter and buffer replaced by a meta tensor of the same shape, dtype and
  `requires_grad`, so LoRA adapters, frozen parameters and hooks are kept as the trainer
  prepared them, and the copy may be changed (its activation checkpointing) freely;
- the first batch gives shapes only (`BatchTemplate`): the estimate makes tensors of the same
  shapes and dtypes on fake tensors;
- the optimizer is read from the instance the trainer built (`optimizer_layout`), so an
  optimizer the user passed in is read as well as one made from `optim`.

The copy is traced *as loaded* (memfit.models.loaded): each parameter and buffer keeps its own
dtype, so peft's fp32 adapters on a bf16 base, or layers upcast to fp32, are estimated as the
run holds them; the Workload's precision (`precision_of`) says only whether the step runs under
autocast and in which 16-bit dtype.

A model quantized by bitsandbytes (QLoRA: `Linear4bit` / `Linear8bitLt` layers) is copied with
memfit's stand-in of each quantized layer, read from the layer's own settings
(memfit.techniques.quantize.read).

Known limits (errors, never guesses): parameters sharded (DTensor, FSDP), quantized parameters
outside bitsandbytes' linear layers, and an optimizer memfit has no layout for are refused
(docs/integrations.md lists them).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from memfit.errors import BadInputError
from memfit.models.loaded import dtype_counts, mark_as_loaded
from memfit.models.sources import ModelSpec, resolve_model
from memfit.models.structure import find_repeated_blocks
from memfit.optimizers import name_of_instance
from memfit.techniques.quantize.read import bnb_kind, quantized_stand_ins

__all__ = [
    "BatchTemplate",
    "checkpointing_of",
    "ddp_setting_note",
    "meta_copy",
    "model_notes",
    "optimizer_layout",
    "precision_of",
    "spec_of_run",
]

#: Parameter classes of quantized libraries that a meta copy cannot stand for.
_QUANTIZED_PARAMETERS = ("Params4bit", "Int8Params")


def _refuse_unreadable(model: torch.nn.Module) -> None:
    in_layers = {id(p) for m in model.modules() if bnb_kind(m) for p in m.parameters()}
    for name, p in model.named_parameters():
        kind = type(p).__name__
        if kind in _QUANTIZED_PARAMETERS and id(p) not in in_layers:
            raise BadInputError(
                f"Parameter {name!r} is a bitsandbytes {kind} outside bitsandbytes' Linear4bit "
                "/ Linear8bitLt layers, which memfit reads. Estimate the unquantized model with "
                "Workload(quantize='nf4', lora=LoraConfig(...)) instead (memfit estimate MODEL "
                "--quantize nf4 --lora-rank 16)."
            )
        if type(p.data).__name__ == "DTensor" or type(p).__name__ == "DTensor":
            raise BadInputError(
                f"Parameter {name!r} is sharded (a DTensor): memfit reads the model before it is "
                "sharded. Estimate the unsharded model with Workload(gpus=N) (memfit estimate "
                "MODEL --gpus N), or use --accelerate-config."
            )


def meta_copy(model: torch.nn.Module, *, detach: tuple[Any, ...] = ()) -> torch.nn.Module:
    """The module tree of `model` with every parameter and buffer on the meta device (same
    shape, dtype, strides and requires_grad; tied tensors stay tied), and each bitsandbytes
    quantized layer replaced by memfit's stand-in of its layout. Objects in `detach` (a
    Lightning trainer the module points to) become None in the copy instead of being copied.

    Example:
        >>> copy = meta_copy(model)   # no memory, nothing of `model` changed
    """
    _refuse_unreadable(model)
    memo: dict[int, Any] = {id(o): None for o in detach}
    for mod in model.modules():
        for p in mod._parameters.values():
            if p is not None and id(p) not in memo:
                meta = torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device="meta")
                memo[id(p)] = torch.nn.Parameter(meta, requires_grad=p.requires_grad)
        for b in mod._buffers.values():
            if b is not None and id(b) not in memo:
                memo[id(b)] = torch.empty_strided(b.shape, b.stride(), dtype=b.dtype,
                                                  device="meta")  # fmt: skip
    memo.update(quantized_stand_ins(model, memo)[0])
    return copy.deepcopy(model, memo)


@dataclass(frozen=True)
class BatchTemplate:
    """The shapes and dtypes of a real batch, to make batches like it.

    Attributes:
        batch_size: the leading dimension shared by every tensor of the batch.
        seq_len: the sequence length (dimension 1 of `input_ids`, or of the first 2-D tensor
            of a batch without `input_ids`), or None for a batch without sequences.
    """

    structure: Any
    batch_size: int
    seq_len: int | None

    @classmethod
    def of(cls, batch: Any) -> BatchTemplate:
        """The template of `batch` (a dict, a mapping such as transformers' BatchEncoding, a
        tuple or list, or a tensor)."""
        if isinstance(batch, Mapping) and not isinstance(batch, dict):
            batch = dict(batch)
        leaves = [t for t in pytree.tree_leaves(batch) if isinstance(t, torch.Tensor)]
        sized = [t for t in leaves if t.dim() >= 1]
        if not sized:
            raise BadInputError(
                f"The first batch ({type(batch).__name__}) holds no tensor with a batch "
                "dimension, so memfit cannot tell its batch size."
            )
        sizes = {int(t.shape[0]) for t in sized}
        if len(sizes) != 1:
            raise BadInputError(
                f"The tensors of the first batch disagree on the batch dimension (dimension 0: "
                f"{sorted(sizes)}); memfit reads dimension 0 as the batch."
            )
        ids = batch.get("input_ids") if isinstance(batch, dict) else None
        if isinstance(ids, torch.Tensor) and ids.dim() >= 2:
            seq: int | None = int(ids.shape[1])
        else:
            seq = next((int(t.shape[1]) for t in sized if t.dim() == 2), None)
        structure = pytree.tree_map(_spec_of, batch)
        return cls(structure=structure, batch_size=sizes.pop(), seq_len=seq)

    def has_key(self, key: str) -> bool:
        """Whether a mapping of the batch (at any depth) has `key`."""

        def look(node: Any) -> bool:
            if isinstance(node, dict):
                return key in node or any(look(v) for v in node.values())
            if isinstance(node, (list, tuple)):
                return any(look(v) for v in node)
            return False

        return look(self.structure)

    def make(self, batch_size: int, seq_len: int | None = None) -> Any:
        """A batch of the template's structure with `batch_size` rows; with `seq_len`, every
        dimension after the first that had the template's sequence length gets `seq_len`.
        Tensors are zeros (on fake tensors, as the estimate calls it, they hold no memory)."""
        seq = self.seq_len if seq_len is None else seq_len

        def build(leaf: Any) -> Any:
            if not isinstance(leaf, _TensorSpec):
                return leaf
            if not leaf.shape:
                return torch.zeros((), dtype=leaf.dtype)
            rest = [seq if d == self.seq_len and seq is not None else d for d in leaf.shape[1:]]
            return torch.zeros([batch_size, *rest], dtype=leaf.dtype)

        return pytree.tree_map(build, self.structure)


@dataclass(frozen=True)
class _TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype


def _spec_of(leaf: Any) -> Any:
    if isinstance(leaf, torch.Tensor):
        return _TensorSpec(tuple(int(d) for d in leaf.shape), leaf.dtype)
    return leaf


def spec_of_run(
    model: torch.nn.Module,
    template: BatchTemplate,
    *,
    name: str | None = None,
    build: Callable[[], torch.nn.Module] | None = None,
    loss: str | None = None,
    wrap_batch: Callable[[Any], Any] | None = None,
) -> ModelSpec:
    """The ModelSpec of a real run's model: built as a fresh meta copy for each trace (by
    `build`, else `meta_copy(model)`), marked to be traced as loaded (each tensor keeps its
    dtype: memfit.models.loaded), fed batches like the first one.

    The traced model's task, inputs and loss are read from `model` as memfit reads any
    nn.Module (`resolve_model`); `loss` overrides it (a Lightning step returns its loss), and
    `wrap_batch` wraps each batch made (so that the traced module gets it as one argument).
    """
    spec = resolve_model(model)
    make = build if build is not None else (lambda: meta_copy(model))

    def build_copy(_n: int | None, _attention: str) -> torch.nn.Module:
        return mark_as_loaded(make())

    def make_batch(batch_size: int, seq_len: int | None = None) -> Any:
        batch = template.make(batch_size, seq_len)
        return wrap_batch(batch) if wrap_batch is not None else batch

    changes: dict[str, Any] = {
        "build": build_copy,
        "owns_model": True,  # a copy memfit made: its checkpointing may be changed
        "make_batch": make_batch,
        "name": name or spec.name,
        # No position_ids in the batch: transformers makes an arange, never packed sequences.
        "unpacked_batches": not template.has_key("position_ids"),
    }
    if loss is not None:
        changes["loss"] = loss
        changes["notes"] = []
    return dataclasses.replace(spec, **changes)


# ----------------------------------------------------------------------------- checkpointing


def _hf_checkpointed(model: torch.nn.Module) -> list[str]:
    """Paths of the modules transformers checkpoints (`gradient_checkpointing` set True by
    `activation_checkpointing_enable`), outermost first."""
    return [
        n for n, m in model.named_modules() if getattr(m, "gradient_checkpointing", False) is True
    ]


def checkpointing_of(model: torch.nn.Module) -> tuple[str, int | None, list[str]]:
    """How transformers' activation checkpointing of `model` reads as memfit's:
    ("off", None, notes), ("blocks", None, notes) for every repeated block, ("blocks", k,
    notes) for the first k. Checkpointing memfit cannot express (every n-th layer, offloaded
    saved tensors, modules that are not the repeated blocks) raises BadInputError.

    `strip_hf_checkpointing` then turns transformers' own off in the meta copy, since the
    trace wraps the same blocks with memfit's non-reentrant checkpoint.
    """
    marked = _hf_checkpointed(model)
    if not marked:
        return "off", None, []
    blocks = find_repeated_blocks(model)
    layers = [n for n in marked if n in blocks]
    container = [n for n in marked if n not in blocks]
    # The model class (LongT5Stack-like) may carry the flag itself; only layers checkpoint.
    container = [n for n in container if not any(b.startswith(n + ".") or n == "" for b in blocks)]
    if container:
        raise BadInputError(
            f"transformers checkpoints {container[:3]!r}, which are not the model's repeated "
            f"blocks ({blocks[:2]!r}, ...): memfit does not model that checkpointing."
        )
    notes: list[str] = []
    func = None
    for n in layers:
        func = getattr(model.get_submodule(n), "_gradient_checkpointing_func", func)
    if isinstance(func, functools.partial):
        from torch.utils.checkpoint import checkpoint

        if func.func is not checkpoint:
            raise BadInputError(
                "transformers' activation checkpointing here offloads the saved block inputs "
                "(activation_checkpointing_kwargs offload=True), which memfit does not model. "
                "Drop the offload, or estimate Workload(checkpointing='blocks', "
                "offload_activations='save_on_cpu') for a bound."
            )
        if func.keywords.get("use_reentrant") is True:
            notes.append(
                "transformers checkpoints with use_reentrant=True; memfit traces the "
                "non-reentrant checkpoint (the same saved block inputs)."
            )
    if layers == blocks:
        return "blocks", None, notes
    if layers == blocks[: len(layers)]:
        return "blocks", len(layers), notes
    raise BadInputError(
        f"transformers checkpoints {len(layers)} of {len(blocks)} blocks, not the first ones "
        f"(e.g. every_n_layers > 1: {layers[:3]!r}); memfit models checkpointing every block "
        "or the first k. Use every_n_layers=1."
    )


def strip_hf_checkpointing(model: torch.nn.Module) -> torch.nn.Module:
    """Turn transformers' activation checkpointing off in a copy (memfit wraps the blocks)."""
    for n in _hf_checkpointed(model):
        setattr(model.get_submodule(n), "gradient_checkpointing", False)  # noqa: B010
    return model


# ----------------------------------------------------------------------------- precision


_SIXTEEN_BIT = {torch.bfloat16: "bf16", torch.float16: "fp16"}
_AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def precision_of(model: torch.nn.Module, autocast: str | None, *, who: str) -> str:
    """memfit's precision recipe for `model`, traced as loaded (its own dtypes), trained under
    `autocast` ("float16", "bfloat16" or None). `who` names the setting for errors.

    With autocast: "bf16-mixed" / "fp16-mixed", whatever the parameters' dtypes (a bf16 base
    with fp32 LoRA adapters under bf16 autocast is "bf16-mixed"). Without: "bf16-true" /
    "fp16-true" when parameters are in that 16-bit dtype (their matmuls run in it; fp32
    parameters beside them stay fp32), else "fp32".

    Refused: trainable 16-bit parameters of another dtype than the autocast's, fp16 trainable
    parameters under fp16 autocast (the GradScaler refuses to unscale fp16 gradients), and
    parameters in both fp16 and bf16 without autocast.
    """
    params = [p for p in model.parameters() if p.is_floating_point()]
    trainable = {p.dtype for p in params if p.requires_grad} & set(_SIXTEEN_BIT)
    if autocast is not None:
        want = _AUTOCAST_DTYPES[autocast]
        if trainable - {want}:
            raise BadInputError(
                f"Trainable parameters are {sorted(str(d) for d in trainable)} and {who} runs "
                f"autocast to {autocast}: memfit does not model that mix. Use one 16-bit type."
            )
        if want == torch.float16 and trainable:
            raise BadInputError(
                f"Trainable parameters are float16 and {who} runs fp16 autocast with a "
                'GradScaler, which refuses to unscale fp16 gradients ("Attempting to unscale '
                'FP16 gradients"). Keep trainable parameters in float32, or use bf16.'
            )
        return f"{_SIXTEEN_BIT[want]}-mixed"
    low = {p.dtype for p in params} & set(_SIXTEEN_BIT)
    if len(low) > 1:
        raise BadInputError(
            "The parameters are in both float16 and bfloat16 and no autocast runs: memfit "
            "models one 16-bit dtype per step. Cast them to one."
        )
    return f"{_SIXTEEN_BIT[low.pop()]}-true" if low else "fp32"


def model_notes(model: torch.nn.Module) -> list[str]:
    """The estimate's notes on how the model is read: its bitsandbytes layers (what cannot be
    read is refused here, before any trace), and, when the parameters are in more than one
    dtype, how many of each, trainable and frozen, as the trace keeps them."""
    _refuse_unreadable(model)
    return quantized_stand_ins(model, {})[1] + _dtypes_note(model)


def ddp_setting_note(setting: str) -> str:
    """The note for a DDP setting that moves the buckets' boundaries, not their bytes."""
    return (f"{setting}: memfit places DDP's buckets as the defaults cut them (the same "
            "bytes; other boundaries).")  # fmt: skip


def _dtypes_note(model: torch.nn.Module) -> list[str]:
    counts = dtype_counts(model)
    if len(counts) < 2:
        return []

    def listed(trainable: bool) -> str:
        got = dtype_counts(model, trainable=trainable)
        return ", ".join(f"{n:,} {d}" for d, n in sorted(got.items())) or "none"

    return [
        f"parameters as loaded, each in its own dtype: trainable {listed(True)}; frozen "
        f"{listed(False)}."
    ]


# ----------------------------------------------------------------------------- optimizer


def optimizer_layout(optimizer: Any) -> str:
    """memfit's optimizer name for a real optimizer instance (its OptimizerSpec row matches
    it); an optimizer memfit has no layout for raises BadInputError naming it.

    An accelerate `AcceleratedOptimizer` or Lightning wrapper is looked through.
    """
    return name_of_instance(optimizer)
