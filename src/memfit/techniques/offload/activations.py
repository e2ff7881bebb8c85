"""Activation offloading: the tensors autograd saves for backward go to (pinned) CPU memory in
forward and come back to the device when backward needs them.

Two variants, one mechanism (`torch.autograd.graph.saved_tensors_hooks`):

- "save_on_cpu" (the default, what `Workload(offload_activations=True)` means): the semantics of
  `torch.autograd.graph.save_on_cpu(pin_memory=True)` (torch/autograd/graph.py). Every saved
  tensor, parameters and their views included, is copied into a new CPU tensor
  (`torch.empty(size, pin_memory=True)` + `copy_(non_blocking=True)`) at pack time; at unpack
  time `packed.to(device, non_blocking=True)` allocates a fresh device tensor, which backward
  frees when the node that needed it is done. A tensor saved by two nodes is copied twice.
- "torchtune": the filters of torchtune's `OffloadActivations` (torchtune/training/
  _activation_offloading.py, `pack_tensor`, and `get_act_offloading_ctx_manager`): parameters
  (a saved tensor whose storage is a parameter's, as its newer version checks) and tensors under
  1024 bytes (`min_offload_size`) stay on the device, and so does everything saved inside the
  output head (its `NoOpManager` around `lm_head`). Its copies run on the current stream, as
  `use_streams=False`; the stream-overlapped default (`use_streams=True`, which keeps up to
  `max_fwd_stash_size=5` offloaded activations alive on the device until their copy is done,
  and an unpacked tensor until the next node runs) is not modelled.

`apply_` puts the hooks on the model's forward (as autocast is put there), so any trainer that
calls the model gets them; a loss computed outside the model's forward is not offloaded.

The estimate traces the same hooks (see `emulated_offload`): on fake CPU tensors nothing can
change device, so while the estimator traces, a pack makes a host copy that is marked host
memory (`tracker.mark(..., host=True)`; op `OP_TO_HOST`) and an unpack makes a new device tensor
(op `OP_TO_DEVICE`), as `.to("cuda")` would.

Checkpointed blocks: non-reentrant `torch.utils.checkpoint` pushes its own saved-tensor hooks
inside the block, and only the innermost hooks run, so the tensors saved inside a checkpointed
block are not offloaded (they are not kept at all); the block's inputs, which checkpoint saves
outside its hooks (`_NoopSaveInputs`), are. In backward the recomputation unpacks them: a device
copy per block input. The combination is what torchtune recommends, and it is traced as it runs.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.events import Category, StorageRecord
from memfit.techniques.registry import Build, handler, wrap_forward_once
from memfit.workload import ACTIVATION_OFFLOAD, Workload, check_choice

VARIANTS = ACTIVATION_OFFLOAD

#: torchtune's `OffloadActivations(min_offload_size=1024)`: smaller saved tensors stay on the
#: device ("we don't want to bother with small tensors"); bytes are element_size * nelement.
TORCHTUNE_MIN_OFFLOAD_BYTES = 1024

#: Pseudo-ops of the trace's records: the host copy made at pack time and the device copy made
#: at unpack time (as the cuBLAS workspace has its own pseudo-op, "cublas_workspace").
OP_TO_HOST = "offload_to_host"
OP_TO_DEVICE = "offload_to_device"


@dataclass(frozen=True, kw_only=True)
class ActivationOffloadConfig:
    """Keep the tensors autograd saves for backward in CPU memory between forward and backward.

    Attributes:
        variant: "save_on_cpu" (every saved tensor, as `torch.autograd.graph.save_on_cpu`) or
            "torchtune" (parameters, tensors under 1024 bytes and the output head's tensors
            stay on the device, as torchtune's `OffloadActivations` with use_streams=False).
        pin_memory: copy into pinned (page-locked) host memory, asynchronously, when CUDA is
            available (save_on_cpu's `pin_memory=True`, torchtune's default).
    """

    variant: str = "save_on_cpu"
    pin_memory: bool = True

    def __post_init__(self) -> None:
        check_choice("activation offload variant", self.variant, VARIANTS)
        if not isinstance(self.pin_memory, bool):
            raise BadInputError(f"pin_memory must be True or False, got {self.pin_memory!r}.")

    @property
    def label(self) -> str:
        """How reports name the technique."""
        return f"activation offload ({self.variant})"


#: Trackers of the traces running now (innermost last); while one is set the hooks act as on
#: CUDA whatever the tensors' device, and mark what they make (see `emulated_offload`).
_TRACING: list[Any] = []


@contextlib.contextmanager
def emulated_offload(tracker: Any) -> Iterator[None]:
    """While tracing with `tracker` (memfit.estimator.trace.tracker.Tracker), make the offload hooks
    act as on a CUDA device: a host copy marked host memory at pack time, a device copy at
    unpack time, both named by their pseudo-ops in the tracker's records."""
    _TRACING.append(tracker)
    try:
        yield
    finally:
        _TRACING.remove(tracker)


class OffloadHooks(torch.autograd.graph.saved_tensors_hooks):
    """The pack/unpack hooks of one forward; counts the bytes each way (`d2h_bytes`,
    `h2d_bytes`), which is the PCIe traffic on a GPU."""

    def __init__(self, model: torch.nn.Module, config: ActivationOffloadConfig) -> None:
        self.config = config
        self.d2h_bytes = 0
        self.h2d_bytes = 0
        self._paused = 0  # > 0 inside the output head (torchtune variant)
        self._param_storages: set[int] = set()
        if config.variant == "torchtune":
            self._param_storages = {
                p.untyped_storage()._cdata for p in model.parameters() if p.device.type != "meta"
            }
        super().__init__(self._pack, self._unpack)

    def _keep(self, t: torch.Tensor) -> bool:
        if self.config.variant == "save_on_cpu":
            return False
        return (
            self._paused > 0
            or t.element_size() * t.nelement() < TORCHTUNE_MIN_OFFLOAD_BYTES
            or isinstance(t, torch.nn.Parameter)
            or t.untyped_storage()._cdata in self._param_storages
        )

    def _pack(self, t: torch.Tensor) -> Any:
        if self._keep(t):
            return (None, t)
        nbytes = t.element_size() * t.nelement()
        self.d2h_bytes += nbytes
        if _TRACING:  # a trace: the copy goes to host memory, as on CUDA
            host = torch.empty(t.size(), dtype=t.dtype, layout=t.layout)
            host.copy_(t)
            _mark(_TRACING[-1], host, OP_TO_HOST, on_host=True)
            return (t.device, host)
        # torch.autograd.graph.save_on_cpu(pin_memory=True).pack_to_cpu, as written there.
        pinnable = self.config.pin_memory and torch.cuda.is_available() and not t.is_sparse
        packed = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=pinnable)
        packed.copy_(t, non_blocking=pinnable)
        return (t.device, packed)

    def _unpack(self, packed: Any) -> torch.Tensor:
        device, t = packed
        if device is None:
            return t
        self.h2d_bytes += t.element_size() * t.nelement()
        if _TRACING:  # a trace: `.to("cuda")` allocates a new device tensor
            out = torch.empty_like(t)
            out.copy_(t)
            _mark(_TRACING[-1], out, OP_TO_DEVICE, on_host=False)
            return out
        return t.to(device, non_blocking=self.config.pin_memory and t.is_pinned())

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No offloading inside (torchtune's NoOpManager around the output head)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1


def _mark(tracker: Any, t: torch.Tensor, op: str, *, on_host: bool) -> None:
    tracker.mark(t, Category.ACTIVATIONS, host=on_host)
    sid = tracker.sid_of(t)
    if sid is not None:
        tracker.records[sid].op = op


@contextlib.contextmanager
def offload_activations(
    model: torch.nn.Module, config: ActivationOffloadConfig
) -> Iterator[OffloadHooks]:
    """The offload hooks over a region of forward code (the model's forward when applied).

    Example:
        >>> with offload_activations(model, ActivationOffloadConfig()) as hooks:
        ...     loss = model(**batch).loss
        >>> loss.backward(); hooks.d2h_bytes == hooks.h2d_bytes
    """
    hooks = OffloadHooks(model, config)
    handles = []
    head = _output_head(model) if config.variant == "torchtune" else None
    if head is not None:
        stack = contextlib.ExitStack()
        handles.append(
            head.register_forward_pre_hook(lambda *_: stack.enter_context(hooks.paused()))
        )
        handles.append(head.register_forward_hook(lambda *_: stack.close(), always_call=True))
    try:
        with hooks:
            yield hooks
    finally:
        for h in handles:
            h.remove()


def _output_head(model: torch.nn.Module) -> torch.nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if isinstance(head, torch.nn.Module) else None


def offload_forward(model: torch.nn.Module, config: ActivationOffloadConfig) -> None:
    """Run `model`'s forward under the offload hooks whoever calls it (in place; once).

    A partial over the module, not a closure over its bound forward, so deep copies of the
    model keep working (as precision.autocast_forward does).
    """
    wrap_forward_once(
        model, "_memfit_offload", config,
        lambda current: functools.partial(_offloaded_forward, model, current, config),
    )  # fmt: skip


def _offloaded_forward(
    model: torch.nn.Module,
    inner: Callable[..., Any] | None,
    config: ActivationOffloadConfig,
    *args: Any,
    **kwargs: Any,
) -> Any:
    fwd = inner if inner is not None else functools.partial(type(model).forward, model)
    if not torch.is_grad_enabled():
        return fwd(*args, **kwargs)
    with offload_activations(model, config):
        return fwd(*args, **kwargs)


def offload_for_trace(model: torch.nn.Module, w: Workload) -> None:
    """What `apply_` will do to the model, done to the traced model (the workload's variant)."""
    if w.offload_activations:
        offload_forward(model, ActivationOffloadConfig(variant=str(w.offload_activations)))


def offload_traffic(records: dict[int, StorageRecord]) -> tuple[int, int]:
    """(device-to-host, host-to-device) bytes of the last traced step: the PCIe traffic of the
    offloaded activations (exact bytes, not rounded to allocator blocks)."""
    last = max((r.step for r in records.values()), default=0)
    d2h = sum(r.nbytes for r in records.values() if r.op == OP_TO_HOST and r.step == last)
    h2d = sum(r.nbytes for r in records.values() if r.op == OP_TO_DEVICE and r.step == last)
    return d2h, h2d


@handler
def _offload(config: ActivationOffloadConfig, build: Build) -> None:
    offload_forward(build.model, config)
    build.applied.append(config.label)
    build.left_to_caller.append(
        "activation offload: the hooks run in the model's forward; a loss computed outside "
        "it keeps its saved tensors on the device (torchtune does the same)."
    )


def offload_note(records: dict[int, StorageRecord], scale: float = 1.0) -> str:
    """The estimate's note on the PCIe traffic of a step (`scale`: micro-batches of the step
    per traced micro-batch, as the FLOPs are scaled)."""
    from memfit.units import format_bytes

    d2h, h2d = (round(b * scale) for b in offload_traffic(records))
    return (
        f"activation offload: {format_bytes(d2h)} device-to-host and {format_bytes(h2d)} "
        "host-to-device over PCIe per step (saved tensors copied at pack and unpack time)."
    )
