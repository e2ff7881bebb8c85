"""A simulator of PyTorch's native CUDA caching allocator (``CUDACachingAllocator.cpp``).

`CachingAllocator` serves mallocs and frees as the C++ allocator does;
`memfit.cuda.allocator_replay` replays a stream of allocate/free events through it and reports
what ``torch.cuda`` would report: ``max_memory_allocated`` (sum of *rounded block* sizes),
``max_memory_reserved`` (sum of cudaMalloc'ed segments / mapped pages), fragmentation, and the
first allocation that would raise ``torch.OutOfMemoryError`` under a given device capacity.
Behaviour was read from the PyTorch source (2.5 - 2.13: ``DeviceCachingAllocator`` in
``c10/cuda/CUDACachingAllocator.cpp``, constants and config parsing in
``c10/core/AllocatorConfig.*``); the code is our own. Comments name the C++ function each rule
comes from.

Modelled
--------
* ``round_size``: 512-byte rounding, ``roundup_power2_divisions`` (single value or per
  power-of-two interval).
* Two pools: small (rounded size <= 1 MiB, 2 MiB segments) and large;
  ``get_allocation_size``: 1-10 MiB requests get a 20 MiB segment (``large_segment_size``),
  larger ones a segment of their size rounded up to 2 MiB.
* ``get_free_block``: best fit = smallest free block >= size in (size, address) order,
  newest segment lowest (``_CUDA_MALLOC_TOP``); ``max_split_size`` (oversize blocks not
  given to smaller requests, and given to larger requests only if smaller than request +
  ``max_non_split_rounding_size``, 20 MiB).
* ``should_split`` / ``alloc_found_block``: small pool splits if the rest is >= 512 B,
  large pool if request < max_split_size and the rest is > 1 MiB; with expandable
  segments both pools split at >= 512 B. A block that is not split is handed out whole,
  and the whole block counts as allocated.
* ``free_block`` / ``try_merge_blocks``: a freed block merges with free neighbours of its
  segment.
* ``malloc``'s slow path: garbage collection (``garbage_collect_cached_blocks``, only with
  a per-process memory fraction, as in PyTorch), ``alloc_block`` (cudaMalloc; fails if it
  would exceed the capacity or the fraction), ``release_available_cached_blocks`` (only
  with max_split_size), ``release_cached_blocks`` (free every unsplit cached segment,
  unmap free pages of expandable segments), retry, then OOM with PyTorch's message.
* ``expandable_segments:True``: one growing virtual segment per pool, mapped in pages of
  2 MiB (small pool) or 20 MiB (large pool, ``large_segment_size``); only the pages
  needed for the rounded request are mapped (``try_allocate_expandable_block``,
  ``map_block``); best fit prefers blocks not at the growing end (``get_free_block``);
  ``release_cached_blocks`` unmaps whole free pages (``unmap_block``).
* ``empty_cache`` (= ``release_cached_blocks``).
* ``per_process_memory_fraction`` (``setMemoryFraction``): allowed = fraction * the
  device total (``total_bytes``, default ``capacity_bytes``); a fraction below 1 caps
  cudaMalloc and switches on GC. 1.0 sets no cap and no GC (PyTorch >= 2.10; 2.5-2.9
  turned GC on for 1.0 too).

Not modelled
------------
* Multiple streams (everything is on one stream), ``record_stream`` and the CUDA events
  that delay reuse of blocks used on other streams.
* CUDA graph private pools, ``torch.cuda.MemPool``, ``use_on_oom`` pools.
* Free-memory callbacks, IPC, ``backend:cudaMallocAsync``, pinned host memory.
* Memory outside the allocator (CUDA context, cuBLAS/NCCL workspaces, other processes):
  pass a ``capacity_bytes`` that already excludes it.
* Real addresses (cudaMalloc ranges come mostly, not strictly, top-down), cudaMalloc's
  granularity, driver-side fragmentation: cudaMalloc succeeds iff reserved + size <= capacity.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from memfit.cuda.allocator_config import (
    K_MIN_BLOCK_SIZE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    AllocatorConfig,
)
from memfit.cuda.allocator_oom import AllocatorOutOfMemoryError, OutOfMemory
from memfit.errors import BadInputError

__all__ = ["CachingAllocator"]

# cudaMalloc'ed segments go down from here, newest lowest, as in the H200 traces (see
# tests/cuda/test_allocator_traces.py); expandable ones up from 2**32 (one per pool).
_CUDA_MALLOC_TOP = 1 << 62

# Address space of an expandable segment when no capacity is known (PyTorch reserves
# 1 1/8 of the GPU's memory; only its size relative to real blocks matters here).
_DEFAULT_ADDRESS_SPACE = 1 << 46


class _Block:
    """A range of a segment (CUDACachingAllocator.cpp: struct Block)."""

    __slots__ = ("addr", "allocated", "gc_base", "mapped", "next", "pool", "prev", "seg", "size")

    def __init__(self, size: int, addr: int, pool: _Pool, seg: _ExpSegment | None) -> None:
        self.size = size
        self.addr = addr
        self.pool = pool
        self.seg = seg  # expandable segment, or None for a cudaMalloc segment
        self.allocated = False
        self.mapped = True
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.gc_base = 0


class _ExpSegment:
    """Virtual address range of an expandable segment (struct ExpandableSegment)."""

    __slots__ = ("base", "page", "ranges")

    def __init__(self, base: int, page: int) -> None:
        self.base = base
        self.page = page
        self.ranges = 0  # number of contiguous mapped ranges (reported as segments)


class _Pool:
    """Free blocks of one pool, sorted by (size, address) (struct BlockPool)."""

    __slots__ = ("free", "gc_calls", "keys", "small", "unmapped", "unmapped_addrs")

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int]] = []  # sorted (size, addr) of free mapped blocks
        self.free: dict[int, _Block] = {}  # addr -> free mapped block
        self.unmapped_addrs: list[int] = []  # sorted addresses of unmapped blocks
        self.unmapped: dict[int, _Block] = {}
        self.gc_calls = 0  # get_free_blocks_call_count

    def insert(self, b: _Block) -> None:  # BlockPool::insert_into_blocks
        b.gc_base = self.gc_calls
        insort(self.keys, (b.size, b.addr))
        self.free[b.addr] = b

    def remove(self, b: _Block) -> None:
        keys = self.keys
        del keys[bisect_left(keys, (b.size, b.addr))]
        del self.free[b.addr]

    def add_unmapped(self, b: _Block) -> None:
        insort(self.unmapped_addrs, b.addr)
        self.unmapped[b.addr] = b

    def remove_unmapped(self, b: _Block) -> None:
        addrs = self.unmapped_addrs
        del addrs[bisect_left(addrs, b.addr)]
        del self.unmapped[b.addr]


class CachingAllocator:
    """One device's caching allocator on one stream (class DeviceCachingAllocator).

    ``malloc(size)`` returns a block id (the block's simulated address) or raises
    :class:`AllocatorOutOfMemoryError`; ``free(block_id)`` returns it to the cache.
    ``capacity_bytes`` is the memory cudaMalloc may use (None: unlimited); ``total_bytes``
    the device's total, which ``per_process_memory_fraction`` is a fraction of (default:
    ``capacity_bytes``).
    """

    def __init__(
        self,
        config: AllocatorConfig | None = None,
        *,
        capacity_bytes: int | None = None,
        total_bytes: int | None = None,
    ) -> None:
        self.config = cfg = config if config is not None else AllocatorConfig()
        if capacity_bytes is not None and capacity_bytes < 0:
            raise BadInputError(f"capacity_bytes must be >= 0, got {capacity_bytes}.")
        self.capacity = capacity_bytes
        self._small = _Pool(True)
        self._large = _Pool(False)
        self._live: dict[int, _Block] = {}
        self._next_addr = 1 << 32  # expandable segments (upward)
        self._malloc_addr = _CUDA_MALLOC_TOP  # cudaMalloc'ed segments (downward)
        self._allocated = 0
        self._reserved = 0  # total_allocated_memory
        self._peak_allocated = 0
        self._peak_reserved = 0
        self._plain_segments = 0  # cudaMalloc'ed segments
        self._exp_segments: list[_ExpSegment] = []
        self._calls = 0
        self._expandable = cfg.expandable_segments
        self._mss = cfg.max_split_bytes
        self._mns = cfg.max_non_split_rounding_bytes
        self._has_mss = cfg.max_split_size is not None
        fraction = cfg.per_process_memory_fraction
        # setMemoryFraction: allowed_memory_maximum = fraction * device total, set only for a
        # fraction below 1 (PyTorch >= 2.10; before, 1.0 also set it and so enabled GC).
        self._allowed: int | None = None
        if fraction is not None and fraction < 1.0:
            total = total_bytes if total_bytes is not None else capacity_bytes
            if total is None:
                raise BadInputError(
                    "per_process_memory_fraction needs the device's total memory: pass "
                    "total_bytes (or capacity_bytes)."
                )
            self._allowed = int(fraction * total)
        gc = cfg.garbage_collection_threshold
        # malloc / get_free_block: GC only runs when set_fraction && threshold > 0.
        self._gc_on = self._allowed is not None and gc is not None
        self._address_space = (
            capacity_bytes + capacity_bytes // 8 if capacity_bytes else _DEFAULT_ADDRESS_SPACE
        )

    # ---- public state ---------------------------------------------------------------------

    @property
    def allocated(self) -> int:
        """Sum of the sizes of allocated blocks (``memory_allocated``)."""
        return self._allocated

    @property
    def reserved(self) -> int:
        """Memory held from the device (``memory_reserved``)."""
        return self._reserved

    @property
    def peak_allocated(self) -> int:
        return self._peak_allocated

    @property
    def peak_reserved(self) -> int:
        return self._peak_reserved

    @property
    def num_segments(self) -> int:
        """cudaMalloc segments plus contiguous mapped ranges of expandable segments."""
        return self._plain_segments + sum(s.ranges for s in self._exp_segments)

    def segments(self) -> list[tuple[int, list[tuple[int, bool]]]]:
        """Segments in address order as (size, [(block_size, allocated), ...]).

        Like ``torch.cuda.memory_snapshot``, each contiguous mapped range of an expandable
        segment is reported as one segment.
        """
        blocks: list[_Block] = list(self._live.values())
        for pool in (self._small, self._large):
            blocks.extend(pool.free.values())
            blocks.extend(pool.unmapped.values())
        out: list[tuple[int, tuple[int, list[tuple[int, bool]]]]] = []
        for head in blocks:
            if not head.mapped or (head.prev is not None and head.prev.mapped):
                continue
            items: list[tuple[int, bool]] = []
            b: _Block | None = head
            while b is not None and b.mapped:
                items.append((b.size, b.allocated))
                b = b.next
            out.append((head.addr, (sum(s for s, _ in items), items)))
        out.sort(key=lambda t: t[0])
        return [seg for _, seg in out]

    # ---- malloc ---------------------------------------------------------------------------

    def malloc(self, size: int) -> int:
        """Allocate ``size`` bytes (DeviceCachingAllocator::malloc); returns the block id."""
        index = self._calls
        self._calls += 1
        cfg = self.config
        orig = size
        size = cfg.round_size(size)
        pool = self._small if size <= K_SMALL_SIZE else self._large  # get_pool
        alloc_size = cfg.allocation_size(size)
        block = self._get_free_block(pool, size)
        if block is None:
            if self._gc_on:
                self._garbage_collect()
            block = self._alloc_block(pool, size, alloc_size)
            if block is None and self._release_available_cached_blocks(pool, size):
                block = self._alloc_block(pool, size, alloc_size)
            if block is None:
                self._release_cached_blocks()
                block = self._alloc_block(pool, size, alloc_size)
            if block is None:
                cap = self.capacity if self.capacity is not None else 0
                raise AllocatorOutOfMemoryError(
                    OutOfMemory(
                        event_index=index,
                        requested_bytes=orig,
                        alloc_bytes=alloc_size,
                        allocated_bytes=self._allocated,
                        reserved_bytes=self._reserved,
                        capacity_bytes=cap,
                        free_bytes=max(cap - self._reserved, 0),
                        allowed_bytes=self._allowed,
                    )
                )
        # alloc_found_block, with should_split deciding whether to split off the rest
        remaining = block.size - size
        if pool.small or self._expandable:
            split = remaining >= K_MIN_BLOCK_SIZE
        else:
            split = size < self._mss and remaining > K_SMALL_SIZE
        if split:
            rest = block
            block = _Block(size, rest.addr, pool, rest.seg)
            prev = rest.prev
            block.prev = prev
            if prev is not None:
                prev.next = block
            block.next = rest
            rest.prev = block
            rest.addr += size
            rest.size = remaining
            pool.insert(rest)
        block.allocated = True
        self._live[block.addr] = block
        self._allocated += block.size
        if self._allocated > self._peak_allocated:
            self._peak_allocated = self._allocated
        return block.addr

    def _get_free_block(self, pool: _Pool, size: int) -> _Block | None:
        """CUDACachingAllocator.cpp: get_free_block (best fit by (size, address))."""
        if self._gc_on:
            pool.gc_calls += 1
        keys = pool.keys
        i = bisect_left(keys, (size, -1))
        n = len(keys)
        if i == n:
            return None
        free = pool.free
        b = free[keys[i][1]]
        if b.seg is not None:
            # A block at the growing end of an expandable segment counts with the unmapped
            # space after it; prefer a later (bigger) block whose expandable size is smaller.
            cur = _expandable_size(b)
            while i + 1 < n and b.seg is not None:
                nb = free[keys[i + 1][1]]
                nsz = _expandable_size(nb)
                if nsz >= cur:
                    break
                i += 1
                b, cur = nb, nsz
        mss = self._mss
        if size < mss and b.size >= mss:  # "Do not return an oversized block for a large request"
            return None
        if size >= mss and b.size >= size + self._mns:  # oversize rounding limit
            return None
        del keys[i]
        del free[b.addr]
        return b

    def _alloc_block(self, pool: _Pool, size: int, alloc_size: int) -> _Block | None:
        """CUDACachingAllocator.cpp: alloc_block (cudaMalloc or expandable mapping)."""
        if self._allowed is not None and self._reserved + alloc_size > self._allowed:
            return None
        if self._expandable:
            return self._try_allocate_expandable_block(pool, size)
        if self.capacity is not None and self._reserved + alloc_size > self.capacity:
            return None
        self._malloc_addr -= alloc_size
        b = _Block(alloc_size, self._malloc_addr, pool, None)
        self._plain_segments += 1
        self._add_reserved(alloc_size)
        return b

    def _add_reserved(self, n: int) -> None:
        self._reserved += n
        if self._reserved > self._peak_reserved:
            self._peak_reserved = self._reserved

    def _release_block(self, b: _Block) -> None:
        """CUDACachingAllocator.cpp: release_block (cudaFree of an unsplit cached segment)."""
        b.pool.remove(b)
        self._reserved -= b.size
        self._plain_segments -= 1

    def _release_available_cached_blocks(self, pool: _Pool, size: int) -> bool:
        """CUDACachingAllocator.cpp: release_available_cached_blocks (free oversize blocks)."""
        if not self._has_mss:
            return False
        mss = self._mss
        key = max(size, mss)
        keys = pool.keys
        i = bisect_left(keys, (key, -1))
        if i < len(keys):
            b = pool.free[keys[i][1]]
            if not _releasable(b):
                return False
            self._release_block(b)
            return True
        if i == 0:
            return False
        released = 0
        i -= 1
        while released < key and keys[i][0] >= mss:
            b = pool.free[keys[i][1]]
            if _releasable(b):
                released += b.size
                self._release_block(b)
            if i == 0:
                break
            i -= 1
        return released >= key

    def _release_cached_blocks(self) -> None:
        """CUDACachingAllocator.cpp: release_cached_blocks / release_blocks."""
        for pool in (self._large, self._small):
            to_unmap: list[_Block] = []
            for _, addr in list(pool.keys):
                b = pool.free[addr]
                if b.seg is not None:
                    to_unmap.append(b)
                elif b.prev is None and b.next is None:
                    self._release_block(b)
            for b in to_unmap:
                self._unmap_block(b)
                if b.prev is None and b.next is None:  # release_expandable_segment
                    pool.remove_unmapped(b)
                    self._exp_segments.remove(b.seg)  # type: ignore[arg-type]

    def _garbage_collect(self) -> None:
        """CUDACachingAllocator.cpp: garbage_collect_cached_blocks."""
        assert self._allowed is not None
        threshold = self.config.garbage_collection_threshold
        assert threshold is not None
        gc_threshold = int(threshold * self._allowed)
        if self._reserved <= gc_threshold:
            return
        target = self._reserved - gc_threshold
        pool = self._large
        calls = pool.gc_calls

        def freeable() -> list[_Block]:
            blocks = (pool.free[a] for _, a in pool.keys)
            return [b for b in blocks if b.prev is None and b.next is None and b.seg is None]

        cands = freeable()
        if not cands:
            return
        total_age = sum(calls - b.gc_base for b in cands)
        count = len(cands)
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            for b in freeable():
                age = calls - b.gc_base
                if age >= age_threshold:
                    freed = True
                    reclaimed += b.size
                    total_age -= age
                    count -= 1
                    self._release_block(b)

    # ---- expandable segments --------------------------------------------------------------

    def _try_allocate_expandable_block(self, pool: _Pool, size: int) -> _Block | None:
        """CUDACachingAllocator.cpp: try_allocate_expandable_block."""
        c = self._find_expandable_block(pool, size)
        if not c.mapped and not self._map_block(c, min(c.size, size)):
            return None
        while c.size < size:
            nxt = c.next
            assert nxt is not None and not nxt.mapped
            if not self._map_block(nxt, min(size - c.size, nxt.size)):
                return None
            c = nxt  # nxt absorbed c when it merged with its free prev
        pool.remove(c)
        return c

    def _find_expandable_block(self, pool: _Pool, size: int) -> _Block:
        """CUDACachingAllocator.cpp: find_expandable_block (lowest address that fits)."""
        for addr in pool.unmapped_addrs:
            c = pool.unmapped[addr]
            if c.prev is not None and not c.prev.allocated:
                c = c.prev
            total = 0
            b: _Block | None = c
            while total < size and b is not None and not b.allocated:
                total += b.size
                b = b.next
            if total >= size:
                return c
        page = K_SMALL_BUFFER if pool.small else self.config.large_segment_size
        seg = _ExpSegment(self._next_addr, page)
        n_pages = -(-self._address_space // page)
        self._next_addr += n_pages * page
        self._exp_segments.append(seg)
        cand = _Block(n_pages * page, seg.base, pool, seg)
        cand.mapped = False
        pool.add_unmapped(cand)
        return cand

    def _map_block(self, to_map: _Block, size: int) -> bool:
        """CUDACachingAllocator.cpp: map_block / ExpandableSegment::map (whole pages)."""
        seg = to_map.seg
        assert seg is not None
        page = seg.page
        mapped = -(-size // page) * page
        if self.capacity is not None and self._reserved + mapped > self.capacity:
            return False  # cuMemCreate fails; pages created in this call are released
        pool = to_map.pool
        pool.remove_unmapped(to_map)
        to_map.mapped = True
        if mapped < to_map.size:
            rest = _Block(to_map.size - mapped, to_map.addr + mapped, pool, seg)
            rest.mapped = False
            rest.prev = to_map
            rest.next = to_map.next
            if to_map.next is not None:
                to_map.next.prev = rest
            to_map.next = rest
            pool.add_unmapped(rest)
            to_map.size = mapped
        seg.ranges += 1 - _is_mapped(to_map.prev) - _is_mapped(to_map.next)
        self._merge(to_map, to_map.prev)
        self._merge(to_map, to_map.next)
        pool.insert(to_map)
        self._add_reserved(mapped)
        return True

    def _unmap_block(self, b: _Block) -> None:
        """CUDACachingAllocator.cpp: unmap_block / ExpandableSegment::unmap (whole pages)."""
        seg = b.seg
        assert seg is not None
        page = seg.page
        off = b.addr - seg.base
        first = -(-off // page)
        last = (off + b.size) // page
        if first >= last:
            return
        pool = b.pool
        pool.remove(b)
        start = seg.base + first * page
        length = (last - first) * page
        before = start - b.addr
        after = b.size - before - length
        if before > 0:
            bf = _Block(before, b.addr, pool, seg)
            bf.prev = b.prev
            if b.prev is not None:
                b.prev.next = bf
            bf.next = b
            b.prev = bf
            pool.insert(bf)
        if after > 0:
            af = _Block(after, start + length, pool, seg)
            af.next = b.next
            if b.next is not None:
                b.next.prev = af
            af.prev = b
            b.next = af
            pool.insert(af)
        b.addr = start
        b.size = length
        b.mapped = False
        seg.ranges += _is_mapped(b.prev) + _is_mapped(b.next) - 1
        self._merge(b, b.prev)
        self._merge(b, b.next)
        pool.add_unmapped(b)
        self._reserved -= length

    # ---- free -----------------------------------------------------------------------------

    def free(self, block_id: int) -> None:
        """Return a block to the cache (DeviceCachingAllocator::free / free_block)."""
        self._calls += 1
        b = self._live.pop(block_id, None)
        if b is None:
            raise BadInputError(f"free of unknown block id {block_id}.")
        b.allocated = False
        self._allocated -= b.size
        self._merge(b, b.prev)
        self._merge(b, b.next)
        b.pool.insert(b)

    def _merge(self, dst: _Block, src: _Block | None) -> None:
        """CUDACachingAllocator.cpp: try_merge_blocks (src must be free, same mapping)."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        pool = src.pool
        if src.mapped:
            pool.remove(src)
        else:
            pool.remove_unmapped(src)
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if src.prev is not None:
                src.prev.next = dst
        else:
            dst.next = src.next
            if src.next is not None:
                src.next.prev = dst
        dst.size += src.size

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()`` (emptyCache -> release_cached_blocks)."""
        self._release_cached_blocks()


def _expandable_size(b: _Block) -> int:
    nxt = b.next
    return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)


def _is_mapped(b: _Block | None) -> int:
    return 1 if b is not None and b.mapped else 0


def _releasable(b: _Block) -> bool:
    # release_block may only cudaFree a whole cudaMalloc segment.
    return b.seg is None and b.prev is None and b.next is None
