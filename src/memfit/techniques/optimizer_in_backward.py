"""Optimizer step in backward: each parameter is updated as soon as its gradient is complete,
and the gradient is freed at once, so a full set of gradients never exists.

The mechanism is PyTorch's (tutorial "How to save memory by fusing the optimizer step into the
backward pass"; torchtune's low-memory full-finetune recipe, `OptimizerInBackwardWrapper` in
torchtune/training/memory.py): one optimizer per parameter, stepped from a
`register_post_accumulate_grad_hook` hook that then sets `p.grad = None`. AccumulateGrad runs
the hook right after it stores the gradient, so at any moment only the gradients of the
parameters whose backward is in flight are alive, not all of them until `optimizer.step()`.

What it cannot combine with, and why:
- gradient accumulation: the step runs as each gradient lands, so nothing accumulates over
  micro-batches (`Workload` refuses grad_accum > 1);
- fp16-mixed: the GradScaler unscales and checks all gradients together before the step;
- optimizer offload (ours or FSDP2's CPUOffloadPolicy): the step runs on the CPU after backward;
- `clip_grad_norm_` over all parameters (or any step reading all gradients at once): when the
  last gradient lands the others are gone. Per-parameter clipping inside the hook would work;
  memfit does not add it.

`OptimizerInBackward` is what `TrainSetup.optimizer` holds then: its `step()` does nothing (the
steps happened in backward) and its `param_groups` and `state` are the per-parameter
optimizers' own, so an LR scheduler, `state_dict()` and `load_state_dict()` work on it.

The estimate traces the same thing (`trace_hooks`, registered by the step runner after the
tracker's gradient hook): per-parameter optimizers laid out as CUDA runs them (foreach), each
step inside the backward phase of its parameter's block, and an optimizer phase that steps
nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.optimizers import DEFAULT_OPTIMIZER
from memfit.techniques.optimizer import (
    OptimizerConfig,
    build_optimizer,
    is_paged_state,
    mark_state,
)
from memfit.techniques.registry import Build, handler


@dataclass(frozen=True, kw_only=True)
class OptimizerInBackwardConfig:
    """Step the optimizer (the `OptimizerConfig` given with it) inside backward, one parameter at
    a time, and free each gradient at once. See the module docstring for what it excludes."""

    @property
    def label(self) -> str:
        """How reports and `apply_` name the technique."""
        return "optimizer step in backward"


class OptimizerInBackward(torch.optim.Optimizer):
    """The per-parameter optimizers of a step in backward, seen as one optimizer.

    `step()` runs nothing (each parameter was stepped by its hook); `zero_grad` frees what is
    left. `param_groups` are the inner optimizers' groups themselves (one per parameter), and
    `state[p]` is the inner optimizer's state of `p`, so a scheduler changing `lr` changes the
    inner optimizers, and `state_dict()` / `load_state_dict()` cover all of them.
    """

    def __init__(self, optimizers: dict[torch.nn.Parameter, torch.optim.Optimizer]) -> None:
        if not optimizers:
            raise BadInputError("OptimizerInBackward needs at least one parameter.")
        self.optimizers = optimizers
        first = next(iter(optimizers.values()))
        super().__init__([{"params": [p]} for p in optimizers], dict(first.defaults))
        self._share(loaded=False)

    def _share(self, *, loaded: bool) -> None:
        """Make this optimizer's groups and state the inner optimizers' own objects; after
        `load_state_dict` (`loaded`), the loaded options and state go to the inner ones."""
        groups = []
        for i, (p, opt) in enumerate(self.optimizers.items()):
            inner = opt.param_groups[0]
            if loaded:
                inner.update({k: v for k, v in self.param_groups[i].items() if k != "params"})
                opt.state[p] = self.state[p]
            groups.append(inner)
            self.state[p] = opt.state[p]
        self.param_groups = groups

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Nothing to do: every parameter was stepped in backward."""
        return closure() if closure is not None else None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._share(loaded=True)

    def is_paged(self, t: torch.Tensor) -> bool:
        """Whether an inner optimizer keeps state tensor `t` in paged memory (trace layouts)."""
        return any(is_paged_state(opt, t) for opt in self.optimizers.values())


def register_step_hooks(
    optimizers: dict[torch.nn.Parameter, torch.optim.Optimizer],
    *,
    before: Callable[[torch.nn.Parameter], None] | None = None,
    after: Callable[[torch.nn.Parameter, torch.optim.Optimizer], None] | None = None,
) -> list[Any]:
    """A post-accumulate-grad hook on each parameter that steps its optimizer and frees its
    gradient (`before` runs before the step, `after` once the gradient is freed: the tracer's
    bookkeeping). Returns the hook handles."""
    handles = []
    for p, opt in optimizers.items():

        def hook(param: torch.Tensor, _opt: torch.optim.Optimizer = opt) -> None:
            if before is not None:
                before(param)  # type: ignore[arg-type]
            _opt.step()
            _opt.zero_grad(set_to_none=True)
            if after is not None:
                after(param, _opt)  # type: ignore[arg-type]

        handles.append(p.register_post_accumulate_grad_hook(hook))
    return handles


def per_parameter_optimizers(
    params: list[torch.nn.Parameter], config: OptimizerConfig, *, for_trace: bool
) -> dict[torch.nn.Parameter, torch.optim.Optimizer]:
    """One optimizer per parameter, built as `config` says (memfit.techniques.optimizer)."""
    return {p: build_optimizer([p], config, for_trace=for_trace) for p in params}


#: Where apply_ keeps the hook handles on the model, so that a second apply_ replaces them.
_HANDLES = "_memfit_step_in_backward_hooks"


@handler
def _in_backward(config: OptimizerInBackwardConfig, build: Build) -> None:
    oc: OptimizerConfig | None = build.optimizer_config
    if oc is None or build.optimizer is None:
        raise BadInputError(
            "OptimizerInBackwardConfig steps the optimizer an OptimizerConfig names, and none "
            f"was given. Add OptimizerConfig(name={DEFAULT_OPTIMIZER!r}, lr=...) to the configs."
        )
    why = ""
    if oc.offload:
        why = "OptimizerConfig(offload=True): the optimizer steps on the CPU after backward"
    elif build.grad_accum > 1:
        why = (
            f"gradient accumulation ({build.grad_accum} micro-batches): the step runs as each "
            "gradient lands, so gradients cannot accumulate"
        )
    elif build.scaler is not None:
        why = "fp16-mixed: the GradScaler unscales and checks all gradients together"
    if why:
        raise BadInputError(
            f"OptimizerInBackwardConfig cannot combine with {why}. Drop one of them."
        )
    params = [p for g in build.optimizer.param_groups for p in g["params"]]
    for h in getattr(build.model, _HANDLES, ()):  # a second apply_: replace, not add
        h.remove()
    optimizers = per_parameter_optimizers(params, oc, for_trace=False)
    setattr(build.model, _HANDLES, register_step_hooks(optimizers))
    build.optimizer = OptimizerInBackward(optimizers)
    build.applied.append(config.label)
    build.left_to_caller.append(
        "the optimizer steps inside backward (a hook on each parameter) and frees each "
        "gradient: setup.optimizer.step() does nothing; no gradient is left after backward, "
        "so clip_grad_norm_ over all parameters cannot run and gradients cannot accumulate."
    )


def for_trace(name: str, params: list[torch.nn.Parameter]) -> OptimizerInBackward:
    """The per-parameter optimizers a workload's step in backward runs, laid out as CUDA runs
    them (foreach, bitsandbytes layouts), behind one `OptimizerInBackward`."""
    return OptimizerInBackward(
        per_parameter_optimizers(params, OptimizerConfig(name=name), for_trace=True)
    )


def trace_hooks(
    tracker: Any,
    optimizer: OptimizerInBackward,
    owners: dict[int, tuple[int, str]],
    host_keys: frozenset[str],
) -> list[Any]:
    """The hooks of the trace (memfit.estimator.trace.step_runner). Each step runs in the
    "backward" phase, where it happens: its allocations belong to the parameter's block through
    the autograd node running (the parameter's AccumulateGrad), so the replay of repeated
    blocks copies each block's step with its backward. Host scalars (Adam's CPU step counters)
    are host memory as in an optimizer phase; the state is marked optimizer state
    (`mark_state`). Register the hooks after the tracker's gradient hook, so that the gradient
    is counted before it is freed."""

    def before(p: torch.nn.Parameter) -> None:
        tracker.param_owner, tracker.param_module = owners.get(id(p), (-1, ""))
        tracker.stepping_in_backward = True

    def after(p: torch.nn.Parameter, opt: torch.optim.Optimizer) -> None:
        mark_state(tracker, opt, host_keys, [p])
        tracker.stepping_in_backward = False

    return register_step_hooks(optimizer.optimizers, before=before, after=after)
