"""FSDP2 sharding: `fully_shard` on each repeated block, then on the root, over the default
process group (or, for estimates, a fake one on a CPU mesh); optionally with FSDP2's
`CPUOffloadPolicy` (parameters, gradients and optimizer state on the CPU; the trace's emulation
of its device copies is memfit.techniques.offload.fsdp_offload).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.models.structure import find_repeated_blocks
from memfit.techniques.precision import remove_autocast_forward
from memfit.techniques.registry import Build, handler

_PARAM_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, kw_only=True)
class FSDPConfig:
    """Shard parameters, gradients and optimizer state with FSDP2 (`fully_shard`) per block,
    then the root, over the initialised default process group.

    Attributes:
        reshard_after_forward: free the gathered parameters of a block after its forward
            (ZeRO-3); False keeps them until backward (ZeRO-2-like, more memory, less traffic).
        world_size: the number of ranks the plan was made for (for reports; sharding uses the
            process group it finds).
        param_dtype: with a "-mixed" precision, FSDP2's `MixedPrecisionPolicy(param_dtype=...,
            reduce_dtype=torch.float32)`: parameters are all-gathered and used in this dtype
            ("bfloat16" or "float16"), gradients reduce-scattered in fp32 onto fp32 shards,
            and no autocast runs. None keeps the parameters' own dtype (autocast, if any, runs
            over fp32 all-gathers).
        reduce_dtype: with `param_dtype`, the policy's `reduce_dtype` and `output_dtype`
            instead of float32 and none, and autocast kept over the forward: accelerate's FSDP2
            mixed precision (`FullyShardedDataParallelPlugin.set_mixed_precision` gives
            param, reduce and output dtypes the 16-bit one; its native AMP wraps the forward
            in autocast), which the HF Trainer runs.
        cpu_offload: FSDP2's `CPUOffloadPolicy`: the sharded parameters, their gradients and
            the optimizer state live in CPU memory (pinned when CUDA is there); each unit's
            shards are copied to the GPU before its all-gather and the reduce-scattered
            gradients are copied back; the optimizer steps on the CPU. Also with one GPU.
    """

    reshard_after_forward: bool = True
    world_size: int | None = None
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    cpu_offload: bool = False

    def __post_init__(self) -> None:
        for name in ("param_dtype", "reduce_dtype"):
            if getattr(self, name) not in (None, *_PARAM_DTYPES):
                raise BadInputError(
                    f"FSDPConfig.{name} must be one of {list(_PARAM_DTYPES)} or None, got "
                    f"{getattr(self, name)!r}."
                )
        if self.reduce_dtype is not None and self.param_dtype is None:
            raise BadInputError(
                "FSDPConfig.reduce_dtype is part of FSDP2's MixedPrecisionPolicy and needs "
                "param_dtype. Give param_dtype too, or drop reduce_dtype."
            )

    @property
    def label(self) -> str:
        """How reports and `apply_` name the technique."""
        sharded = self.world_size is not None and self.world_size > 1
        if self.cpu_offload:
            offload = "FSDP2 CPU offload"
            return f"FSDP over {self.world_size} GPUs, {offload}" if sharded else offload
        label = f"FSDP over {self.world_size} GPUs" if self.world_size else "FSDP2"
        if self.reduce_dtype is not None:
            label += f" ({self.reduce_dtype} all-gathers and reduction, autocast: accelerate's)"
        return label


def fsdp_config_of(w: Any) -> FSDPConfig:
    """The FSDPConfig a Workload's FSDP2 (`w.fsdp`) runs."""
    return FSDPConfig(world_size=w.gpus, param_dtype=w.fsdp_param_dtype,
                      reduce_dtype=w.fsdp_reduce_dtype, cpu_offload=w.fsdp_cpu_offload)  # fmt: skip


def shard_model(
    model: torch.nn.Module, config: FSDPConfig, *, mesh: Any = None, pin_memory: bool | None = None
) -> None:
    """FSDP2 `fully_shard` on each repeated block, then on the root (once).

    `mesh` is the device mesh (default: FSDP2's, over the default process group); the
    estimator passes a CPU mesh over a fake process group. `pin_memory` is the
    `CPUOffloadPolicy`'s with `config.cpu_offload` (None: pinned when CUDA is available;
    pinning needs CUDA, so a CPU-only run and the trace pass False).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise BadInputError(
            "FSDP needs an initialised process group: launch with `torchrun --nproc-per-node N "
            "train.py` and call torch.distributed.init_process_group() before apply_."
        )
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        FSDPModule,
        MixedPrecisionPolicy,
        fully_shard,
    )

    if isinstance(model, FSDPModule):
        return
    options: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": config.reshard_after_forward}
    if config.param_dtype is not None:
        low = _PARAM_DTYPES[config.param_dtype]
        reduce = _PARAM_DTYPES[config.reduce_dtype] if config.reduce_dtype else None
        options["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=low, reduce_dtype=reduce or torch.float32, output_dtype=reduce
        )
    if config.cpu_offload:
        pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        options["offload_policy"] = CPUOffloadPolicy(pin_memory=pin)
    for path in find_repeated_blocks(model):
        block = model.get_submodule(path)
        if not isinstance(block, FSDPModule):
            fully_shard(block, **options)
    fully_shard(model, **options)


@handler
def _fsdp(config: FSDPConfig, build: Build) -> None:
    shard_model(build.model, config)
    if config.param_dtype is not None and config.reduce_dtype is None:
        # FSDP2 casts the gathered parameters itself; autocast on top would be a second policy
        # (accelerate's, with a 16-bit reduction, keeps it).
        build.autocast_dtype = None
        remove_autocast_forward(build.model)
    build.applied.append(config.label)
