"""Optimizers laid out as their real implementations keep memory, for the trace.

A real optimizer cannot always run on the tracer's fake tensors: bitsandbytes' and torchao's
updates are CUDA kernels (or compiled graphs) over packed states. What the estimate needs from
them is their memory, so `StateLayout` allocates, per parameter, exactly the state tensors the
optimizer's `OptimizerSpec.states` lists (read from the library's own state initialisation,
cited there) plus the tensors it shares between parameters, and updates the weights in place
like the fused kernels do (no full-size temporaries). It is a layout model, not a numerically
faithful optimizer; `memfit.apply_` builds the library's own class (`OptimizerSpec.real`).

Optimizers written in plain torch ops whose package memfit does not depend on are laid out with
the temporaries of their update (`Lion`, `ScheduleFreeAdamW`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import torch


class _Laid(Protocol):
    """What `StateLayout` reads of an OptimizerSpec row (memfit.optimizers.table)."""

    @property
    def paged(self) -> bool: ...

    def states(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[Any, ...]: ...


#: bitsandbytes `Optimizer8bit.get_state_buffer`: a paged optimizer pages the states of tensors
#: of at least 1e5 elements; smaller ones get ordinary device tensors.
BNB_PAGED_MIN_ELEMENTS = 100_000

#: The state entries bitsandbytes pages: the moments (`get_state_buffer`), not absmax or maps.
PAGED_KEYS = frozenset({"state1", "state2"})

#: The learning rate of an optimizer built without one (memory does not depend on it).
DEFAULT_LR = 1e-3


class StateLayout(torch.optim.Optimizer):
    """The memory of `spec`'s optimizer: its per-parameter state (`spec.states`), created at
    the first step, the tensors shared between parameters, created once, and an in-place update.

    With `spec.paged`, the moments (`PAGED_KEYS`) of a parameter of at least
    `BNB_PAGED_MIN_ELEMENTS` elements are paged (CUDA unified memory outside PyTorch's
    allocator); `is_paged` says which. bitsandbytes decides by the parameter's size
    (`get_state_buffer`, `_get_state_double_buffer`: `p.numel() < 1e5` stays on the device) and
    allocates absmax and the maps with plain `torch.zeros`, never paged.
    """

    def __init__(
        self, params: Iterable[torch.nn.Parameter], spec: _Laid, lr: float = DEFAULT_LR
    ) -> None:
        super().__init__(params, {"lr": lr})
        self.spec = spec
        self._shared: dict[str, torch.Tensor] = {}
        #: ids of the paged state tensors (alive as long as the state holds them).
        self._paged: set[int] = set()

    def is_paged(self, t: torch.Tensor) -> bool:
        """Whether state tensor `t` lives in paged (unified) memory."""
        return id(t) in self._paged

    def _init_state(self, p: torch.Tensor) -> None:
        state = self.state[p]
        state["step"] = 0
        for st in self.spec.states(tuple(p.shape), p.dtype):
            if st.shared:
                if st.key not in self._shared:
                    self._shared[st.key] = torch.zeros(st.shape, dtype=st.dtype, device=p.device)
                state[st.key] = self._shared[st.key]
                continue
            t = torch.zeros(st.shape, dtype=st.dtype, device=p.device)
            if self.spec.paged and st.key in PAGED_KEYS and p.numel() >= BNB_PAGED_MIN_ELEMENTS:
                self._paged.add(id(t))
            state[st.key] = t

    @torch.no_grad()
    def step(self, closure=None):  # torch.optim.Optimizer.step overloads
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not self.state[p]:
                    self._init_state(p)
                self.state[p]["step"] += 1
                # The library's fused kernel updates state and weight in place: no temporaries.
                p.add_(p.grad, alpha=-group["lr"])
        return None


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023), laid out as lion-pytorch: one momentum buffer per parameter and
    per-parameter temporaries for the sign update."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float = DEFAULT_LR,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):  # torch.optim.Optimizer.step overloads
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                exp_avg = state["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                update = exp_avg.clone().mul_(beta1).add(p.grad, alpha=1 - beta1).sign_()
                p.add_(update, alpha=-group["lr"])
                exp_avg.mul_(beta2).add_(p.grad, alpha=1 - beta2)
        return None


class ScheduleFreeAdamW(torch.optim.Optimizer):
    """schedulefree's `AdamWScheduleFree` (Defazio et al. 2024) as its foreach step runs it
    (schedulefree 1.4 adamw_schedulefree.py `step`): state `z` (a copy of the weights, made at
    the first step) and `exp_avg_sq`; one `_foreach_div` of the second moments (a temporary as
    large as all of them, alive until the step ends) and in-place updates otherwise. The
    `optimizer.train()` / `eval()` switch the real one needs interpolates in place (no memory).
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float = DEFAULT_LR,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "k": 0}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):  # torch.optim.Optimizer.step overloads
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            active = [p for p in group["params"] if p.grad is not None]
            for p in active:
                if "z" not in self.state[p]:
                    self.state[p]["z"] = torch.clone(p)
                    self.state[p]["exp_avg_sq"] = torch.zeros_like(p)
            if not active:
                continue
            grads = [p.grad for p in active]
            sq = [self.state[p]["exp_avg_sq"] for p in active]
            zs = [self.state[p]["z"] for p in active]
            torch._foreach_mul_(sq, beta2)
            torch._foreach_addcmul_(sq, grads, grads, value=1 - beta2)
            denom = torch._foreach_div(sq, 1 - beta2 ** (group["k"] + 1))
            torch._foreach_sqrt_(denom)
            torch._foreach_add_(denom, group["eps"])
            torch._foreach_div_(grads, denom)
            if group["weight_decay"]:
                torch._foreach_add_(grads, active, alpha=group["weight_decay"])
            torch._foreach_lerp_(active, zs, weight=0.5)
            torch._foreach_add_(active, grads, alpha=-group["lr"] * (1 - beta1 * 0.5))
            torch._foreach_sub_(zs, grads, alpha=group["lr"])
            del denom
            group["k"] += 1
        return None
