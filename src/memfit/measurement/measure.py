"""`memfit.measure`: real memory of real steps, as the same `MemoryProfile` as an estimate.

memfit's tracker (memfit.estimator.tracker.Tracker) runs over the real tensors of the user's
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from memfit.estimator.tracker import Tracker, parameter_modules
from memfit.events import Category
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
        if self.phase != "backward" and torch._C._current_autograd_node() is not None:
            self.set_phase("backward")
        return super().__torch_dispatch__(func, types, args, kwargs)


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
    _record_history: bool = field(default=False, repr=False)
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
    model, optimizer = m._model, m._optimizer

    root = model if model is not None else torch.nn.Module()
    blocks = find_repeated_blocks(root) if model is not None else []
    tracker = _LiveTracker(root, blocks)
    known: set[int] = {id(model)} if model is not None else set()
    depth = [0]
    # A script's device is known only once it has run; the statistics are read if CUDA works.
    cuda_ready = torch.cuda.is_available() and (
        m.device.startswith("cuda") or (model is None and torch.cuda.is_initialized())
    )
    if cuda_ready:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    if m._record_history and torch.cuda.is_available():
        torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES)
    stepped = [False]
    opt_depth = [0]  # an optimizer stepping another (CpuOffloadOptimizer) is one step

    def on_forward(mod: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if torch._C._current_autograd_node() is not None:
            return  # a checkpointed forward recomputed in backward
        if tracker.phase == "forward" and not stepped[0]:
            return  # an inner call, or a second forward before backward
        # After an optimizer step: a new step. After a backward: the next micro-batch.
        if stepped[0]:
            tracker.step += 1
            stepped[0] = False
        for t in _tensors((args, kwargs)):
            if tracker.sid_of(t) is None:
                tracker.register(t, Category.INPUTS)
            else:
                tracker.mark(t, Category.INPUTS)
        tracker.set_phase("forward")

    def on_step_pre(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        opt_depth[0] += 1
        if opt_depth[0] == 1:
            tracker.set_phase("optimizer")
        # Gradients set without AccumulateGrad (FSDP2's reduce-scattered shards) are found
        # here, where the optimizer reads them.
        for group in opt.param_groups:
            for p in group["params"]:
                if isinstance(p, torch.Tensor) and p.grad is not None:
                    tracker.mark(p.grad, Category.GRADIENTS)

    def on_step_post(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        opt_depth[0] -= 1
        for state in opt.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    tracker.mark(v, Category.OPTIMIZER_STATE)
        if opt_depth[0] == 0:
            tracker.set_phase("zero_grad")
            stepped[0] = True
            m.steps += 1

    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    m._hooks = [
        register_optimizer_step_pre_hook(on_step_pre),
        register_optimizer_step_post_hook(on_step_post),
    ]
    if model is not None:
        m._hooks.append(model.register_forward_pre_hook(on_forward, with_kwargs=True))
    else:
        # No model named (a script): the outermost module called is the model. Its
        # parameters are counted from its first call, its modules named by their paths in it.
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        def outer_pre(mod: torch.nn.Module, args: tuple[Any, ...]) -> None:
            depth[0] += 1
            if depth[0] != 1 or torch._C._current_autograd_node() is not None:
                return  # inside a model, or a checkpointed block recomputed in backward
            if id(mod) not in known and id(mod) not in tracker.named_modules():
                # Later calls go through a hook that also sees keyword arguments (the global
                # hook does not). For this first call, what was made since the last step and
                # is still alive is taken as its inputs (data loading).
                known.add(id(mod))
                tracker.add_model(mod, find_repeated_blocks(mod))
                m._hooks.extend(_register_model(tracker, mod))
                for sid in tracker.live_sids():
                    rec = tracker.records[sid]
                    if rec.category == "temporaries" and rec.phase in ("setup", "zero_grad"):
                        rec.category = Category.INPUTS
                m._hooks.append(mod.register_forward_pre_hook(on_forward, with_kwargs=True))
                on_forward(mod, args, {})

        def outer_post(mod: torch.nn.Module, args: Any, out: Any) -> None:
            depth[0] -= 1

        m._hooks.append(register_module_forward_pre_hook(outer_pre))
        m._hooks.append(register_module_forward_hook(outer_post, always_call=True))
    try:
        with tracker:
            tracker.set_phase("setup", 0)
            if model is not None:
                m._hooks += _register_model(tracker, model)
            if optimizer is not None:
                for state in optimizer.state.values():
                    for v in state.values():
                        if isinstance(v, torch.Tensor):
                            tracker.register(v, Category.OPTIMIZER_STATE)
            try:
                yield m
            except torch.OutOfMemoryError as e:
                # Explained while the tensors that filled the memory are still recorded. The
                # report travels with the error (printed under its traceback), and stays on
                # `m.oom_report`; the library prints nothing itself.
                m.oom_report = explain_live(e, tracker.records, tracker.events)
                if hasattr(e, "add_note"):  # Python >= 3.11
                    e.add_note(m.oom_report)
                raise
    finally:
        tracker.close()
        for h in m._hooks:
            h.remove()
        m._hooks = []
        if model is None and "cuda" in tracker.device_types.values():
            m.device = f"cuda:{torch.cuda.current_device()}"
        cuda = m.device.startswith("cuda")
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
        for t, cat in ((p, "parameters"), (p.grad, "gradients")):
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

            handles.append(p.register_post_accumulate_grad_hook(on_grad))
    for n, b in model.named_buffers():
        mod = n.rsplit(".", 1)[0] if "." in n else ""
        if tracker.sid_of(b) is None:
            tracker.register(b, Category.BUFFERS, mod, tracker.owner_of_path(mod))
        else:
            tracker.mark(b, Category.BUFFERS)
    return handles


def _tensors(obj: Any) -> list[torch.Tensor]:
    from torch.utils import _pytree as pytree

    return [t for t in pytree.tree_leaves(obj) if isinstance(t, torch.Tensor)]


def _device_of(model: torch.nn.Module | None) -> str:
    if model is not None:
        for p in model.parameters():
            if p.device.type == "cuda":
                return str(p.device)
    return "cpu"
