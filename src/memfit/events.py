"""The vocabulary of a memory trace: categories, storage records and alloc/free events.

An estimate (`memfit.estimator`) and a measurement (`memfit.measurement`) both produce these;
`MemoryProfile` and the reporters read them. They live at the top so that every package can
use them without importing the tracer.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple


class Category(str, Enum):
    """What a storage holds. A str-Enum: members compare, hash and print as their value, so
    `breakdown["parameters"]` and the JSON contract keep plain strings."""

    PARAMETERS = "parameters"
    BUFFERS = "buffers"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer_state"
    INPUTS = "inputs"
    ACTIVATIONS = "activations"
    TEMPORARIES = "temporaries"
    WORKSPACES = "workspaces"
    #: The KV cache of a generation (transformers' Cache layers: keys and values).
    KV_CACHE = "kv_cache"

    # Print as the value ("parameters"), not as "Category.PARAMETERS" (Python >= 3.11 formats
    # mixed-in enums by name).
    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


#: The categories of allocated memory, in report order, as the plain strings of the JSON
#: contract's `breakdown` keys.
CATEGORIES: tuple[str, ...] = tuple(c.value for c in Category)

#: Device memory outside the allocator's allocated bytes (reserved-but-free cache, and what
#: nvidia-smi adds: the CUDA context and library code).
OUTSIDE_ALLOCATED = ("allocator_cache", "cuda_context")

ALLOC = 1
FREE = -1

#: The op name of frees that happen outside any op (autograd releasing saved tensors, `del`).
RELEASE_OP = "<release>"


class Event(NamedTuple):
    """One allocation or free of a storage. For ALLOC the context is the allocation's; for FREE
    it is the context at the moment of the free."""

    kind: int  # ALLOC or FREE
    sid: int  # the storage (a key of the records)
    phase: str  # "setup", "forward", "backward", "optimizer", "zero_grad"
    step: int
    op: str  # the aten op (or RELEASE_OP, or "<category>" for registered tensors)
    module: str  # module path; "" at the top
    owner: int  # index of the repeated block, or -1


@dataclass(slots=True)
class StorageRecord:
    """One storage, as it was allocated. `category` may be revised later, once the storage's
    role is known (a backward allocation becomes a gradient when stored in `.grad`).

    `host`: the storage is not in the device allocator's memory. `paged`: it is CUDA unified
    memory (bitsandbytes' paged optimizer state), also outside the allocator (so `host` too):
    on the GPU while it fits, paged to host RAM under pressure."""

    sid: int
    nbytes: int
    category: str
    phase: str
    step: int
    op: str
    module: str
    owner: int
    region: int
    host: bool = False
    paged: bool = False

    def moved(self, sid: int, owner: int, module: str) -> StorageRecord:
        """This storage under another id, block and module (a replayed block's copy): as
        `dataclasses.replace` gives, several times faster (a 7B expansion makes 30k)."""
        return StorageRecord(sid, self.nbytes, self.category, self.phase, self.step, self.op,
                             module, owner, self.region, self.host, self.paged)  # fmt: skip
