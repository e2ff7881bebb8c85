"""`memfit.measure`: real memory of real steps, as the same `MemoryProfile` as an estimate.

memfit's tracker (memfit.estimator.trace.tracker.Tracker) runs over the real tensors of the user's
loop, on the CPU or on CUDA: every storage allocated and freed, with its category, module, phase
and op. Phases are found without the user's help:
- "forward" starts when the model's forward is called (a new step after an optimizer step);
- "backward" when autograd runs a node (`torch._C._current_autograd_node()`);
- "optimizer" inside `optimizer.step()` (global optimizer step hooks), "zero_grad" after it.
Tensors passed to the model's forward that were made before it are "inputs"; gradients are
found by post-accumulate-grad hooks, optimizer state after each optimizer step.

On CUDA the allocator's own statistics are read too: `max_memory_allocated` (which the
tracker's rounded total should equal), `max_memory_reserved`, and the device total from
`torch.cuda.mem_get_info` (what nvidia-smi shows, other processes included).

Example:
    >>> with memfit.measure(model, optimizer) as m:
    ...     for batch in batches:
    ...         train_step(batch)
    >>> m.profile.peak_allocated_bytes, m.profile.breakdown
"""

from __future__ import annotations

import contextlib
import functools
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

from memfit.errors import BadInputError, Failsafe
from memfit.estimator import Tracker, memory_tensor, parameter_modules
from memfit.events import Category
from memfit.measurement.phases import PhaseHooks, guarded
from memfit.models.structure import find_repeated_blocks
from memfit.profile import MemoryProfile
from memfit.simulation.oom_live import explain_live

#: Allocator events kept by `record_history` (PyTorch's default is 100,000 too).
HISTORY_ENTRIES = 100_000


class _LiveTracker(Tracker):
    """A Tracker whose phase follows the running code instead of a driver.

    It remembers each storage's device type: when a GPU is measured, storages on other devices
    (the data loader's CPU tensors, an offloaded optimizer's state) are host memory.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.device_types: dict[int, str] = {}

    def _track(self, t: torch.Tensor, **kwargs: Any) -> None:
        t = memory_tensor(t)  # a DTensor's local shard
        if is_traceable_wrapper_subclass(t):
            # A wrapper (torchao's Int8Tensor, Float8Tensor) has no memory of its own: its
            # storage reports the dense size. Its inner tensors hold the bytes.
            names, _ = t.__tensor_flatten__()
            for inner in (getattr(t, name) for name in names):
                if isinstance(inner, torch.Tensor):
                    self._track(inner, **kwargs)
            return
        super()._track(t, **kwargs)
        sid = self.sid_of(t)
        if sid is not None and sid not in self.device_types:
            self.device_types[sid] = t.device.type

    def keep_only(self, device_type: str) -> None:
        """Storages on other devices become host memory (recorded, not counted)."""
        for sid, dt in self.device_types.items():
            if dt != device_type:
                self.records[sid].host = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self._closed:
            try:
                if self.phase != "backward" and torch._C._current_autograd_node() is not None:
                    self.set_phase("backward")
            except Exception as e:
                self.step_aside("finding the backward phase", e)
        if not self._closed and getattr(func, "namespace", "aten") not in _BUILTIN_NAMESPACES:
            func = _SeenInside(func, self)
        return super().__torch_dispatch__(func, types, args, kwargs)


#: Namespaces of PyTorch's own ops; any other op is a library's custom op (bitsandbytes').
_BUILTIN_NAMESPACES = frozenset({"aten", "prim", "prims", "_c10d_functional", "c10d"})


class _SeenInside:
    """A custom op run below the tracker with the tracker still active, so that the ops of its
    Python kernel (bitsandbytes' `gemm_4bit` on CPU: the dequantized weight) are recorded as
    the CUDA allocator would see them; a C++ kernel's own buffers stay unseen."""

    def __init__(self, op: Any, tracker: _LiveTracker) -> None:
        self.op, self.tracker = op, tracker
        self.__name__ = op.__name__
        self.overloadpacket = op.overloadpacket

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        keys = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.Python)
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if not tensors:  # nothing to dispatch on (a profiler's record_function op)
            return self.op(*args, **kwargs)
        below = functools.reduce(operator.or_, [torch._C._dispatch_keys(t) & keys for t in tensors])
        TorchDispatchMode.__enter__(self.tracker)  # the mode only, not the Tracker's hooks
        try:
            return self.op.redispatch(below, *args, **kwargs)
        finally:
            TorchDispatchMode.__exit__(self.tracker, None, None, None)


@dataclass
class Measurement:
    """Filled when the `measure` block exits.

    Attributes:
        profile: the measured MemoryProfile (tracker on real tensors).
        device: "cpu" or "cuda:N".
        cuda_max_allocated / cuda_max_reserved / cuda_device_used: the CUDA allocator's and the
            driver's figures over the block (None on CPU).
        steps: optimizer steps seen.
    """

    device: str = "cpu"
    profile: MemoryProfile | None = None
    cuda_max_allocated: int | None = None
    cuda_max_reserved: int | None = None
    cuda_device_used: int | None = None
    steps: int = 0
    #: When torch.OutOfMemoryError escaped the block: what held the memory, as text.
    oom_report: str | None = None
    #: On CUDA with record_history: `torch.cuda.memory._snapshot()` at the end of the block
    #: (the pickle pytorch.org/memory_viz opens, with the allocator's real segments).
    cuda_snapshot: dict[str, Any] | None = None
    #: When memfit's own bookkeeping failed inside the block: where and why ("recording the
    #: aten op mm.default: RuntimeError: ..."). memfit then stopped observing and the block ran
    #: on as it would without it; `profile` is None (what was recorded is incomplete), the
    #: CUDA figures are still read. Reported once (`warnings.warn`, or the callback's print).
    failed: str | None = None
    _record_history: bool = field(default=False, repr=False)
    _report: Callable[[str], None] | None = field(default=None, repr=False)
    _model: torch.nn.Module | None = field(default=None, repr=False)
    _optimizer: torch.optim.Optimizer | None = field(default=None, repr=False)
    _hooks: list[Any] = field(default_factory=list, repr=False)
    _cm: Any = field(default=None, repr=False)

    def __enter__(self) -> Measurement:
        if self._cm is not None:
            raise RuntimeError("A Measurement measures one block; call memfit.measure() again.")
        self._cm = _measuring(self)
        return self._cm.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self._cm.__exit__(*exc)


def measure(
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    record_history: bool = False,
) -> Measurement:
    """Measure the steps run inside a `with` block; see the module docstring.

    Args:
        model: the model trained (its parameters are counted from the start, its forward
            marks the steps). Without it, the outermost module called is taken as the model.
        optimizer: its existing state is counted from the start; any optimizer's step marks
            the optimizer phase.
        record_history: on CUDA, also record the allocator's history
            (`torch.cuda.memory._record_memory_history`) and keep its snapshot.
    """
    return Measurement(
        device=_device_of(model),
        _model=model,
        _optimizer=optimizer,
        _record_history=record_history,
    )


@contextlib.contextmanager
def _measuring(m: Measurement) -> Iterator[Measurement]:
    # Everything memfit does here runs inside the user's code: its failure stops the
    # measurement (memfit.errors.Failsafe) and the block runs on as without it.
    failsafe = Failsafe("memfit.measure", m._report)
    tracker: _LiveTracker | None = None
    stack = contextlib.ExitStack()
    with failsafe.guard("starting the measurement"):
        tracker = _start(m, failsafe, stack)
    try:
        yield m
    except torch.OutOfMemoryError as e:
        # Explained while the tensors that filled the memory are still recorded. The report
        # travels with the error (printed under its traceback), and stays on `m.oom_report`;
        # the library prints nothing itself.
        if tracker is not None and failsafe.failed is None:
            with failsafe.guard("explaining the out-of-memory error"):
                m.oom_report = explain_live(e, tracker.records, tracker.events)
                if hasattr(e, "add_note"):  # Python >= 3.11
                    e.add_note(m.oom_report)
        raise
    finally:
        with failsafe.guard("ending the measurement"):
            stack.close()
        if tracker is not None:
            with failsafe.guard("collecting the measurement"):
                _collect(m, tracker, profile=failsafe.failed is None)
        m.failed = failsafe.failed


def _start(m: Measurement, failsafe: Failsafe, stack: contextlib.ExitStack) -> _LiveTracker:
    """Start tracking: the tracker's mode and hooks, the phase hooks, what exists now. What
    is started is stopped by `stack`, also when a later part fails."""
    model = m._model
    root = model if model is not None else torch.nn.Module()
    tracker = _LiveTracker(root, find_repeated_blocks(root) if model is not None else [])
    tracker.failsafe = failsafe
    failsafe.on_trip(tracker.close)
    stack.callback(tracker.close)
    _reset_cuda_statistics(m)

    def remove_hooks() -> None:
        for h in m._hooks:
            h.remove()
        m._hooks = []

    stack.callback(remove_hooks)
    phases = PhaseHooks(m, tracker, model, on_new_model=_register_model)
    m._hooks = phases.install()
    stack.enter_context(tracker)
    tracker.set_phase("setup", 0)
    _register_start(m, tracker)
    return tracker


def _reset_cuda_statistics(m: Measurement) -> None:
    # A script's device is known only once it has run; the statistics are read if CUDA works.
    cuda_ready = torch.cuda.is_available() and (
        m.device.startswith("cuda") or (m._model is None and torch.cuda.is_initialized())
    )
    if cuda_ready:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    if m._record_history and torch.cuda.is_available():
        torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES)


def _register_start(m: Measurement, tracker: Tracker) -> None:
    """What exists when the block starts: the model's tensors, the optimizer's state."""
    if m._model is not None:
        m._hooks += _register_model(tracker, m._model)
    if m._optimizer is not None:
        for state in m._optimizer.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    tracker.register(v, Category.OPTIMIZER_STATE)


def _collect(m: Measurement, tracker: _LiveTracker, *, profile: bool) -> None:
    """The profile of what ran (unless `profile` is False: the tracking stopped early), and on
    CUDA the allocator's own statistics."""
    if m._model is None and "cuda" in tracker.device_types.values():
        m.device = f"cuda:{torch.cuda.current_device()}"
    cuda = m.device.startswith("cuda")
    if profile:
        tracker.keep_only("cuda" if cuda else "cpu")
        m.profile = MemoryProfile.from_events(tracker.records, tracker.events)
    if m._record_history and torch.cuda.is_available():
        if cuda:
            m.cuda_snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
    if cuda:
        torch.cuda.synchronize()
        m.cuda_max_allocated = torch.cuda.max_memory_allocated()
        m.cuda_max_reserved = torch.cuda.max_memory_reserved()
        free, total = torch.cuda.mem_get_info()
        m.cuda_device_used = total - free
        if m.profile is not None:
            m.profile.peak_reserved_bytes = m.cuda_max_reserved
            m.profile.device_total_bytes = m.cuda_device_used


def _register_model(tracker: Tracker, model: torch.nn.Module) -> list[Any]:
    """Count the model's parameters, buffers and gradients; hook new gradients."""
    handles = []
    module_of = parameter_modules(model)
    for _n, p in model.named_parameters():
        mod = module_of[id(p)]
        owner = tracker.owner_of_path(mod)
        # Made while measuring (a script builds its model inside the block): re-filed.
        held = [(t, "parameters") for t in _held_by(p)]
        for t, cat in ((p, "parameters"), *held, (p.grad, "gradients")):
            if t is None:
                continue
            if tracker.sid_of(t) is None:
                tracker.register(t, cat, mod, owner)
            else:
                tracker.mark(t, cat)
        if p.requires_grad:

            def on_grad(q: torch.Tensor, _owner: int = tracker.owner_of_path(mod)) -> None:
                if q.grad is not None:
                    tracker.mark(q.grad, Category.GRADIENTS, owner=_owner)

            handles.append(p.register_post_accumulate_grad_hook(guarded(tracker, on_grad)))
    for n, b in model.named_buffers():
        mod = n.rsplit(".", 1)[0] if "." in n else ""
        if tracker.sid_of(b) is None:
            tracker.register(b, Category.BUFFERS, mod, tracker.owner_of_path(mod))
        else:
            tracker.mark(b, Category.BUFFERS)
    return handles


def _held_by(p: Any, depth: int = 3) -> list[torch.Tensor]:
    """Tensors a parameter object holds as attributes, which are part of the weight: a
    bitsandbytes `Params4bit`'s `quant_state` (absmax, code, offset, nested `state2`), an
    `Int8Params`' row scales `SCB`. Objects are searched `depth` levels deep; modules (a
    `Params4bit` keeps its `Linear4bit`) are not searched."""
    found: list[torch.Tensor] = []
    for v in vars(p).values():
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif depth > 1 and hasattr(v, "__dict__") and not isinstance(v, torch.nn.Module):
            found += _held_by(v, depth - 1)
    return found


def _device_of(model: torch.nn.Module | None) -> str:
    if model is not None and not isinstance(model, torch.nn.Module):
        raise BadInputError(f"measure needs an nn.Module (or None), got {type(model).__name__}.")
    if model is not None:
        for p in model.parameters():
            if p.device.type == "cuda":
                return str(p.device)
    return "cpu"
