"""Tests of the CUDA caching allocator simulator.

No GPU is available where these were written: every expected number is derived by hand
from the rules read in PyTorch's c10/cuda/CUDACachingAllocator.cpp (function named in
the comment) and c10/core/AllocatorConfig.{h,cpp}.
"""

from __future__ import annotations

import random
import time

import pytest

from memfit.cuda.allocator import CachingAllocator
from memfit.cuda.allocator_config import AllocatorConfig, format_size
from memfit.cuda.allocator_oom import AllocatorOutOfMemoryError
from memfit.cuda.allocator_replay import simulate
from memfit.errors import BadInputError

KiB = 1024
MiB = 1024 * 1024
GiB = 1024 * MiB


# ---- round_size -------------------------------------------------------------------------


def test_round_size_512():
    cfg = AllocatorConfig()
    # round_size: size < kMinBlockSize (512) -> 512; else round up to a multiple of 512.
    assert cfg.round_size(1) == 512
    assert cfg.round_size(512) == 512
    assert cfg.round_size(513) == 1024
    assert cfg.round_size(3 * MiB + 1) == 3 * MiB + 512


def test_round_size_power2_divisions():
    cfg = AllocatorConfig(roundup_power2_divisions=4)
    # 5 MiB + 1 lies in [4, 8) MiB; 4 divisions -> steps of 1 MiB -> 6 MiB
    # (roundup_power2_next_division).
    assert cfg.round_size(5 * MiB + 1) == 6 * MiB
    # powers of two are kept as they are
    assert cfg.round_size(4 * MiB) == 4 * MiB
    # 1200 B is not > 512 * 4 = 2048, so round_size falls back to 512-rounding: 1536
    assert cfg.round_size(1200) == 1536
    # 3000 B > 2048: in [2048, 4096) with steps of 512 -> 3072
    assert cfg.round_size(3000) == 3072


def test_round_size_power2_divisions_per_interval():
    cfg = AllocatorConfig.from_string("roundup_power2_divisions:[256:4,>:1]")
    # parseRoundUpPower2Divisions: "256:4" sets interval index log2(256) = 8 and, being the
    # first entry, every index below it; ">:1" sets indices 9..15 to 1 (no rounding).
    assert cfg.roundup_power2_divisions == (4,) * 9 + (1,) * 7
    # 300 MiB: index floor(log2(300 MiB)) - 20 = 8 -> 4 divisions of [256, 512) -> 320 MiB
    assert cfg.round_size(300 * MiB) == 320 * MiB
    # 100 MiB + 1: index 6 -> 4 divisions of [64, 128) MiB, steps of 16 -> 112 MiB
    assert cfg.round_size(100 * MiB + 1) == 112 * MiB
    # 600 MiB: index 9 -> 1 division -> plain 512-rounding
    assert cfg.round_size(600 * MiB + 1) == 600 * MiB + 512


def test_divisions_list_matches_pytorch_unit_test():
    # The expectations of PyTorch's own AllocatorConfig C++ test for this string: the
    # interval of "N:" starts at N MiB (index log2(N)), and the first entry also covers
    # every smaller size.
    cfg = AllocatorConfig.from_string(
        "roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]"
    )
    expected = {32: 8, 64: 8, 128: 2, 256: 4, 512: 2, 1024: 4, 2048: 1, 4096: 1, 8192: 1}
    for mib, divisions in expected.items():
        assert cfg.divisions_for(mib * MiB) == divisions, mib


# ---- segment sizes (get_allocation_size) --------------------------------------------------


def test_small_alloc_reserves_2mib_segment():
    a = CachingAllocator()
    a.malloc(1 * KiB)
    # 1 KiB <= kSmallSize -> small pool, kSmallBuffer (2 MiB) segment, split (rest >= 512).
    assert a.allocated == 1 * KiB
    assert a.reserved == 2 * MiB
    assert a.segments() == [(2 * MiB, [(1 * KiB, True), (2 * MiB - 1 * KiB, False)])]


def test_1b_alloc_counts_512():
    a = CachingAllocator()
    a.malloc(1)
    assert a.allocated == 512  # memory_allocated counts the rounded block
    assert a.reserved == 2 * MiB


def test_3mib_alloc_reserves_20mib():
    a = CachingAllocator()
    a.malloc(3 * MiB)
    # 1 MiB < 3 MiB < kMinLargeAlloc (10 MiB) -> kLargeBuffer (20 MiB) segment; the rest
    # 17 MiB > kSmallSize so should_split splits it off.
    assert a.allocated == 3 * MiB
    assert a.reserved == 20 * MiB
    assert a.segments() == [(20 * MiB, [(3 * MiB, True), (17 * MiB, False)])]


def test_12mib_alloc_reserves_exactly_12mib():
    a = CachingAllocator()
    a.malloc(12 * MiB)
    # >= 10 MiB -> own segment rounded up to kRoundLarge (2 MiB): 12 MiB, nothing left.
    assert a.allocated == 12 * MiB
    assert a.reserved == 12 * MiB


def test_11mib_plus_1_rounds_to_12mib_unsplit():
    a = CachingAllocator()
    a.malloc(11 * MiB + 1)
    # round_size -> 11 MiB + 512; segment rounded to 2 MiB -> 12 MiB. The rest,
    # 1 MiB - 512, is not > kSmallSize, so should_split says no and the whole 12 MiB
    # block is handed out: allocated counts 12 MiB.
    assert a.reserved == 12 * MiB
    assert a.allocated == 12 * MiB
    assert a.segments() == [(12 * MiB, [(12 * MiB, True)])]


# ---- splitting, reuse, merging ------------------------------------------------------------


def test_split_and_reuse_of_cached_segment():
    a = CachingAllocator()
    x = a.malloc(3 * MiB)  # 20 MiB segment: [3 alloc][17 free]
    a.free(x)  # merges back into one free 20 MiB block
    assert a.segments() == [(20 * MiB, [(20 * MiB, False)])]
    a.malloc(int(1.5 * MiB))
    # 1.5 MiB > 1 MiB -> large pool; best fit is the cached 20 MiB block, split
    # (rest 18.5 MiB > 1 MiB). No new cudaMalloc: reserved stays 20 MiB.
    assert a.reserved == 20 * MiB
    assert a.allocated == int(1.5 * MiB)
    assert a.segments() == [(20 * MiB, [(int(1.5 * MiB), True), (int(18.5 * MiB), False)])]


def test_merge_adjacent_free_blocks_and_empty_cache():
    a = CachingAllocator()
    x = a.malloc(3 * MiB)  # [x 3][17 free]
    y = a.malloc(3 * MiB)  # [x 3][y 3][14 free]
    z = a.malloc(3 * MiB)  # [x 3][y 3][z 3][11 free]
    assert a.reserved == 20 * MiB
    a.free(x)  # x has no free neighbour
    a.free(z)  # z merges with the 11 MiB tail
    assert a.segments() == [(20 * MiB, [(3 * MiB, False), (3 * MiB, True), (14 * MiB, False)])]
    a.free(y)  # y merges with both neighbours (free_block -> try_merge_blocks)
    assert a.segments() == [(20 * MiB, [(20 * MiB, False)])]
    assert a.allocated == 0
    a.empty_cache()  # release_cached_blocks frees the unsplit segment
    assert a.reserved == 0
    assert a.segments() == []


def test_small_pool_packs_requests_into_one_segment():
    a = CachingAllocator()
    for _ in range(4):
        a.malloc(512 * KiB)
    # 4 x 512 KiB fill one 2 MiB small segment exactly (the last one takes the whole rest).
    assert a.reserved == 2 * MiB
    assert a.allocated == 2 * MiB
    a.malloc(1)  # no room left -> second 2 MiB segment
    assert a.reserved == 4 * MiB


def test_best_fit_picks_smallest_block():
    a = CachingAllocator()
    big = a.malloc(40 * MiB)
    small = a.malloc(14 * MiB)
    a.free(big)
    a.free(small)  # cached: 14 MiB and 40 MiB segments
    a.malloc(13 * MiB)
    # best fit for 13 MiB is the 14 MiB block; rest 1 MiB is not > 1 MiB -> not split.
    assert a.allocated == 14 * MiB
    assert sorted(a.segments()) == [(14 * MiB, [(14 * MiB, True)]), (40 * MiB, [(40 * MiB, False)])]


def test_fragmentation_forces_new_segment():
    a = CachingAllocator()
    x = a.malloc(8 * MiB)  # segment 1 (20 MiB): [x 8][12 free]
    a.malloc(8 * MiB)  # segment 1: [x 8][y 8][4 free]
    a.malloc(8 * MiB)  # 4 MiB free is too small -> segment 2 (20 MiB): [z 8][12 free]
    a.free(x)  # free blocks: 8 + 4 (segment 1), 12 (segment 2) = 24 MiB cached
    assert a.reserved - a.allocated == 24 * MiB
    a.malloc(14 * MiB)
    # No single free block >= 14 MiB although 24 MiB is free: a new 14 MiB segment.
    assert a.reserved == 20 * MiB + 20 * MiB + 14 * MiB


# ---- out of memory, free-and-retry ---------------------------------------------------------


def test_free_and_retry_releases_cached_segments():
    a = CachingAllocator(capacity_bytes=40 * MiB)
    x = a.malloc(12 * MiB)
    a.free(x)  # 12 MiB cached, reserved 12 MiB
    a.malloc(30 * MiB)
    # malloc: no cached block >= 30 MiB; cudaMalloc(30) fails (12 + 30 > 40);
    # release_cached_blocks frees the unsplit 12 MiB segment; the retry succeeds.
    assert a.reserved == 30 * MiB
    assert a.allocated == 30 * MiB
    assert a.peak_reserved == 30 * MiB


def test_simulate_free_and_retry_no_oom():
    events = [(1, 0, 12 * MiB), (-1, 0, 0), (1, 1, 30 * MiB)]
    r = simulate(events, capacity_bytes=40 * MiB, record_timeline=True)
    assert r.oom is None
    assert r.reserved_timeline == (12 * MiB, 12 * MiB, 30 * MiB)
    assert r.peak_reserved_bytes == 30 * MiB
    assert r.peak_reserved_index == 2
    assert r.peak_allocated_bytes == 30 * MiB
    assert r.peak_index == 2


def test_oom_exact_message():
    events = [
        (1, 0, 3 * MiB),  # 20 MiB segment; 3 MiB allocated
        (1, 1, 4 * MiB + 1),  # rounds to 4 MiB + 512, split from the same segment
        # 14 MiB > the 13 MiB - 512 left in the segment: needs its own 14 MiB segment,
        # 20 + 14 > 24 MiB, and nothing can be released (the segment is split).
        (1, 2, 14 * MiB),
    ]
    r = simulate(events, capacity_bytes=24 * MiB)
    oom = r.oom
    assert oom is not None
    assert oom.event_index == 2
    assert oom.requested_bytes == 14 * MiB
    assert oom.alloc_bytes == 14 * MiB
    # allocated = 3 MiB + 4 MiB + 512; reserved = 20 MiB; free = 24 - 20 = 4 MiB.
    assert oom.allocated_bytes == 7 * MiB + 512
    assert oom.reserved_bytes == 20 * MiB
    assert oom.free_bytes == 4 * MiB
    assert oom.capacity_bytes == 24 * MiB
    # reserved - allocated = 13 MiB - 512 = 12.9995 MiB -> "13.00 MiB" (format_size)
    expected = (
        "CUDA out of memory. Tried to allocate 14.00 MiB. GPU 0 has a total capacity of "
        "24.00 MiB of which 4.00 MiB is free. Of the allocated memory 7.00 MiB is allocated "
        "by PyTorch, and 13.00 MiB is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:"
        "True to avoid fragmentation.  See documentation for Memory Management  "
        "(https://docs.pytorch.org/docs/stable/notes/cuda.html"
        "#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
    )
    assert oom.message() == expected
    with_where = oom.message(op="aten::mm", module="model.layers.3.mlp", total_capacity_bytes=GiB)
    assert "GPU 0 has a total capacity of 1024.00 MiB of which 4.00 MiB is free." in with_where
    assert with_where.endswith(" (at op aten::mm in module model.layers.3.mlp)")
    # the simulation stops at the OOM; results are those before it
    assert r.peak_allocated_bytes == 7 * MiB + 512
    assert r.peak_index == 1
    assert r.final_reserved_bytes == 20 * MiB


def test_oom_message_uses_segment_size_for_small_and_medium_requests():
    # PyTorch reports get_allocation_size(): a 1 KiB request "tried to allocate" 2 MiB.
    a = CachingAllocator(capacity_bytes=1 * MiB)
    with pytest.raises(AllocatorOutOfMemoryError) as e:
        a.malloc(1 * KiB)
    assert e.value.oom.alloc_bytes == 2 * MiB
    assert "Tried to allocate 2.00 MiB." in str(e.value)
    # 1 MiB prints as "1024.00 KiB": format_size's bounds are inclusive
    assert "total capacity of 1024.00 KiB of which 1024.00 KiB is free" in str(e.value)


def test_format_size():
    assert format_size(0) == "0 bytes"
    assert format_size(1024) == "1024 bytes"
    assert format_size(1025) == "1.00 KiB"
    assert format_size(MiB) == "1024.00 KiB"
    assert format_size(GiB) == "1024.00 MiB"  # bounds are inclusive
    assert format_size(3 * GiB // 2) == "1.50 GiB"


def test_expandable_segments_avoid_fragmentation():
    # The fragmentation case of test_fragmentation_forces_new_segment under a 50 MiB GPU.
    events = [
        (1, 0, 8 * MiB),
        (1, 1, 8 * MiB),
        (1, 2, 8 * MiB),
        (-1, 0, 0),
        (1, 3, 14 * MiB),
    ]
    plain = simulate(events, capacity_bytes=50 * MiB)
    # Segments of 20 + 20 MiB are split (y, z live), nothing is releasable and 40 + 14 > 50.
    assert plain.oom is not None
    assert plain.oom.event_index == 4
    assert plain.oom.message().startswith(
        "CUDA out of memory. Tried to allocate 14.00 MiB. GPU 0 has a total capacity of "
        "50.00 MiB of which 10.00 MiB is free. Of the allocated memory 16.00 MiB is "
        "allocated by PyTorch, and 24.00 MiB is reserved by PyTorch but unallocated."
    )
    exp = simulate(
        events, capacity_bytes=50 * MiB, config=AllocatorConfig(expandable_segments=True)
    )
    # Expandable (large pool pages of 20 MiB): x maps one page [x 8][12]; y splits the
    # 12 -> [x][y][4]; z needs 4 more MiB at the end -> one more page: [x][y][z 8][16];
    # freeing x leaves [8 free][y][z][16 free]; 14 MiB fits in the 16 MiB tail.
    assert exp.oom is None
    assert exp.peak_reserved_bytes == 40 * MiB
    assert exp.final_reserved_bytes == 40 * MiB
    assert exp.num_segments_at_peak == 1


def test_expandable_maps_pages_for_the_request_only():
    a = CachingAllocator(AllocatorConfig(expandable_segments=True))
    a.malloc(1 * KiB)  # small pool: one 2 MiB page
    assert a.reserved == 2 * MiB
    a.malloc(30 * MiB)  # large pool: ceil(30 / 20) = 2 pages = 40 MiB
    assert a.reserved == 42 * MiB
    a.malloc(12 * MiB)  # 10 MiB are free at the end; 2 more needed -> one more page
    assert a.reserved == 62 * MiB
    assert a.allocated == 1 * KiB + 42 * MiB
    # one contiguous mapped range per pool, reported as one segment each
    assert a.segments() == [
        (2 * MiB, [(1 * KiB, True), (2 * MiB - 1 * KiB, False)]),
        (60 * MiB, [(30 * MiB, True), (12 * MiB, True), (18 * MiB, False)]),
    ]


def test_expandable_empty_cache_unmaps_free_pages():
    a = CachingAllocator(AllocatorConfig(expandable_segments=True))
    x = a.malloc(30 * MiB)  # pages 0-1 (40 MiB): [x 30][10]
    y = a.malloc(25 * MiB)  # 15 more MiB -> page 2: [x 30][y 25][5]
    assert a.reserved == 60 * MiB
    a.free(x)  # [30 free][y 25][5 free]
    a.empty_cache()
    # unmap_block unmaps only whole free pages: page 0 (0-20 MiB) is free, page 1
    # (20-40) holds the start of y, page 2 (40-60) holds its end. One page goes.
    assert a.reserved == 40 * MiB
    assert a.segments() == [(40 * MiB, [(10 * MiB, False), (25 * MiB, True), (5 * MiB, False)])]
    a.free(y)
    a.empty_cache()
    assert a.reserved == 0
    assert a.segments() == []


def test_expandable_oom_releases_free_pages_and_retries():
    cfg = AllocatorConfig(expandable_segments=True)
    # x maps 2 large pages (40 MiB); freed, they stay mapped. A 1 KiB small-pool request
    # needs a 2 MiB page: 40 + 2 > 41 MiB -> release_cached_blocks unmaps the 40 MiB.
    events = [(1, 0, 40 * MiB), (-1, 0, 0), (1, 1, 1 * KiB)]
    r = simulate(events, capacity_bytes=41 * MiB, config=cfg)
    assert r.oom is None
    assert r.final_reserved_bytes == 2 * MiB


# ---- max_split_size ----------------------------------------------------------------------


def test_max_split_size_prevents_split_of_oversize_blocks():
    cfg = AllocatorConfig(max_split_size=64 * MiB)
    a = CachingAllocator(cfg)
    x = a.malloc(100 * MiB)
    a.free(x)  # cached 100 MiB block, oversize (>= 64 MiB)
    a.malloc(30 * MiB)
    # get_free_block: a 30 MiB request (< max_split_size) may not take an oversize
    # block -> new 30 MiB segment.
    assert a.reserved == 130 * MiB
    a.malloc(90 * MiB)
    # 90 MiB >= max_split_size: the 100 MiB block is within 90 + 20 MiB
    # (max_non_split_rounding_size) -> reused whole, not split.
    assert a.reserved == 130 * MiB
    assert a.allocated == 30 * MiB + 100 * MiB

    # Without max_split_size the 30 MiB request splits the cached 100 MiB block.
    b = CachingAllocator()
    b.free(b.malloc(100 * MiB))
    b.malloc(30 * MiB)
    assert b.reserved == 100 * MiB
    assert b.segments() == [(100 * MiB, [(30 * MiB, True), (70 * MiB, False)])]


def test_max_split_size_rounding_limit():
    a = CachingAllocator(AllocatorConfig(max_split_size=64 * MiB))
    a.free(a.malloc(100 * MiB))
    a.malloc(70 * MiB)
    # 100 >= 70 + 20: the oversize block would waste too much -> new 70 MiB segment.
    assert a.reserved == 170 * MiB


def test_release_available_cached_blocks():
    cfg = AllocatorConfig(max_split_size=64 * MiB)
    a = CachingAllocator(cfg, capacity_bytes=150 * MiB)
    a.free(a.malloc(100 * MiB))
    a.free(a.malloc(10 * MiB))  # cached: 10 MiB and 100 MiB segments
    a.malloc(80 * MiB)
    # 100 >= 80 + 20 -> not reused; 110 + 80 > 150 -> release_available_cached_blocks
    # frees the smallest oversize block >= 80 MiB (the 100 MiB one) only; the retry fits.
    assert a.reserved == 10 * MiB + 80 * MiB


# ---- garbage collection ------------------------------------------------------------------


def test_garbage_collection_needs_memory_fraction():
    events = [(1, 0, 30 * MiB), (-1, 0, 0), (1, 1, 40 * MiB), (-1, 1, 0), (1, 2, 50 * MiB)]
    gc = AllocatorConfig(per_process_memory_fraction=0.999, garbage_collection_threshold=0.5)
    r = simulate(events, capacity_bytes=100 * MiB, config=gc)
    # allowed = 0.999 * 100 MiB = 99.9 MiB. At event 4 reserved = 70 MiB > 0.5 * 99.9:
    # garbage_collect_cached_blocks frees unsplit cached blocks at least as old as the
    # average. Ages in get_free_block calls: the 30 MiB block was cached after call 1, the
    # 40 MiB one after call 2, now call 3: ages 2 and 1, average 1.5 -> only the 30 MiB
    # segment goes (reclaims >= 70 - 49.95 MiB). Then 40 + 50 <= 99.9 fits: reserved 90 MiB.
    assert r.final_reserved_bytes == 90 * MiB
    # Without GC: 70 + 50 > 99.9 -> release_cached_blocks frees both -> 50 MiB.
    no_gc = simulate(
        events, capacity_bytes=100 * MiB, config=AllocatorConfig(per_process_memory_fraction=0.999)
    )
    assert no_gc.final_reserved_bytes == 50 * MiB
    # As in PyTorch, the threshold alone (no memory fraction) does nothing; nor does it with a
    # fraction of 1.0, which sets no limit (setMemoryFraction, PyTorch >= 2.10).
    for cfg in (
        AllocatorConfig(garbage_collection_threshold=0.5),
        AllocatorConfig(per_process_memory_fraction=1.0, garbage_collection_threshold=0.5),
    ):
        assert simulate(events, capacity_bytes=100 * MiB, config=cfg).final_reserved_bytes == (
            50 * MiB
        )


def test_memory_fraction_is_of_the_device_total():
    # setMemoryFraction multiplies totalGlobalMem, not what is left after the CUDA context.
    cfg = AllocatorConfig(per_process_memory_fraction=0.5)
    events = [(1, 0, 40 * MiB), (1, 1, 20 * MiB)]
    r = simulate(events, capacity_bytes=90 * MiB, total_bytes=120 * MiB, config=cfg)
    assert r.oom is None and r.peak_reserved_bytes == 60 * MiB  # allowed 60 MiB, not 45
    assert simulate(events, capacity_bytes=90 * MiB, config=cfg).oom is not None
    # A fraction of 0 is valid, as in PyTorch: nothing can be allocated.
    zero = AllocatorConfig(per_process_memory_fraction=0.0)
    assert simulate(events, capacity_bytes=90 * MiB, config=zero).oom is not None


def test_memory_fraction_caps_reserved():
    cfg = AllocatorConfig(per_process_memory_fraction=0.5)
    r = simulate([(1, 0, 40 * MiB), (1, 1, 20 * MiB)], capacity_bytes=100 * MiB, config=cfg)
    # allowed = 50 MiB; 40 + 20 > 50 -> OOM with "50.00 MiB allowed; "
    assert r.oom is not None
    assert r.oom.allowed_bytes == 50 * MiB
    assert "is free. 50.00 MiB allowed; Of the allocated memory" in r.oom.message()


# ---- simulate bookkeeping ----------------------------------------------------------------


def test_simulate_peaks_and_timeline():
    events = [
        (1, 0, 3 * MiB),  # 20 MiB segment [3][17 free]: reserved 20, allocated 3
        (1, 1, 18 * MiB),  # 17 MiB free < 18: own 18 MiB segment: reserved 38, allocated 21
        (-1, 1, 0),  # allocated 3; the 18 MiB segment stays cached
        (1, 2, 0),  # zero-byte allocation: no memory (NativeCachingAllocator::allocate)
        (-1, 2, 0),
        (1, 3, 2 * MiB),  # best fit is the 17 MiB block (not the 18 MiB one): allocated 5
    ]
    r = simulate(events, record_timeline=True)
    assert r.peak_allocated_bytes == 21 * MiB
    assert r.peak_index == 1
    assert r.reserved_at_peak_allocated_bytes == 38 * MiB
    assert r.num_segments_at_peak == 2
    assert r.peak_reserved_bytes == 38 * MiB
    assert r.peak_reserved_index == 1
    assert r.final_allocated_bytes == 5 * MiB
    assert r.final_reserved_bytes == 38 * MiB
    assert r.reserved_timeline == (20 * MiB,) + (38 * MiB,) * 5
    assert r.oom is None
    assert simulate(events).reserved_timeline is None


def test_simulate_rejects_bad_events():
    with pytest.raises(BadInputError):
        simulate([(-1, 7, 0)])
    with pytest.raises(BadInputError):
        simulate([(1, 7, 10), (1, 7, 10)])
    with pytest.raises(BadInputError):
        simulate([(0, 7, 10)])


# ---- config parsing ----------------------------------------------------------------------


def test_config_from_string():
    cfg = AllocatorConfig.from_string(
        "expandable_segments:True,max_split_size_mb:128,"
        "garbage_collection_threshold:0.6,roundup_power2_divisions:4"
    )
    assert cfg == AllocatorConfig(
        expandable_segments=True,
        max_split_size=128 * MiB,
        garbage_collection_threshold=0.6,
        roundup_power2_divisions=4,
    )
    assert AllocatorConfig.from_string("") == AllocatorConfig()
    # whitespace is ignored (ConfigTokenizer); keys PyTorch knows but that do not change
    # device memory are accepted
    assert (
        AllocatorConfig.from_string(
            " expandable_segments : False , release_lock_on_cudamalloc:True, backend:native"
        )
        == AllocatorConfig()
    )
    # -1 wraps to SIZE_MAX in std::stoull: unlimited
    assert AllocatorConfig.from_string("max_split_size_mb:-1").max_split_size is None
    assert AllocatorConfig.from_string(cfg.to_string()) == cfg


def test_config_unknown_key():
    with pytest.raises(BadInputError) as e:
        AllocatorConfig.from_string("expandable_segment:True")
    msg = str(e.value)
    assert "'expandable_segment'" in msg
    assert "Did you mean 'expandable_segments'" in msg
    assert "Valid keys: expandable_segments, max_split_size_mb" in msg


@pytest.mark.parametrize(
    ("conf", "quoted"),
    [
        ("expandable_segments", "'expandable_segments'"),
        ("expandable_segments:", "'expandable_segments'"),
        ("expandable_segments:true", "'true'"),
        ("max_split_size_mb:10", "max_split_size"),  # must be >= 20 MiB
        ("max_split_size_mb:big", "'big'"),
        ("garbage_collection_threshold:1.5", "garbage_collection_threshold"),
        ("roundup_power2_divisions:3", "'3'"),
        ("roundup_power2_divisions:[256:3]", "'[256,:,3]'"),
        ("expandable_segments:True,,max_split_size_mb:128", "','"),
        ("backend:cudaMallocAsync", "cudaMallocAsync"),
    ],
)
def test_config_bad_strings(conf: str, quoted: str):
    with pytest.raises(BadInputError) as e:
        AllocatorConfig.from_string(conf)
    assert quoted in str(e.value)


# ---- random workload: speed and invariants ------------------------------------------------


def _random_events(n: int, seed: int) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    live: list[int] = []
    events: list[tuple[int, int, int]] = []
    key = 0
    while len(events) < n:
        if live and (rng.random() < 0.5 or len(live) > 3000):
            events.append((-1, live.pop(rng.randrange(len(live))), 0))
        else:
            r = rng.random()
            if r < 0.5:
                size = rng.randint(1, MiB)
            elif r < 0.9:
                size = rng.randint(MiB, 64 * MiB)
            else:
                size = rng.randint(64 * MiB, GiB)
            events.append((1, key, size))
            live.append(key)
            key += 1
    return events


def test_random_workload_fast_and_reserved_covers_allocated():
    events = _random_events(100_000, seed=1234)
    t0 = time.perf_counter()
    r = simulate(events, record_timeline=True)
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0, f"100k events took {elapsed:.2f} s"
    assert r.oom is None
    assert r.reserved_timeline is not None and len(r.reserved_timeline) == 100_000
    assert r.peak_reserved_bytes == max(r.reserved_timeline)
    assert r.peak_reserved_bytes >= r.peak_allocated_bytes
    assert r.reserved_at_peak_allocated_bytes >= r.peak_allocated_bytes


@pytest.mark.parametrize(
    "config",
    [
        AllocatorConfig(),
        AllocatorConfig(expandable_segments=True),
        AllocatorConfig(max_split_size=128 * MiB),
        AllocatorConfig(roundup_power2_divisions=4),
        AllocatorConfig(per_process_memory_fraction=0.9, garbage_collection_threshold=0.6),
    ],
    ids=["default", "expandable", "max_split", "pow2", "gc"],
)
def test_allocator_invariants(config: AllocatorConfig):
    # Under a capacity, so that free-and-retry, unmapping, GC and OOM paths are exercised
    # (with this seed every config releases its cache at least once).
    events = _random_events(20_000, seed=99)
    a = CachingAllocator(config, capacity_bytes=20 * GiB)
    held: dict[int, int] = {}
    for i, (kind, key, size) in enumerate(events):
        if kind == 1:
            try:
                held[key] = a.malloc(size)
            except AllocatorOutOfMemoryError as e:
                assert e.oom.reserved_bytes <= 20 * GiB
                break
        else:
            a.free(held.pop(key))
        assert a.reserved >= a.allocated
        assert a.reserved <= 20 * GiB
        if i % 500 == 0:
            segs = a.segments()
            assert sum(s for s, _ in segs) == a.reserved
            assert sum(b for _, blocks in segs for b, used in blocks if used) == a.allocated
            assert all(s == sum(b for b, _ in blocks) for s, blocks in segs)
            assert len(segs) == a.num_segments
    assert a.peak_reserved >= a.peak_allocated
