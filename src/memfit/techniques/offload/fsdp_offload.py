"""FSDP2's CPU offload (`CPUOffloadPolicy`) in the trace: the device copies a CPU mesh skips.

With `fully_shard(..., offload_policy=CPUOffloadPolicy())` (torch/distributed/fsdp/_fully_shard,
torch 2.13) one rank holds:

- on the host: its shard of every parameter (`FSDPParam._init_sharded_param`: the padded shard
  is moved `.cpu()` and pinned), the gradient shards (`foreach_reduce` copies each
  reduce-scattered shard `.to("cpu", non_blocking=True)`, into pinned memory) and the
  optimizer state (the optimizer makes it from the CPU shards, so it is ordinary memory), and
  the optimizer step runs there;
- on the device: for each unit (a block, the root) the host-to-device copy of each shard,
  `FSDPParam.all_gather_inputs` (`sharded_param_data.to(device, non_blocking=True)`, then the
  cast to `param_dtype`), alive until the all-gather's copy-in is done (`foreach_all_gather`
  holds them until it returns; with one rank `FSDPParamGroup.wait_for_unshard` copies each into
  the unsharded parameter, one at a time); the unsharded parameters while the unit runs, with
  FSDP2's own resharding (`reshard_after_forward`; the root keeps its parameters from forward
  to backward) and prefetching; the unsharded gradients until the reduce-scatter's copy-in;
  the reduce-scatter's output until its shards are copied to the host.

The estimator traces the real FSDP2 over a fake process group on a CPU mesh
(memfit.estimator.trace.fake_distributed), where the mesh's device is the CPU: both `.to()` calls
are
no-ops, so the trace would show no shard copy on the device and would keep the gradients in the
reduce-scatter output. `emulated_cpu_offload` patches the two points while it traces:
`FSDPParam.all_gather_inputs` gets a device copy of the shard (op `OP_SHARD_TO_DEVICE`) in place
of the host shard, which FSDP2's own code then casts and copies in with the same lifetime as on
CUDA; `foreach_reduce` is followed by a host copy of each new gradient shard (marked host memory,
op `OP_GRAD_TO_HOST`), which becomes the gradient, so that the reduce-scatter output is freed when
`foreach_reduce` returns, as on CUDA. `mark_host_shards` marks the sharded parameters as host
memory. The optimizer's state and its update's temporaries are put on the host by the estimate
(memfit.estimator.device_memory.place_on_host), as with optimizer offload.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from memfit.events import Category

#: Pseudo-ops of the trace's records: a shard's copy to the device before its all-gather and a
#: gradient shard's copy to the host after the reduce-scatter.
OP_SHARD_TO_DEVICE = "fsdp_shard_to_device"
OP_GRAD_TO_HOST = "fsdp_grad_to_host"


def mark_host_shards(tracker: Any, model: torch.nn.Module) -> None:
    """Mark the FSDP2-sharded parameters of `model` (already registered with `tracker`) as
    parameters in host memory: their local shards live on the CPU under CPUOffloadPolicy."""
    for p in model.parameters():
        tracker.mark(p, Category.PARAMETERS, host=True)


@contextlib.contextmanager
def emulated_cpu_offload(tracker: Any, enabled: bool = True) -> Iterator[None]:
    """While tracing FSDP2 with CPUOffloadPolicy on a CPU mesh, make its two copies act as on
    CUDA (see the module docstring); a no-op unless `enabled`."""
    if not enabled:
        yield
        return
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    fsdp_param_cls = _fsdp_param.FSDPParam
    original_inputs: Any = fsdp_param_cls.__dict__["all_gather_inputs"]  # the property
    original_reduce = _fsdp_param_group.foreach_reduce
    sharded = _fsdp_param.ShardedState.SHARDED

    def all_gather_inputs(self: Any) -> list[torch.Tensor]:
        if not (
            self.offload_to_cpu
            and self.sharded_state == sharded
            and not hasattr(self._sharded_local_tensor, "fsdp_pre_all_gather")
        ):
            return original_inputs.fget(self)
        host = self._sharded_param_data
        device = torch.empty_like(host)  # sharded_param_data.to(self.device)
        device.copy_(host)
        _name(tracker, device, OP_SHARD_TO_DEVICE)
        self._sharded_param_data = device  # FSDP2's `.to(cpu)` keeps it; the cast copies it
        try:
            return original_inputs.fget(self)
        finally:
            self._sharded_param_data = host

    def foreach_reduce(fsdp_params: list[Any], *args: Any, **kwargs: Any) -> Any:
        # Shards with a gradient already (accumulation) are added to in place on the host.
        fresh = [fp for fp in fsdp_params if fp.offload_to_cpu and fp.sharded_param.grad is None]
        out = original_reduce(fsdp_params, *args, **kwargs)
        for fp in fresh:
            grad = fp.sharded_param.grad
            if grad is None:
                continue
            local = grad._local_tensor  # a view of the reduce-scatter output
            host = torch.empty(fp.sharded_size, dtype=local.dtype)  # .to("cpu")
            host.copy_(local)
            tracker.mark(host, Category.GRADIENTS, host=True)
            _name(tracker, host, OP_GRAD_TO_HOST)
            fp.sharded_param.grad = fp.to_sharded_dtensor(host)
            # The output is not the gradient here (a post-accumulate-grad hook may have said
            # so): freed at return, as on CUDA once its shards are copied down.
            tracker.mark(local, Category.TEMPORARIES)
            del grad, local
        return out

    fsdp_param_cls.all_gather_inputs = property(all_gather_inputs)  # type: ignore[assignment,method-assign]
    _fsdp_param_group.foreach_reduce = foreach_reduce
    try:
        yield
    finally:
        fsdp_param_cls.all_gather_inputs = original_inputs  # type: ignore[method-assign]
        _fsdp_param_group.foreach_reduce = original_reduce


def _name(tracker: Any, t: torch.Tensor, op: str) -> None:
    sid = tracker.sid_of(t)
    if sid is not None:
        tracker.records[sid].op = op
