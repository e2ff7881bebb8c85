"""Export a `MemoryProfile` as a PyTorch memory snapshot, the file pytorch.org/memory_viz opens.

The pickle has the layout of `torch.cuda.memory._snapshot()` (see its docstring in
torch/cuda/memory.py; the fields read are those of torch/cuda/_memory_viz.py and of
torch/utils/viz/MemoryViz.js): a `device_traces` list with one trace for device 0 and the
`segments` of that device. The profile's event stream is replayed through memfit's caching
allocator simulator (`memfit.cuda.allocator.CachingAllocator`) to give every block a simulated
address in a simulated segment, and every cudaMalloc a `segment_alloc` entry (or
`segment_map` with expandable segments).

Choices, where the format leaves room:
- `segments` is the state at the end of the stream, as a real snapshot taken after the
  step: memory_viz replays `device_traces` backwards from it ("Allocator State History")
  and counts active blocks that no trace entry allocated as allocated before the trace.
- Trace sizes are the sizes the profile counts (`memfit.cuda.allocator_config.cuda_block_size`: the
request
  rounded up to 512 bytes), where PyTorch records the requested size, so the peak of the
  "Active Memory Timeline" is `profile.peak_allocated_bytes`. The requested size is each
  block's `requested_size`; a block the simulator hands out whole, or rounds further
  (`roundup_power2_divisions`), is larger in `segments` than in the trace.
- Frames carry memfit's context instead of a Python stack: the first frame is
  `<module path>:0:<op> [<category>]` ("<top>" for the top level), the second
  `<memfit>:0:<phase> step <step>`. Alloc and free entries also carry `category`, which
  memory_viz uses to colour the timeline; `time_us` is the event index, not a time.
- Host storages (`record.host`) and zero-byte storages are not device allocations: left out.
- The simulated device has no capacity limit, so the trace has no `oom` entry and the
  allocator never gives memory back (no `segment_free`). The highest sum of segments is the
  simulated peak reserved memory: `profile.peak_reserved_bytes` less the cuDNN workspace
  that `memfit.estimate` adds outside the simulation, when it adds one.

Example:
    >>> est = memfit.estimate("gpt2", memfit.Workload(batch_size=2, seq_len=128))
    >>> to_memory_viz(est.profile, "gpt2_snapshot.pickle")  # drag onto pytorch.org/memory_viz
"""

from __future__ import annotations

import pickle
from bisect import bisect_right
from enum import Enum
from pathlib import Path
from typing import Any

from memfit.cuda.allocator import CachingAllocator
from memfit.cuda.allocator_config import (
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    AllocatorConfig,
    cuda_block_size,
)
from memfit.errors import BadInputError
from memfit.events import ALLOC, StorageRecord
from memfit.profile import MemoryProfile

#: memory_viz's JavaScript unpickler (MemoryViz.js, `unpickle`) accepts protocols 2 to 4;
#: 4 is also what `torch.cuda.memory._dump_snapshot` writes (pickle.DEFAULT_PROTOCOL).
PICKLE_PROTOCOL = 4
#: Category memory_viz gives entries without one (MemoryViz.js, annotate_snapshot). Segment
#: entries carry it: some MemoryViz.js versions fail on a snapshot whose categories lack it.
UNKNOWN_CATEGORY = "unknown"

Frames = list[dict[str, Any]]
Segment = tuple[int, list[tuple[int, bool]]]  # (address, [(block size, allocated), ...])


def _plain(category: str) -> str:
    """A category as the plain `str` a snapshot holds. memfit's categories are a str-Enum, which
    pickles as a reference to memfit's class: a file that needs memfit to load, with opcodes
    (STACK_GLOBAL, REDUCE) that MemoryViz.js's unpickler rejects."""
    return str(category.value) if isinstance(category, Enum) else str(category)


def _frames(rec: StorageRecord) -> Frames:
    return [
        {
            "filename": rec.module or "<top>",
            "line": 0,
            "name": f"{rec.op} [{_plain(rec.category)}]",
        },
        {"filename": "<memfit>", "line": 0, "name": f"{rec.phase} step {rec.step}"},
    ]


def _segment_table(
    alloc: CachingAllocator, live: list[int], previous: list[Segment]
) -> list[Segment]:
    """The allocator's segments with their addresses.

    `CachingAllocator.segments()` lists segments in address order without addresses. A
    segment holding an allocated block is placed by that block (its address is the block id
    malloc returned; `live` is the sorted list of them). A segment with no allocated block
    was in `previous` (a new segment always holds the block it was created for), at the
    first address there of its size after the segment before it.
    """
    out: list[Segment] = []
    k = 0
    p = 0
    for size, blocks in alloc.segments():
        first = next((i for i, (_, used) in enumerate(blocks) if used), None)
        if first is not None:
            addr = live[k] - sum(s for s, _ in blocks[:first])
            k += sum(1 for _, used in blocks if used)
        else:
            lo = out[-1][0] + sum(s for s, _ in out[-1][1]) if out else 0
            while p < len(previous) and (
                previous[p][0] < lo or sum(s for s, _ in previous[p][1]) != size
            ):
                p += 1
            if p == len(previous):
                raise AssertionError(f"free segment of {size} bytes not seen before")
            addr = previous[p][0]
        out.append((addr, blocks))
    return out


def _intervals(table: list[Segment]) -> list[tuple[int, int]]:
    """Address ranges [start, end) covered by segments, adjacent ones merged."""
    out: list[tuple[int, int]] = []
    for addr, blocks in table:
        end = addr + sum(s for s, _ in blocks)
        if out and out[-1][1] == addr:
            out[-1] = (out[-1][0], end)
        else:
            out.append((addr, end))
    return out


def _subtract(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Parts of the sorted disjoint ranges `a` not covered by the sorted disjoint ranges `b`."""
    out = []
    for start, end in a:
        cur = start
        for bs, be in b:
            if be <= cur or bs >= end:
                continue
            if bs > cur:
                out.append((cur, bs))
            cur = max(cur, be)
        if cur < end:
            out.append((cur, end))
    return out


def memory_viz_snapshot(
    profile: MemoryProfile, *, config: AllocatorConfig | None = None
) -> dict[str, Any]:
    """The snapshot dict (see the module doc) of `profile`'s event stream, simulated with
    allocator settings `config` (default: PyTorch's defaults)."""
    cfg = config or AllocatorConfig()
    expandable = cfg.expandable_segments
    alloc = CachingAllocator(cfg)
    records = profile.records
    trace: list[dict[str, Any]] = []
    addr_of: dict[int, int] = {}  # sid -> block address
    sid_at: dict[int, int] = {}  # block address -> sid
    live: list[int] = []  # sorted addresses of allocated blocks
    table: list[Segment] = []
    starts: list[int] = []  # segment addresses, sorted
    ends: list[int] = []
    small: dict[int, bool] = {}  # segment address -> small pool
    seg_frames: dict[int, Frames] = {}
    frames_of: dict[int, Frames] = {}

    def entry(action: str, addr: int, size: int, t: int, frames: Frames, cat: str) -> None:
        trace.append(
            {
                "action": action,
                "addr": addr,
                "size": size,
                "stream": 0,
                "time_us": t,
                "frames": frames,
                "category": cat,
            }
        )

    for t, ev in enumerate(profile.events):
        sid = ev.sid
        rec = records[sid]
        if rec.host or rec.nbytes <= 0:
            continue
        size = cuda_block_size(rec.nbytes)
        if ev.kind == ALLOC:
            if sid in addr_of:
                raise BadInputError(f"event {t}: storage {sid} allocated twice without a free.")
            frames = frames_of[sid] = _frames(rec)
            reserved = alloc.reserved
            addr = alloc.malloc(rec.nbytes)
            live.insert(bisect_right(live, addr), addr)
            addr_of[sid], sid_at[addr] = addr, sid
            i = bisect_right(starts, addr) - 1
            if alloc.reserved != reserved or i < 0 or addr >= ends[i]:
                new = _segment_table(alloc, live, table)
                old_iv, new_iv = _intervals(table), _intervals(new)
                if expandable:
                    gone, added = _subtract(old_iv, new_iv), _subtract(new_iv, old_iv)
                    free_action, alloc_action = "segment_unmap", "segment_map"
                else:
                    old = {(a, sum(s for s, _ in b)) for a, b in table}
                    now = {(a, sum(s for s, _ in b)) for a, b in new}
                    gone = sorted((a, a + s) for a, s in old - now)
                    added = sorted((a, a + s) for a, s in now - old)
                    free_action, alloc_action = "segment_free", "segment_alloc"
                for a, b in gone:
                    entry(free_action, a, b - a, t, seg_frames.get(a, []), UNKNOWN_CATEGORY)
                for a, b in added:
                    entry(alloc_action, a, b - a, t, frames, UNKNOWN_CATEGORY)
                for a, blocks in new:
                    seg_frames.setdefault(a, frames)
                    sizes = [s for s, used in blocks if used]
                    if sizes:
                        small[a] = sizes[0] <= K_SMALL_SIZE
                table = new
                starts = [a for a, _ in table]
                ends = [a + sum(s for s, _ in b) for a, b in table]
            entry("alloc", addr, size, t, frames, _plain(rec.category))
        else:
            if sid not in addr_of:
                raise BadInputError(f"event {t}: free of storage {sid} that is not allocated.")
            addr = addr_of.pop(sid)
            del sid_at[addr]
            del live[bisect_right(live, addr) - 1]
            alloc.free(addr)
            frames = frames_of.pop(sid)
            for action in ("free_requested", "free_completed"):
                entry(action, addr, size, t, frames, _plain(rec.category))
    return {
        "segments": [
            _segment_dict(a, blocks, sid_at, records, frames_of, small, seg_frames, expandable)
            for a, blocks in _segment_table(alloc, live, table)
        ],
        "device_traces": [trace],
    }


def _segment_dict(
    addr: int,
    blocks: list[tuple[int, bool]],
    sid_at: dict[int, int],
    records: dict[int, StorageRecord],
    frames_of: dict[int, Frames],
    small: dict[int, bool],
    seg_frames: dict[int, Frames],
    expandable: bool,
) -> dict[str, Any]:
    out_blocks: list[dict[str, Any]] = []
    b_addr = addr
    for size, used in blocks:
        sid = sid_at.get(b_addr) if used else None
        out_blocks.append(
            {
                "address": b_addr,
                "size": size,
                "requested_size": records[sid].nbytes if sid is not None else 0,
                "state": "active_allocated" if used else "inactive",
                "frames": frames_of[sid] if sid is not None else [],
            }
        )
        b_addr += size
    active = sum(b["size"] for b in out_blocks if b["state"] == "active_allocated")
    return {
        "device": 0,
        "address": addr,
        "total_size": b_addr - addr,
        "allocated_size": active,
        "active_size": active,
        "requested_size": sum(b["requested_size"] for b in out_blocks),
        "stream": 0,
        "segment_type": "small" if small.get(addr, b_addr - addr == K_SMALL_BUFFER) else "large",
        "segment_pool_id": (0, 0),
        "is_expandable": expandable,
        "frames": seg_frames.get(addr, []),
        "blocks": out_blocks,
    }


def to_memory_viz(
    profile: MemoryProfile, path: str | Path, *, config: AllocatorConfig | None = None
) -> None:
    """Write `profile` as a memory snapshot pickle that pytorch.org/memory_viz opens (drag the
    file onto the page), as does `python -m torch.cuda._memory_viz trace_plot FILE`."""
    data = memory_viz_snapshot(profile, config=config)
    with open(path, "wb") as f:
        pickle.dump(data, f, protocol=PICKLE_PROTOCOL)
