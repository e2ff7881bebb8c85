"""FSDP2 sharding: `fully_shard` on each repeated block, then on the root, over the default
process group (or, for estimates, a fake one on a CPU mesh).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.models.structure import find_repeated_blocks
from memfit.techniques.registry import Build, handler


@dataclass(frozen=True, kw_only=True)
class FSDPConfig:
    """Shard parameters, gradients and optimizer state with FSDP2 (`fully_shard`) per block,
    then the root, over the initialised default process group.

    Attributes:
        reshard_after_forward: free the gathered parameters of a block after its forward
            (ZeRO-3); False keeps them until backward (ZeRO-2-like, more memory, less traffic).
        world_size: the number of ranks the plan was made for (for reports; sharding uses the
            process group it finds).
    """

    reshard_after_forward: bool = True
    world_size: int | None = None

    @property
    def label(self) -> str:
        """How reports and `apply_` name the technique."""
        return f"FSDP over {self.world_size} GPUs" if self.world_size else "FSDP2"


def shard_model(model: torch.nn.Module, config: FSDPConfig, *, mesh: Any = None) -> None:
    """FSDP2 `fully_shard` on each repeated block, then on the root (once).

    `mesh` is the device mesh (default: FSDP2's, over the default process group); the
    estimator passes a CPU mesh over a fake process group.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise BadInputError(
            "FSDP needs an initialised process group: launch with `torchrun --nproc-per-node N "
            "train.py` and call torch.distributed.init_process_group() before apply_."
        )
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if isinstance(model, FSDPModule):
        return
    for path in find_repeated_blocks(model):
        block = model.get_submodule(path)
        if not isinstance(block, FSDPModule):
            fully_shard(block, mesh=mesh, reshard_after_forward=config.reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=config.reshard_after_forward)


@handler
def _fsdp(config: FSDPConfig, build: Build) -> None:
    shard_model(build.model, config)
    build.applied.append(config.label)
