"""What `memfit.simulate` records: one `LiveTensor` per storage on the simulated GPU, and the
`OomState` at a failed malloc (read by `memfit.simulation.oom`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from memfit.cuda.allocator_config import AllocatorConfig, cuda_block_size
from memfit.cuda.allocator_oom import OutOfMemory

__all__ = ["LiveTensor", "OomState", "optimizer_state_sizes"]


@dataclass(frozen=True, kw_only=True)
class LiveTensor:
    """One storage on the simulated GPU. `block_bytes` is the 512-byte-rounded request."""

    nbytes: int
    category: str
    op: str
    module: str
    phase: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def block_bytes(self) -> int:
        return cuda_block_size(self.nbytes)


@dataclass(frozen=True, kw_only=True)
class OomState:
    """The simulated GPU at the failed malloc: the allocator's record, where, and what was live."""

    oom: OutOfMemory
    message: str
    op: str
    module: str
    phase: str
    live: tuple[LiveTensor, ...]  # in allocation order
    request: LiveTensor  # the storage that did not fit
    config: AllocatorConfig
    total_capacity_bytes: int
    #: Paths of the model's repeated blocks (memfit.models.structure.find_repeated_blocks), if a
    #: model was given.
    block_paths: tuple[str, ...] = ()
    #: The model's class name, if one was given (then empty `block_paths` means it has none).
    model: str | None = None
    #: The optimizer's class name, if one was given.
    optimizer: str | None = None
    #: (parameter shape, bytes of its optimizer state) for each parameter with state.
    optimizer_state: tuple[tuple[tuple[int, ...], int], ...] = field(default=())


def optimizer_state_sizes(optimizer: Any) -> tuple[tuple[tuple[int, ...], int], ...]:
    """(parameter shape, bytes of its state but the step counter) per parameter with state."""
    out: list[tuple[tuple[int, ...], int]] = []
    for p, state in optimizer.state.items() if optimizer is not None else ():
        tensors = [v for k, v in state.items() if isinstance(v, torch.Tensor) and k != "step"]
        if tensors and isinstance(p, torch.Tensor):
            out.append((tuple(p.shape), sum(v.untyped_storage().nbytes() for v in tensors)))
    return tuple(out)
