"""DistributedDataParallel: each process trains the whole model on its share of the batch, and
DDP all-reduces the gradients through its buckets (the estimate's side of it, the buckets'
memory, is memfit.estimator.ddp).

`apply_` wraps the model last, once it is final (LoRA, precision, checkpointing, offloaded
activations), with PyTorch's defaults, which the estimate models: `bucket_cap_mb=25`,
`gradient_as_bucket_view=False` (the buckets are a second copy of the gradients),
`find_unused_parameters=False`. The setup's `model` is then the wrapper (its `module` is the
user's model); `TrainSetup.accumulate` skips the all-reduce on every micro-batch but the last
(`no_sync`).

Example:
    >>> torch.distributed.init_process_group()  # under torchrun --nproc-per-node 4
    >>> setup = memfit.apply_(model, memfit.Workload(gpus=4, ddp=True), device="cuda")
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memfit.errors import BadInputError
from memfit.techniques.registry import Build, handler


@dataclass(frozen=True, kw_only=True)
class DDPConfig:
    """Wrap the model in `torch.nn.parallel.DistributedDataParallel` over the default process
    group.

    Attributes:
        world_size: the processes the plan was made for (for reports; DDP uses the process
            group it finds).
    """

    world_size: int | None = None

    @property
    def label(self) -> str:
        """How reports and `apply_` name the technique."""
        if self.world_size:
            return f"DDP over {self.world_size} GPUs (gradient buckets)"
        return "DDP (gradient buckets)"


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's model inside a DistributedDataParallel wrapper, or `model` itself."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.module
    return model


@handler
def _ddp(config: DDPConfig, build: Build) -> None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise BadInputError(
            "DDP needs an initialised process group: launch with `torchrun --nproc-per-node N "
            "train.py` and call torch.distributed.init_process_group() before apply_."
        )
    if build.step_model is not None:  # applied already
        return
    device = build.device
    ids = [device.index] if device.type == "cuda" and device.index is not None else None
    build.step_model = torch.nn.parallel.DistributedDataParallel(build.model, device_ids=ids)
    build.applied.append(config.label)
