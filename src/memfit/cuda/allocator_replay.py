"""Replay a stream of allocate/free events through the simulated caching allocator: the
`torch.cuda` peaks (`max_memory_allocated`, `max_memory_reserved`), the block each request got,
the reserved timeline, and the first allocation that does not fit.

Within `shared_runs()`, `simulate_shared` reads back the run of a stream replayed already with
the same settings instead of replaying it again: `memfit gpus --for` estimates the same
configurations on every GPU whose kernels trace alike, and their allocators see the same
requests (the device's size changes the run only through its capacity, or a memory fraction).
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from memfit.cuda.allocator import CachingAllocator
from memfit.cuda.allocator_config import AllocatorConfig
from memfit.cuda.allocator_oom import AllocatorOutOfMemoryError, OutOfMemory
from memfit.errors import BadInputError


@dataclass(frozen=True, kw_only=True)
class AllocatorResult:
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    reserved_at_peak_allocated_bytes: int
    peak_index: int
    peak_reserved_index: int
    final_allocated_bytes: int
    final_reserved_bytes: int
    num_segments_at_peak: int
    oom: OutOfMemory | None
    reserved_timeline: tuple[int, ...] | None
    #: With ``record_blocks``: the size of the block each allocation got, by key. It is what
    #: ``memory_allocated`` counts for it: the rounded request, or more when the rest of the
    #: block was too small to split off (large pool: 1 MiB or less).
    block_bytes: dict[int, int] | None = None


def simulate(
    events: Iterable[tuple[int, int, int]],
    *,
    config: AllocatorConfig = AllocatorConfig(),  # noqa: B008 (frozen, immutable)
    capacity_bytes: int | None = None,
    total_bytes: int | None = None,
    record_timeline: bool = False,
    record_blocks: bool = False,
) -> AllocatorResult:
    """Replay ``(kind, key, size)`` events through a :class:`CachingAllocator`.

    ``kind`` +1 allocates ``size`` requested bytes under ``key``; -1 frees the block held
    under ``key`` (size ignored). A 0-byte allocation takes no memory, as in PyTorch's
    ``NativeCachingAllocator::allocate``. Stops at the first allocation that does not fit
    in ``capacity_bytes`` (then ``oom`` is set). Peaks are ``max_memory_allocated`` /
    ``max_memory_reserved`` equivalents; indices are event indices. ``total_bytes`` is the
    device's total memory, which ``per_process_memory_fraction`` is a fraction of (default:
    ``capacity_bytes``).
    """
    alloc = CachingAllocator(config, capacity_bytes=capacity_bytes, total_bytes=total_bytes)
    held: dict[int, int | None] = {}
    blocks: dict[int, int] | None = {} if record_blocks else None
    timeline: list[int] | None = [] if record_timeline else None
    peak_alloc = 0
    peak_index = -1
    reserved_at_peak = 0
    segments_at_peak = 0
    peak_reserved = 0
    peak_reserved_index = -1
    oom: OutOfMemory | None = None
    malloc = alloc.malloc
    free = alloc.free
    index = -1
    for index, (kind, key, size) in enumerate(events):
        if kind == 1:
            if key in held:
                raise BadInputError(f"event {index}: key {key} allocated twice without a free.")
            if size < 0:
                raise BadInputError(f"event {index}: negative allocation size {size}.")
            if size == 0:
                held[key] = None
            else:
                try:
                    block_id = malloc(size)
                except AllocatorOutOfMemoryError as e:
                    oom = replace(e.oom, event_index=index)
                    break
                held[key] = block_id
                if blocks is not None:
                    blocks[key] = alloc._live[block_id].size
                if alloc._allocated > peak_alloc:
                    peak_alloc = alloc._allocated
                    peak_index = index
                    reserved_at_peak = alloc._reserved
                    segments_at_peak = alloc.num_segments
        elif kind == -1:
            if key not in held:
                raise BadInputError(f"event {index}: free of key {key} that is not allocated.")
            held_id = held.pop(key)
            if held_id is not None:
                free(held_id)
        else:
            raise BadInputError(f"event {index}: kind must be +1 or -1, got {kind!r}.")
        if alloc._peak_reserved > peak_reserved:
            peak_reserved = alloc._peak_reserved
            peak_reserved_index = index
        if timeline is not None:
            timeline.append(alloc._reserved)
    if oom is not None:
        if alloc._peak_reserved > peak_reserved:  # reserved grew during the failed malloc
            peak_reserved = alloc._peak_reserved
            peak_reserved_index = oom.event_index
        if timeline is not None:
            timeline.append(alloc._reserved)
    return AllocatorResult(
        peak_allocated_bytes=peak_alloc,
        peak_reserved_bytes=peak_reserved,
        reserved_at_peak_allocated_bytes=reserved_at_peak,
        peak_index=peak_index,
        peak_reserved_index=peak_reserved_index,
        final_allocated_bytes=alloc.allocated,
        final_reserved_bytes=alloc.reserved,
        num_segments_at_peak=segments_at_peak,
        oom=oom,
        reserved_timeline=tuple(timeline) if timeline is not None else None,
        block_bytes=blocks,
    )


#: Runs kept by `shared_runs` (least recently used dropped first). Each is kept compact (its
#: block sizes as two arrays, ~16 bytes an allocation): about 50 MB at most for a 7B model.
SHARED_RUNS_KEPT = 256

#: Digest -> the run without its block sizes, and those as (storage keys, sizes) arrays.
_shared: OrderedDict[bytes, tuple[AllocatorResult, tuple[array, array] | None]] | None = None


@contextlib.contextmanager
def shared_runs() -> Iterator[None]:
    """Within the block, `simulate_shared` reads back runs it made already (see the module
    docstring); they are dropped when the outermost block ends."""
    global _shared
    if _shared is not None:
        yield
        return
    _shared = OrderedDict()
    try:
        yield
    finally:
        _shared = None


def simulate_shared(
    events: list[tuple[int, int, int]],
    *,
    config: AllocatorConfig = AllocatorConfig(),  # noqa: B008 (frozen, immutable)
    capacity_bytes: int | None = None,
    total_bytes: int | None = None,
    record_blocks: bool = False,
) -> AllocatorResult:
    """`simulate`; within `shared_runs()`, the result of an earlier call with the same events
    and the same settings when there is one (the same values, `block_bytes` a new dict)."""
    key = None if _shared is None else _run_key(events, config, capacity_bytes, total_bytes,
                                                  record_blocks)  # fmt: skip
    if _shared is not None and key is not None and key in _shared:
        _shared.move_to_end(key)
        compact, blocks = _shared[key]
        if blocks is None:
            return compact
        return replace(compact, block_bytes=dict(zip(*blocks, strict=True)))
    result = simulate(events, config=config, capacity_bytes=capacity_bytes,
                      total_bytes=total_bytes, record_blocks=record_blocks)  # fmt: skip
    if _shared is not None and key is not None:
        held = result.block_bytes
        blocks = None if held is None else (array("q", held), array("q", held.values()))
        _shared[key] = (replace(result, block_bytes=None), blocks)
        if len(_shared) > SHARED_RUNS_KEPT:
            _shared.popitem(last=False)
    return result


def _run_key(
    events: list[tuple[int, int, int]], config: AllocatorConfig, capacity_bytes: int | None,
    total_bytes: int | None, record_blocks: bool,
) -> bytes | None:  # fmt: skip
    """A digest of the stream and of what else changes its run; None for a stream marshal does
    not take (numbers of other types): it is replayed, not shared."""
    fraction = config.per_process_memory_fraction
    # The device's total only matters through a memory fraction below 1 (CachingAllocator).
    total = total_bytes if fraction is not None and fraction < 1.0 else None
    try:
        # Version 2 writes every value, never a back-reference: equal streams, equal bytes.
        stream = marshal.dumps(events, 2)
    except ValueError:
        return None
    digest = hashlib.blake2b(repr((config, capacity_bytes, total, record_blocks)).encode())
    digest.update(stream)
    return digest.digest()
