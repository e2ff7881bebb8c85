"""Run a workload on fake CPU tensors under the tracker: the raw material of every estimate.

The step traced is the clean loop memfit recommends and `apply_` runs:

    for each micro-batch (grad_accum of them):
        batch = next(data)                              # inputs
        with autocast: loss = model(**batch).loss / grad_accum   # forward; outputs dropped
        scaler.scale(loss).backward()                   # backward
        del loss, batch
    optimizer.step()                                    # optimizer
    optimizer.zero_grad(set_to_none=True)               # zero_grad

It runs `workload.steps` times (2 by default: warm-up creates optimizer state, then steady
state). Inference runs the forward under `torch.no_grad()` once per step.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree

from memfit.errors import BadInputError, TraceError
from memfit.estimator.trace.block_replay import by_units
from memfit.estimator.trace.collector import freeze_long_lived
from memfit.estimator.trace.cublas_operands import record_operand_copies
from memfit.estimator.trace.cuda_emulation import CudaEmulation
from memfit.estimator.trace.cudnn_workspace import record_conv_workspaces
from memfit.estimator.trace.errors import trace_error as _trace_error
from memfit.estimator.trace.fake_distributed import fake_world
from memfit.estimator.trace.tracker import OwnerTrackingState, Tracker, parameter_modules
from memfit.events import Category, Event, StorageRecord
from memfit.models.layers import unit_layer_paths
from memfit.models.loaded import is_as_loaded
from memfit.models.scans import scan_budget
from memfit.models.sources import ModelSpec
from memfit.models.structure import embedding_tied_to, find_repeated_blocks, input_embedding_path
from memfit.techniques.offload.activations import emulated_offload
from memfit.techniques.offload.fsdp_offload import (
    emulated_cpu_offload,
    mark_host_shards,
)
from memfit.techniques.optimizer import host_state_keys, mark_state, optimizer_for_trace
from memfit.techniques.optimizer_in_backward import OptimizerInBackward, trace_hooks
from memfit.techniques.optimizer_in_backward import for_trace as in_backward_for_trace
from memfit.techniques.prequantized import prepare_prequantized
from memfit.techniques.quantize.trace import LOGICAL_NUMEL, logical_numel
from memfit.techniques.table import TraceContext, prepare_for_trace
from memfit.techniques.train_setup import call_model
from memfit.workload import Workload

log = logging.getLogger("memfit")

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class Trace:
    """What one traced run produced."""

    records: dict[int, StorageRecord]
    events: list[Event]
    parameter_count: int
    trainable_parameter_count: int
    block_paths: list[str]
    attention_backends: list[str]
    embedding_path: str | None = None
    #: A parameter outside the input embedding that shares its weight (tied), or None.
    embedding_tied_to: str | None = None
    flops: dict[tuple[int, str, int], int] = field(default_factory=dict)
    block_parameter_count: int = 0
    block_trainable_parameter_count: int = 0
    module_types: dict[str, str] = field(default_factory=dict)
    #: Notes of the trace-time preparation for the estimate (e.g. what stayed unquantized).
    notes: list[str] = field(default_factory=list)
    #: Step -> the storage of each trainable parameter's gradient (in the optimizer's order)
    #: when the optimizer phase began (memfit.estimator.compose).
    grad_sids: dict[int, list[int | None]] = field(default_factory=dict)


def materialize_fake(
    model: torch.nn.Module, fake_mode: FakeTensorMode, dtype: torch.dtype | None, copy_it: bool
) -> torch.nn.Module:
    """Swap every parameter and buffer for a fake CPU tensor (optionally in a copy).

    Floating parameters and buffers are cast to `dtype` when it is given (pure low precision),
    unless the model is marked as loaded (memfit.models.loaded): then each keeps its own dtype.
    Tied parameters stay tied (a tensor seen twice maps to the same fake); quantized storages
    keep the element count they stand for (memfit.techniques.quantize.trace.LOGICAL_NUMEL).
    """
    if is_as_loaded(model):
        dtype = None
    memo: dict[int, Any] = {}

    def fake_of(t: torch.Tensor, is_param: bool) -> Any:
        if id(t) in memo:
            return memo[id(t)]
        target = dtype if (dtype is not None and t.is_floating_point()) else t.dtype
        with fake_mode:
            new = torch.empty_strided(tuple(t.shape), t.stride(), dtype=target, device="cpu")
        out: Any = torch.nn.Parameter(new, requires_grad=t.requires_grad) if is_param else new
        if hasattr(t, LOGICAL_NUMEL):  # a quantized layer's storage read from a real model
            setattr(out, LOGICAL_NUMEL, getattr(t, LOGICAL_NUMEL))
        memo[id(t)] = out
        return out

    tensors: list[tuple[torch.nn.Module, str, torch.Tensor, bool]] = []
    for mod in model.modules():
        tensors += [(mod, n, p, True) for n, p in mod._parameters.items() if p is not None]
        tensors += [(mod, n, b, False) for n, b in mod._buffers.items() if b is not None]
    for _, _, t, is_param in tensors:
        fake_of(t, is_param)
    if copy_it:
        deep_memo = {id(t): memo[id(t)] for _, _, t, _ in tensors}
        return copy.deepcopy(model, deep_memo)
    for mod, n, t, is_param in tensors:
        if is_param:
            mod._parameters[n] = memo[id(t)]
        else:
            mod._buffers[n] = memo[id(t)]
    return model


def _materialize_with(fake_mode: FakeTensorMode, model: torch.nn.Module, dtype: torch.dtype,
                      copy_it: bool) -> torch.nn.Module:  # fmt: skip
    return materialize_fake(model, fake_mode, dtype, copy_it)


def make_batch_for(spec: ModelSpec, model: torch.nn.Module, w: Workload, dtype: torch.dtype) -> Any:
    """One micro-batch for `spec`'s model: the user's `make_batch` (memfit.models.sources.
    ModelSpec.user_batch: it gets `w.seq_len` when it takes it, and a size it cannot take is
    an error), else memfit's synthetic inputs for the model's task.

    The synthetic batch is the same for a transformers model from every source: token ids
    (`input_ids`, with `labels` for a head that has a loss), pixels (`pixel_values`, class
    `labels`) or log-mel frames (`input_features`, token `labels`). Without labels (a base
    model), an encoder-decoder gets `decoder_input_ids` of the same length. In inference,
    decoder-only token models get the inputs only (no loss), as serving and generation run.
    """
    b = w.batch_size
    cfg = getattr(model, "config", None)
    if spec.make_batch is not None:
        return spec.user_batch(b, w.seq_len, w.image_size)
    kind = spec.input_kind
    if kind in ("tokens", "seq2seq-tokens"):
        s = w.seq_len or 512
        if spec.max_positions is not None and s > spec.max_positions:
            raise BadInputError(
                f"Sequence length {s} is longer than {spec.name!r} supports "
                f"({spec.max_positions} positions). Use seq_len={spec.max_positions} or less."
            )
        vocab = int(getattr(cfg, "vocab_size", 32000) or 32000)
        ids = torch.randint(0, vocab, (b, s))  # (B, S)
        batch: dict[str, Any] = {"input_ids": ids}
        if not w.training and kind == "tokens":
            return batch  # inference: logits only, no loss (serving, generation's prefill)
        if spec.task in ("causal-lm", "masked-lm", "seq2seq-lm"):
            batch["labels"] = torch.randint(0, vocab, (b, s))
        elif spec.task == "token-classification":
            batch["labels"] = torch.randint(0, _num_labels(cfg), (b, s))
        elif spec.task == "seq-classification":
            batch["labels"] = _class_labels(cfg, b, dtype)
        elif kind == "seq2seq-tokens":  # no labels to shift into the decoder's inputs
            batch["decoder_input_ids"] = torch.randint(0, vocab, (b, s))
        return batch
    if kind == "image":
        size = w.image_size or spec.image_size or 224
        channels = int(getattr(cfg, "num_channels", 3))
        x = torch.empty(b, channels, size, size, dtype=dtype)  # (B, C, H, W)
        labels = torch.randint(0, _num_labels(cfg) if cfg is not None else 1000, (b,))
        if spec.loss == "cross_entropy":
            return (x, labels)
        if not w.training or spec.task != "image-classification":
            return {"pixel_values": x}
        return {"pixel_values": x, "labels": labels}
    if kind == "audio":
        mels = int(getattr(cfg, "num_mel_bins", 80))
        frames = 2 * int(getattr(cfg, "max_source_positions", 1500))
        s = w.seq_len or 448
        vocab = int(getattr(cfg, "vocab_size", 51865))
        features = torch.empty(b, mels, frames, dtype=dtype)  # (B, mels, frames)
        if spec.task == "speech-seq2seq":
            return {"input_features": features, "labels": torch.randint(0, vocab, (b, s))}
        return {"input_features": features, "decoder_input_ids": torch.randint(0, vocab, (b, s))}
    raise BadInputError(
        f"Cannot make inputs for {spec.name!r} (task {spec.task!r}): give an input factory, "
        "'file.py:build:make_batch' with make_batch(batch_size[, seq_len]) returning the "
        "model's inputs (a dict is passed as keyword arguments)."
    )


def _num_labels(cfg: Any) -> int:
    """Classes of a classification head: its config's `num_labels` (catalog heads: 2)."""
    return int(getattr(cfg, "num_labels", 2) or 2)


def _class_labels(cfg: Any, b: int, dtype: torch.dtype) -> torch.Tensor:
    """Sequence-classification labels as transformers' loss reads them (its `problem_type`):
    class indices, one float per sample for regression (one label), or a float per class for
    multi-label classification."""
    n = _num_labels(cfg)
    if getattr(cfg, "problem_type", None) in ("regression", "multi_label_classification") or n == 1:
        return torch.empty(b, n, dtype=dtype)  # (B, labels)
    return torch.randint(0, n, (b,))


def step_loss(spec: ModelSpec, out: Any, batch: Any) -> torch.Tensor:
    """The loss the traced step backpropagates (ModelSpec.loss says which)."""
    if spec.loss == "cross_entropy":
        return torch.nn.functional.cross_entropy(out, batch[1])
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if isinstance(loss, torch.Tensor):
        return loss
    if spec.loss == "hf":
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise TraceError(
            f"{spec.name!r} returned {type(out).__name__} with no loss on the batch {keys}: a "
            "transformers head computes its loss when the batch carries 'labels'. Add labels "
            "to make_batch's batch (or use mode='inference')."
        )
    if isinstance(out, torch.Tensor):
        return out if out.dim() == 0 else out.float().sum()
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not leaves:
        raise TraceError(
            f"The output of {spec.name!r} has no tensor that requires grad, so there is no "
            "backward to trace. Use mode='inference', or return a loss."
        )
    return leaves[0].float().sum()


def run_trace(spec: ModelSpec, w: Workload, capability: tuple[int, int] | None, *,
              num_layers: int | None = None,
              grad_origins: GradOrigins | None = None) -> Trace:  # fmt: skip
    """Build the model, trace `w.steps` steps, and return the event stream.

    With `w.gpus > 1` the model is sharded with FSDP2 over a fake process group (memfit.
    fake_distributed) and the stream is that of rank 0. With `grad_origins`: no forward and
    backward, the gradients made directly (`_stand_in_gradients`), for memfit.estimator.compose.
    """
    freeze_long_lived()
    step: Any = _one_step
    if grad_origins is not None:
        step = functools.partial(_stand_in_gradients, origins=grad_origins)
    if not w.fsdp:  # one GPU, or DDP's replicas; FSDP2's CPU offload shards over one rank too
        return _run_trace(spec, w, capability, num_layers, None, step)

    with fake_world(w.gpus) as mesh:
        return _run_trace(spec, w, capability, num_layers, mesh, step)


def _run_trace(spec: ModelSpec, w: Workload, capability: tuple[int, int] | None,
               num_layers: int | None, mesh: Any, run_step: Any) -> Trace:  # fmt: skip
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    low = DTYPES[w.compute_dtype_name]
    model, blocks, prepared = _traced_model(spec, w, num_layers, fake_mode, low, mesh)
    scans = scan_budget(model, w.seq_len or 512, w.steps * traced_micro_batches(w), spec.name)
    if scans is not None:  # a trace that takes long says so first (memfit.models.scans)
        log.warning(scans.line())
    notes = list(prepared.notes)
    distill = prepared.teacher  # the teacher, or None
    notes += distill.notes if distill is not None else []
    params = list(dict.fromkeys(model.parameters()))
    trainable = [p for p in params if p.requires_grad]
    tracker = Tracker(model, blocks)
    emulation = _emulate_cuda(tracker, w, low, capability)
    make_optimizer = in_backward_for_trace if w.optimizer_in_backward else optimizer_for_trace
    optimizer = make_optimizer(w.optimizer, trainable) if w.training else None
    host_keys = host_state_keys(optimizer) if optimizer is not None else frozenset()
    tracker.optimizer_host_scalars = "step" in host_keys
    module_of = parameter_modules(model)
    owner_of_module = tracker.owner_of_path
    if optimizer is not None:
        owners = {
            id(p): (owner_of_module(module_of.get(id(p), "")), module_of.get(id(p), ""))
            for p in params
        }
        if not isinstance(optimizer, OptimizerInBackward):  # its hooks say the owner
            optimizer.state = OwnerTrackingState(tracker, owners)  # type: ignore[assignment]
    grad_owners = {id(p): owner_of_module(module_of.get(id(p), "")) for p in params}
    offload = w.fsdp_cpu_offload
    with fake_mode, tracker, emulated_offload(tracker), emulated_cpu_offload(tracker, offload):
        _register_model(tracker, model, params, trainable if w.training else [], module_of)
        if offload:  # CPUOffloadPolicy: the shards live on the host
            mark_host_shards(tracker, model)
        if isinstance(optimizer, OptimizerInBackward):  # after the gradient hooks
            trace_hooks(tracker, optimizer, owners, host_keys)
        if distill is not None:
            distill.register(tracker)
        scale = None
        if w.training and w.recipe.scaler:
            # GradScaler keeps its scale on the device (torch/amp/grad_scaler.py _lazy_init_*).
            scale = torch.full((), 65536.0, dtype=torch.float32)
            tracker.mark(scale, Category.OPTIMIZER_STATE)
        try:
            for step in range(w.steps):
                with _unpacked_synthetic_inputs(spec):
                    run_step(spec, model, w, tracker, emulation, optimizer, scale, low, step,
                             grad_owners, distill)  # fmt: skip
                if optimizer is not None:
                    mark_state(tracker, optimizer, host_keys)
        except (BadInputError, TraceError):
            raise
        except Exception as e:  # an op the fake tracer cannot run
            raise _trace_error(e, tracker) from e
        finally:
            tracker.close()
    trace = Trace(
        records=tracker.records,
        events=tracker.events,
        parameter_count=sum(logical_numel(p) for p in params),
        trainable_parameter_count=sum(p.numel() for p in trainable),
        block_paths=blocks,
        attention_backends=tracker.attention_backends,
        flops=tracker.flops,
        embedding_path=input_embedding_path(model),
        embedding_tied_to=embedding_tied_to(model),
        block_parameter_count=_block_params(model, blocks, trainable_only=False),
        block_trainable_parameter_count=_block_params(model, blocks, trainable_only=True),
        module_types={n: type(m).__name__ for n, m in model.named_modules()},
        notes=notes,
        grad_sids=tracker.grad_sids,
    )
    units = spec.layer_units
    if units is not None and num_layers is not None and by_units(trace, units, num_layers):
        middle = blocks[units.head : units.head + units.period]
        trace.block_parameter_count, trace.block_trainable_parameter_count = (
            sum(_layer_params(model, path, trainable_only=t) for path in middle)
            for t in (False, True)
        )
    return trace


def _traced_model(
    spec: ModelSpec,
    w: Workload,
    num_layers: int | None,
    fake_mode: FakeTensorMode,
    low: torch.dtype,
    mesh: Any,
) -> tuple[torch.nn.Module, list[str], TraceContext]:
    """The model as the workload runs it, on fake tensors: built (on meta when memfit owns
    it), LoRA / frozen / tied, cast, checkpointed, sharded; its repeated blocks; and what the
    technique hooks left (notes, a distillation's teacher)."""
    if spec.owns_model:
        with torch.device("meta"):
            model = spec.build(num_layers, w.attention)
    else:
        model = spec.build(num_layers, w.attention)
    fake = functools.partial(_materialize_with, fake_mode)
    ctx = TraceContext(spec=spec, fake_mode=fake_mode, mesh=mesh, materialize=fake)
    # The technique table's hooks, stage by stage, in its one order: tie / freeze / LoRA on
    # meta (or the user's module); quantized linears after the cast, as a QLoRA user's model
    # is; then forward wrappers and sharding, once the repeated blocks are known.
    model = prepare_for_trace(model, w, ctx, "model")
    model = materialize_fake(
        model, fake_mode, low if w.pure_low_precision else torch.float32, not spec.owns_model
    )
    model = prepare_for_trace(model, w, ctx, "storage")
    # A checkpoint's own quantization_config (bound to the GPU by estimation.trace_spec): the
    # model's storage as downloaded, not a technique the workload picks.
    ctx.notes += prepare_prequantized(model, spec, w, fake_mode)
    ctx.blocks = find_repeated_blocks(model)
    layers = unit_layer_paths(model, spec.layer_units, num_layers)  # files events by layer
    model = prepare_for_trace(model, w, ctx, "wrap")
    model.train(w.training)
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "use_cache"):
        config.use_cache = False
    return model, ctx.blocks if layers is None else layers, ctx


def _op_transients(tracker: Tracker, name: str, args: Any, out: Any) -> None:
    """What CUDA kernels allocate and free inside one op: cuDNN workspaces, cuBLAS copies."""
    record_conv_workspaces(tracker, name, args, out)
    record_operand_copies(tracker, name, args, out)


def _emulate_cuda(
    tracker: Tracker, w: Workload, low: torch.dtype, capability: tuple[int, int] | None
) -> CudaEmulation:
    """The CUDA emulation, switched on in each forward region (and checkpoint recompute)."""
    tracker.op_workspaces = _op_transients  # through the caching allocator, inside one op
    emulation = CudaEmulation(
        dtype=low if w.autocast else None,
        capability=capability,
        enabled=tracker.in_forward_region,
        on_attention=tracker.attention_backends.append,
    )

    def region_start() -> None:
        emulation.__enter__()

    def region_end() -> None:
        emulation.clear_cache()
        emulation.__exit__(None, None, None)

    tracker.on_region_start = region_start  # type: ignore[method-assign]
    tracker.on_region_end = region_end  # type: ignore[method-assign]
    return emulation


def _register_model(
    tracker: Tracker,
    model: torch.nn.Module,
    params: list[torch.nn.Parameter],
    trainable: list[torch.nn.Parameter],
    module_of: dict[int, str],
) -> None:
    """Parameters and buffers, by module and block; gradients of `trainable` as they land."""
    owner_of_module = tracker.owner_of_path
    for p in params:
        mod = module_of.get(id(p), "")
        tracker.register(p, Category.PARAMETERS, mod, owner_of_module(mod))
    for n, b in model.named_buffers():
        mod = n.rsplit(".", 1)[0] if "." in n else ""
        tracker.register(b, Category.BUFFERS, mod, owner_of_module(mod))
    for p in trainable:
        p_owner = owner_of_module(module_of.get(id(p), ""))

        def on_grad(q: torch.Tensor, _owner: int = p_owner) -> None:
            if q.grad is not None:
                tracker.mark(q.grad, Category.GRADIENTS, owner=_owner)

        p.register_post_accumulate_grad_hook(on_grad)


def _block_params(model: torch.nn.Module, blocks: list[str], *, trainable_only: bool) -> int:
    if len(blocks) < 2:
        return 0
    return _layer_params(model, blocks[1], trainable_only=trainable_only)


def _layer_params(model: torch.nn.Module, path: str, *, trainable_only: bool) -> int:
    block = model.get_submodule(path)
    return sum(
        logical_numel(p) for p in block.parameters() if p.requires_grad or not trainable_only
    )


#: Where _traced_model leaves the notes of the model's preparation for the Trace, and the
#: distillation teacher (memfit.techniques.distillation.trace) for the step.


@contextlib.contextmanager
def _unpacked_synthetic_inputs(spec: ModelSpec) -> Iterator[None]:
    """Tell transformers that memfit's synthetic batches hold no packed sequences.

    With no attention mask, transformers looks at position_ids to detect packed sequences
    (masking_utils.find_packed_sequence_indices); on fake tensors it cannot read the values, so
    it assumes packing and builds an explicit (B, 1, S, S) mask, which rules out the flash
    kernel. On a GPU, the same synthetic batch (one sequence per row, no padding) gives no mask
    and `is_causal=True`. Only memfit's own batches and those a spec declares unpacked
    (`ModelSpec.unpacked_batches`) are covered; a user's input factory is traced as it is.
    """
    mu = sys.modules.get("transformers.masking_utils")
    user = spec.make_batch is not None and not spec.unpacked_batches
    if user or mu is None or not hasattr(mu, "find_packed_sequence_indices"):
        yield
        return
    original = getattr(mu, "find_packed_sequence_indices")  # noqa: B009
    setattr(mu, "find_packed_sequence_indices", lambda position_ids: None)  # noqa: B010
    try:
        yield
    finally:
        setattr(mu, "find_packed_sequence_indices", original)  # noqa: B010


#: Micro-batches traced per step. With gradient accumulation, micro-steps 3..k repeat micro-step
#: 2 exactly (the same gradients are alive and accumulated in place), so tracing two gives the
#: memory of any k >= 2; FLOPs are scaled to k (memfit.estimator.estimation.steady_flops).
MAX_TRACED_MICRO_BATCHES = 2


def traced_micro_batches(w: Workload) -> int:
    """Micro-batches traced per step for `w` (see MAX_TRACED_MICRO_BATCHES)."""
    return min(w.grad_accum, MAX_TRACED_MICRO_BATCHES) if w.training else 1


def _register_inputs(tracker: Tracker, batch: Any) -> None:
    """Count input tensors a user's make_batch made before the trace (e.g. at import time).

    Tensors made during the trace are already tracked; a function scope keeps no reference
    alive after it returns.
    """
    for t in pytree.tree_leaves(batch):
        if isinstance(t, torch.Tensor):
            tracker.register(t, Category.INPUTS)


def _one_step(spec, model, w, tracker, emulation, optimizer, scale, low, step,
              grad_owners, distill) -> None:  # fmt: skip
    for _micro in range(traced_micro_batches(w)):
        tracker.set_phase("inputs", step)
        batch = make_batch_for(spec, model, w, low if w.pure_low_precision else torch.float32)
        batch = distill.add_inputs(batch) if distill is not None else batch
        _register_inputs(tracker, batch)
        tracker.set_phase("forward", step)
        if not w.training:
            with torch.no_grad(), emulation:
                out = call_model(model, batch)
            emulation.clear_cache()
            del out, batch
            continue
        with emulation:
            out = call_model(model, batch)
            loss = distill.loss(out, batch) if distill is not None else step_loss(spec, out, batch)
            del out
        emulation.clear_cache()
        if w.grad_accum > 1:
            loss = loss / w.grad_accum
        tracker.set_phase("backward", step)
        # Not under the emulation mode: Tensor.backward would be intercepted and run with the
        # mode off. Checkpoint recomputation enters the mode itself (Tracker.block_region).
        if scale is not None:
            (loss * scale).backward()
        else:
            loss.backward()
        del loss, batch
    if w.training:
        _optimizer_phase(model, w, tracker, optimizer, scale, step, grad_owners)


#: Step -> (module, block) that filed each trainable parameter's gradient, in the optimizer's
#: order (None: no gradient): what an optimizer-only trace files its gradients under.
GradOrigins = dict[int, list[tuple[str, int] | None]]


def _stand_in_gradients(spec, model, w, tracker, emulation, optimizer, scale, low, step,
                        grad_owners, distill, *, origins: GradOrigins) -> None:  # fmt: skip
    """An optimizer-only step (memfit.estimator.compose): each trainable parameter gets a
    gradient of its own shape and dtype, as AccumulateGrad leaves it, filed under the module
    and block the traced backward filed it under (`origins`: the optimizer's ops on a gradient
    are filed as it is, Tracker._input_owners); then the optimizer phase runs as in
    `_one_step`."""
    tracker.set_phase("backward", step)
    for p, origin in zip(_trainable_of(optimizer), origins[step], strict=True):
        if origin is None:
            continue
        p.grad = torch.empty_like(p)
        tracker.mark(p.grad, Category.GRADIENTS, owner=grad_owners.get(id(p), -1))
        rec = tracker.records[tracker.sid_of(p.grad)]
        rec.module, rec.owner = origin
        if spec.layer_units is not None:  # origins name units; this trace files by layer
            rec.owner = tracker.owner_of_path(rec.module)
    _optimizer_phase(model, w, tracker, optimizer, scale, step, grad_owners)


def _trainable_of(optimizer: Any) -> list[torch.nn.Parameter]:
    return [p for g in optimizer.param_groups for p in g["params"]]


def _optimizer_phase(model, w, tracker, optimizer, scale, step, grad_owners) -> None:  # fmt: skip
    tracker.set_phase("optimizer", step)
    if optimizer is not None and not isinstance(optimizer, OptimizerInBackward):
        # Which storage is each parameter's gradient, for composing optimizers (compose.py).
        tracker.grad_sids[step] = [
            tracker.sid_of(p.grad) if p.grad is not None else None for p in _trainable_of(optimizer)
        ]
    if w.fsdp:
        # FSDP2 sets the reduce-scattered gradient shards itself, not through AccumulateGrad.
        for p in model.parameters():
            if p.grad is not None:
                tracker.mark(p.grad, Category.GRADIENTS, owner=grad_owners.get(id(p), -1),
                             host=w.fsdp_cpu_offload)  # fmt: skip
    if optimizer is not None:
        if scale is not None:
            grads = [
                p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None
            ]
            torch._foreach_mul_(grads, 1.0 / 65536.0)
            del grads
        optimizer.step()
        tracker.set_phase("zero_grad", step)
        optimizer.zero_grad(set_to_none=True)
    else:
        tracker.set_phase("zero_grad", step)
        for p in model.parameters():
            p.grad = None
