"""Optimizer state and update on the CPU (what the planner's "optimizer state on CPU" means).

`CpuOffloadOptimizer` keeps a CPU copy of each trainable parameter and runs the real optimizer
(AdamW, ...) on those copies: its state never touches the GPU. Each step copies the gradients
down to the CPU, steps there, and copies the updated parameters back into the GPU parameters
in place. The GPU holds parameters and gradients only; the cost is two PCIe transfers of the
parameters' size per step and the CPU update (memfit.planner.cost prices both).

Works with GradScaler (it unscales the GPU gradients before `step`) and with the global
optimizer hooks. `state_dict` is the inner optimizer's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from memfit.errors import BadInputError


class CpuOffloadOptimizer(torch.optim.Optimizer):
    """Run `make_inner(cpu_groups)`'s updates on CPU copies of the parameters.

    `params` is what torch.optim takes: tensors, or dicts of parameter groups (each group's
    options are kept; the inner optimizer gets the same groups over the CPU copies).

    Example:
        >>> opt = CpuOffloadOptimizer(model.parameters(), lambda g: torch.optim.AdamW(g))
    """

    def __init__(self, params: Iterable[Any], make_inner: Callable[[list[dict[str, Any]]], Any]):
        items = list(params)
        groups = items if items and isinstance(items[0], dict) else [{"params": items}]
        groups = [dict(g, params=list(g["params"])) for g in groups]
        pin = torch.cuda.is_available()
        self.cpu_params: list[torch.nn.Parameter] = []
        cpu_groups = []
        for g in groups:
            copies = []
            for p in g["params"]:
                if _is_dtensor(p):
                    raise BadInputError(
                        "Optimizer offload does not take FSDP-sharded parameters: use FSDP2's "
                        "own CPUOffloadPolicy (fully_shard(..., offload_policy=...)) instead."
                    )
                cpu = torch.empty(p.shape, dtype=p.dtype, device="cpu", pin_memory=pin)
                copies.append(torch.nn.Parameter(cpu.copy_(p.detach())))
            self.cpu_params += copies
            cpu_groups.append(dict(g, params=copies))
        self.inner: torch.optim.Optimizer = make_inner(cpu_groups)
        super().__init__(groups, dict(self.inner.defaults))

    def _sync_options(self, src: list[dict[str, Any]], dst: list[dict[str, Any]]) -> None:
        for a, b in zip(src, dst, strict=True):
            b.update({k: v for k, v in a.items() if k != "params"})

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = closure() if closure is not None else None
        device_params = [p for g in self.param_groups for p in g["params"]]
        for p, c in zip(device_params, self.cpu_params, strict=True):
            c.grad = None if p.grad is None else p.grad.to("cpu", non_blocking=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        # A scheduler drives the outer groups' options (lr, ...); the inner groups follow.
        self._sync_options(self.param_groups, self.inner.param_groups)
        self.inner.step()
        for p, c in zip(device_params, self.cpu_params, strict=True):
            if c.grad is not None:
                p.copy_(c, non_blocking=True)
            c.grad = None
        return loss

    def state_dict(self) -> dict[str, Any]:
        self._sync_options(self.param_groups, self.inner.param_groups)
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.inner.load_state_dict(state_dict)
        self._sync_options(self.inner.param_groups, self.param_groups)


def _is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)
