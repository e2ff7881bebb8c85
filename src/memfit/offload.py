"""Optimizer state and update on the CPU (what the planner's "optimizer state on CPU" means).

`CpuOffloadOptimizer` keeps a CPU copy of each trainable parameter and runs the real optimizer
(AdamW, ...) on those copies: its state never touches the GPU. Each step copies the gradients
down to the CPU, steps there, and copies the updated parameters back into the GPU parameters
in place. The GPU holds parameters and gradients only; the cost is two PCIe transfers of the
parameters' size per step and the CPU update (memfit.cost prices both).

Works with GradScaler (it unscales the GPU gradients before `step`) and with the global
optimizer hooks. `state_dict` is the inner optimizer's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


class CpuOffloadOptimizer(torch.optim.Optimizer):
    """Run `make_inner(cpu_params)`'s updates on CPU copies of `params`.

    Example:
        >>> opt = CpuOffloadOptimizer(model.parameters(), lambda ps: torch.optim.AdamW(ps))
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        make_inner: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
    ) -> None:
        device_params = list(params)
        pin = torch.cuda.is_available()
        self.cpu_params = [
            torch.nn.Parameter(
                torch.empty(p.shape, dtype=p.dtype, device="cpu", pin_memory=pin).copy_(p.detach())
            )
            for p in device_params
        ]
        self.inner = make_inner(self.cpu_params)
        super().__init__(device_params, dict(self.inner.defaults))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = closure() if closure is not None else None
        device_params = [p for g in self.param_groups for p in g["params"]]
        for p, c in zip(device_params, self.cpu_params, strict=True):
            c.grad = None if p.grad is None else p.grad.to("cpu", non_blocking=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        for g_out, g_in in zip(self.param_groups, self.inner.param_groups, strict=True):
            g_in["lr"] = g_out["lr"]  # an LR scheduler drives the outer groups
        self.inner.step()
        for p, c in zip(device_params, self.cpu_params, strict=True):
            if c.grad is not None:
                p.copy_(c, non_blocking=True)
            c.grad = None
        return loss

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.inner.load_state_dict(state_dict)
