"""How `memfit.measure` finds the phases of a loop it did not write, from hooks alone.

- "forward" starts when the model's forward is called (a new step after an optimizer step);
- "optimizer" inside `optimizer.step()` (global optimizer step hooks; an optimizer stepping
  another, as `CpuOffloadOptimizer` does, is one step), "zero_grad" after it;
- "backward" is set by the tracker itself, when autograd runs a node.
A transformers Cache passed to the model (`generate`'s `past_key_values`) is watched: the tensors
its layers hold are filed as `kv_cache` (memfit.estimator.generation.kv_cache.CacheWatcher, as in an
estimate).
Without a model (a script), the outermost module called is taken as the model: its tensors are
counted from its first call, and what was made since the last step and is still alive then is
taken as its inputs (data loading).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils import _pytree as pytree

from memfit.estimator import CacheWatcher, Tracker
from memfit.events import Category
from memfit.models.structure import find_repeated_blocks


class PhaseHooks:
    """The hooks of one measurement and the state they share.

    Args:
        m: the Measurement (its `steps` counts optimizer steps).
        tracker: the tracker whose phase and step the hooks set.
        model: the model named by the user, or None (then the outermost module called).
        on_new_model: registers a model found at run time with the tracker; returns handles.
    """

    def __init__(
        self,
        m: Any,
        tracker: Tracker,
        model: torch.nn.Module | None,
        *,
        on_new_model: Callable[[Tracker, torch.nn.Module], list[Any]],
    ) -> None:
        self.m, self.tracker, self.model = m, tracker, model
        self.on_new_model = on_new_model
        self.stepped = False  # an optimizer step ended; the next forward starts a step
        self.opt_depth = 0  # optimizers stepping inside each other
        self.depth = 0  # module calls inside each other (scripts without a named model)
        self.known: set[int] = {id(model)} if model is not None else set()
        self.handles: list[Any] = []
        self.kv = _GuardedCacheWatcher(tracker)

    def install(self) -> list[Any]:
        """Register the hooks; returns their handles (removed by the measurement). Each hook
        is guarded by the tracker's failsafe (`guarded`)."""
        t = self.tracker
        self.handles += [
            _Closing(self.kv),
            register_optimizer_step_pre_hook(guarded(t, self.on_step_pre)),
            register_optimizer_step_post_hook(guarded(t, self.on_step_post)),
        ]
        if self.model is not None:
            self.handles.append(
                self.model.register_forward_pre_hook(guarded(t, self.on_forward), with_kwargs=True)
            )
        else:
            self.handles.append(register_module_forward_pre_hook(guarded(t, self.outer_pre)))
            self.handles.append(
                register_module_forward_hook(guarded(t, self.outer_post), always_call=True)
            )
        return self.handles

    def on_forward(
        self, mod: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        tracker = self.tracker
        self.kv.see(kwargs)
        if torch._C._current_autograd_node() is not None:
            return  # a checkpointed forward recomputed in backward
        if tracker.phase == "forward" and not self.stepped:
            return  # an inner call, or a second forward before backward
        # After an optimizer step: a new step. After a backward: the next micro-batch.
        if self.stepped:
            tracker.step += 1
            self.stepped = False
        for t in _tensors((args, kwargs)):
            if tracker.sid_of(t) is None:
                tracker.register(t, Category.INPUTS)
            else:
                tracker.mark(t, Category.INPUTS)
        tracker.set_phase("forward")

    def on_step_pre(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.opt_depth += 1
        if self.opt_depth == 1:
            self.tracker.set_phase("optimizer")
        # Gradients set without AccumulateGrad (FSDP2's reduce-scattered shards) are found
        # here, where the optimizer reads them.
        for group in opt.param_groups:
            for p in group["params"]:
                if isinstance(p, torch.Tensor) and p.grad is not None:
                    self.tracker.mark(p.grad, Category.GRADIENTS)

    def on_step_post(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.opt_depth -= 1
        for state in opt.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    self.tracker.mark(v, Category.OPTIMIZER_STATE)
        if self.opt_depth == 0:
            self.tracker.set_phase("zero_grad")
            self.stepped = True
            self.m.steps += 1

    def outer_pre(self, mod: torch.nn.Module, args: tuple[Any, ...]) -> None:
        tracker = self.tracker
        self.depth += 1
        if self.depth != 1 or torch._C._current_autograd_node() is not None:
            return  # inside a model, or a checkpointed block recomputed in backward
        if id(mod) in self.known or id(mod) in tracker.named_modules():
            return
        # Later calls go through a hook that also sees keyword arguments (the global hook does
        # not). For this first call, what was made since the last step and is still alive is
        # taken as its inputs (data loading).
        self.known.add(id(mod))
        tracker.add_model(mod, find_repeated_blocks(mod))
        self.handles.extend(self.on_new_model(tracker, mod))
        for sid in tracker.live_sids():
            rec = tracker.records[sid]
            if rec.category == Category.TEMPORARIES and rec.phase in ("setup", "zero_grad"):
                rec.category = Category.INPUTS
        self.handles.append(
            mod.register_forward_pre_hook(guarded(tracker, self.on_forward), with_kwargs=True)
        )
        self.on_forward(mod, args, {})

    def outer_post(self, mod: torch.nn.Module, args: Any, out: Any) -> None:
        self.depth -= 1


def guarded(tracker: Tracker, hook: Callable[..., Any]) -> Callable[..., Any]:
    """`hook` run inside the user's code with the live tracker's failsafe: when it raises,
    the tracker steps aside and the hook returns None, as if absent (memfit.errors.Failsafe)."""
    if tracker.failsafe is None:
        return hook
    name = getattr(hook, "__name__", type(hook).__name__)
    return tracker.failsafe.hook(hook, f"the measurement's hook {name}")


class _GuardedCacheWatcher(CacheWatcher):
    """A CacheWatcher whose filing, run after each `Cache.update` inside `generate`, steps
    the tracker aside when it fails instead of failing the user's update."""

    def mark(self, t: torch.Tensor, layer: int) -> None:
        tracker = self.tracker
        if tracker.failsafe is None:
            super().mark(t, layer)
        elif tracker.failsafe.failed is None:
            tracker.failsafe.call("filing a KV cache tensor", super().mark, t, layer, default=None)


class _Closing:
    """A handle whose `remove` stops the cache watcher (the measurement removes its handles)."""

    def __init__(self, watcher: CacheWatcher) -> None:
        self.watcher = watcher

    def remove(self) -> None:
        self.watcher.close()


def _tensors(obj: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(obj) if isinstance(t, torch.Tensor)]
