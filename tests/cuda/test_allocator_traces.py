"""Replay allocator traces through memfit's caching-allocator simulator.

Every ``*.json`` file in tests/data/allocator_traces/ is a trace: a list of events
(``["alloc", id, requested_size]``, ``["free", id, size]``, ``["empty_cache", -1, 0]``) and
checkpoints giving, after a given event, the reserved bytes and optionally the allocated bytes
and the segment layout (each segment's total size and its blocks, in address order, as
allocated or free). The test replays the events through ``memfit.cuda.allocator.CachingAllocator``
under the trace's ``PYTORCH_CUDA_ALLOC_CONF`` and checks every checkpoint.

The ``synthetic_*`` traces were derived by hand from the documented rules of PyTorch's
CUDACachingAllocator (c10/cuda/CUDACachingAllocator.cpp: round_size, get_pool,
get_allocation_size, get_free_block, should_split, free_block / try_merge_blocks,
release_cached_blocks, try_allocate_expandable_block / map_block / unmap_block), and its
"derivation" field says, event by event, which rule gives the expected layout. They check the
simulator against those rules, not against hardware. The ``*-h200-2026-11-27`` traces were
recorded on an NVIDIA H200 (torch 2.11, see benchmarks/results/h200-2026-11-27.md): they check
it against the device.

``python benchmarks/gpu_validation.py --record-traces`` writes recorded traces in the same
format (``trace_from_snapshot``) under benchmarks/results/traces/; copied here, they are
replayed the same way. For recorded traces the expected reserved bytes come from the
allocator's own segment_alloc / segment_free history and the final segment layout from
``torch.cuda.memory._snapshot()``. Segments are compared as a multiset, because real device
addresses follow the simulator's order (newest segment lowest) only mostly.

Address order matters: get_free_block's best fit breaks ties between equal-size free blocks by
address (BlockComparatorSize: stream, size, ptr), so it decides which segment a request splits
and so which free blocks can merge later. With segments at increasing addresses (oldest
lowest) the bert trace needed one 20 MiB segment more than the H200 from event 1955 on, in
foreach AdamW's state allocations (issue 31); the recorded final layouts, sorted by address,
run newest-first (`test_recorded_segments_run_newest_first`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memfit.cuda.allocator import CachingAllocator
from tests.conftest import ACTIONS, TRACE_DIR, TRACE_FORMAT, replay_trace, trace_layout

TRACE_FILES = sorted(TRACE_DIR.glob("*.json"))

#: Recorded traces the simulator does not yet replay exactly, with what differs. Each is a
#: strict xfail: it fails the suite the day the simulator replays it (then remove the entry).
KNOWN_DIFFERENCES: dict[str, str] = {}

MiB = 1 << 20

#: Longest common subsequence of a recorded final layout (segments in device address order)
#: with the simulated one, in the simulator's order (newest lowest) and reversed (oldest
#: lowest): (segments, newest-first, oldest-first).
ADDRESS_ORDER = {
    "bert-fp32-adamw-b8-s128-h200-2026-11-27": (112, 88, 46),
    "gpt2-fp32-sgd-b1-s128-h200-2026-11-27": (57, 42, 22),
    "resnet18-fp32-sgd-b16-h200-2026-11-27": (39, 27, 21),
}


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_trace_files_exist():
    assert len(TRACE_FILES) >= 3, f"expected trace files in {TRACE_DIR}"


@pytest.mark.parametrize("path", TRACE_FILES, ids=[p.stem for p in TRACE_FILES])
def test_trace_is_well_formed(path: Path):
    t = load(path)
    assert t["format"] == TRACE_FORMAT
    assert t["source"] in ("synthetic", "recorded")
    assert t["derivation"], "say where the expected layouts come from"
    live: set[int] = set()
    seen: set[int] = set()
    for i, ev in enumerate(t["events"]):
        assert len(ev) == 3 and ev[0] in ACTIONS, (i, ev)
        action, key, size = ev
        assert isinstance(key, int) and isinstance(size, int) and size >= 0, (i, ev)
        if action == "alloc":
            assert key not in seen, f"event {i}: id {key} allocated twice"
            seen.add(key)
            live.add(key)
        elif action == "free":
            assert key in live, f"event {i}: free of id {key}, which is not allocated"
            live.remove(key)
    n = len(t["events"])
    indices = [c["after_event"] for c in t["checkpoints"]]
    assert indices and indices == sorted(set(indices)) and indices[0] >= 0 and indices[-1] < n
    for c in t["checkpoints"]:
        if "segments" in c:
            for s in c["segments"]:
                assert sum(b[0] for b in s["blocks"]) == s["total_size"], (path.name, c, s)
                assert all(b[1] in ("allocated", "free") for b in s["blocks"])
            assert sum(s["total_size"] for s in c["segments"]) == c["reserved_bytes"]
            if "allocated_bytes" in c:
                allocated = sum(b[0] for s in c["segments"] for b in s["blocks"]
                                if b[1] == "allocated")  # fmt: skip
                assert allocated == c["allocated_bytes"]


@pytest.mark.parametrize("path", TRACE_FILES, ids=[p.stem for p in TRACE_FILES])
def test_replay_matches_checkpoints(path: Path, request: pytest.FixtureRequest):
    if path.stem in KNOWN_DIFFERENCES:
        request.applymarker(pytest.mark.xfail(reason=KNOWN_DIFFERENCES[path.stem], strict=True))
    t = load(path)
    if not t.get("complete", True):
        pytest.skip(f"{path.name} is marked incomplete: {t.get('notes')}")
    results = {i: (r, a, lay) for i, r, a, lay in replay_trace(t)}
    for c in t["checkpoints"]:
        i = c["after_event"]
        reserved, allocated, layout = results[i]
        why = t["derivation"][i] if isinstance(t["derivation"], list) else t["derivation"]
        assert reserved == c["reserved_bytes"], f"{path.name} after event {i}: reserved\n{why}"
        if "allocated_bytes" in c:
            assert allocated == c["allocated_bytes"], (
                f"{path.name} after event {i}: allocated\n{why}"
            )
        if "segments" in c:
            assert layout == trace_layout(c["segments"]), (
                f"{path.name} after event {i}: segments\n{why}\n"
                f"simulated {sorted(layout.elements())}\nexpected  "
                f"{sorted(trace_layout(c['segments']).elements())}"
            )


def _lcs(a: list[Any], b: list[Any]) -> int:
    row = [0] * (len(b) + 1)
    for x in a:
        prev = 0  # row[j - 1] of the previous row
        for j, y in enumerate(b):
            prev, row[j + 1] = row[j + 1], prev + 1 if x == y else max(row[j + 1], row[j])
    return row[-1]


@pytest.mark.parametrize("name", sorted(ADDRESS_ORDER))
def test_recorded_segments_run_newest_first(name: str):
    t = load(TRACE_DIR / f"{name}.json")
    alloc = CachingAllocator()
    held: dict[int, int | None] = {}
    for action, key, size in t["events"]:  # recorded traces hold only alloc and free
        if action == "alloc":
            held[key] = alloc.malloc(size) if size > 0 else None
        elif (block := held.pop(key)) is not None:
            alloc.free(block)
    sim = [(size, tuple(blocks)) for size, blocks in alloc.segments()]
    final = t["checkpoints"][-1]["segments"]
    dev = [
        (s["total_size"], tuple((b[0], b[1] == "allocated") for b in s["blocks"])) for s in final
    ]
    assert (len(dev), _lcs(sim, dev), _lcs(sim[::-1], dev)) == ADDRESS_ORDER[name]


def test_best_fit_ties_go_to_the_newest_segment():
    a = CachingAllocator()
    old = a.malloc(12 * MiB)  # a 12 MiB segment each (> 10 MiB: no 20 MiB packing)
    new = a.malloc(12 * MiB)
    assert new < old  # the newer segment lies lower (_CUDA_MALLOC_TOP)
    a.free(old)
    a.free(new)
    # get_free_block: equal sizes, so the lower address wins: the newer segment.
    assert a.malloc(12 * MiB) == new
