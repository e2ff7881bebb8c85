"""Tests of the memory_viz export (memfit.report.memory_viz), checked with PyTorch's own tooling
(torch.cuda._memory_viz) and by replaying the exported trace."""

from __future__ import annotations

import io
import pickle
import pickletools
import re

import pytest
import torch.cuda._memory_viz as memory_viz

from memfit.cuda.allocator_config import AllocatorConfig, cuda_block_size
from memfit.cuda.allocator_replay import simulate
from memfit.events import ALLOC, FREE, Event, StorageRecord
from memfit.profile import MemoryProfile
from memfit.report.memory_viz import memory_viz_snapshot, to_memory_viz

MiB = 1024 * 1024
#: The simulator places cudaMalloc'ed segments from 2**62 down, the newest lowest
#: (memfit.cuda.allocator); BASE is the large segment of `hand_profile`, created second.
BASE = (1 << 62) - 22 * MiB

#: Opcodes that memory_viz's JavaScript unpickler handles (MemoryViz.js, `unpickle`).
JS_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET",
    "LONG_BINGET", "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST",
    "APPEND", "APPENDS", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "BININT",
    "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE", "NONE",
    "NEWTRUE", "NEWFALSE",
}  # fmt: skip


def _rec(sid, nbytes, category, host=False):
    return StorageRecord(sid, nbytes, category, "forward", 0, f"op{sid}", "lin", -1, 0, host=host)


def hand_profile() -> MemoryProfile:
    records = {
        0: _rec(0, 1000, "parameters"),  # 1024-B block, small pool
        1: _rec(1, 3 * MiB, "activations"),  # large pool: a 20 MiB segment (1 to 10 MiB)
        2: _rec(2, 600, "temporaries"),  # 1024-B block
        3: _rec(3, 500, "activations"),  # 512-B block
        4: _rec(4, 4096, "optimizer_state", host=True),  # host memory: not exported
        5: _rec(5, 0, "temporaries"),  # zero bytes: no block
    }
    order = [(ALLOC, 0), (ALLOC, 4), (ALLOC, 1), (ALLOC, 5), (ALLOC, 2), (FREE, 2), (FREE, 5)]
    order += [(ALLOC, 3), (FREE, 1), (FREE, 4)]
    events = [Event(k, sid, "forward", 0, f"op{sid}", "lin", -1) for k, sid in order]
    return MemoryProfile.from_events(records, events)


def _merged(ranges):
    out = []
    for a, b in sorted(ranges):
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def replay(snapshot) -> tuple[int, int]:
    """Replay the trace forwards, checking that it is consistent with itself and with the final
    segments; return (max live bytes, max reserved bytes)."""
    pieces: dict[int, int] = {}  # address -> size of segments (or mapped ranges)
    blocks: dict[int, int] = {}
    live = reserved = max_live = max_reserved = 0

    def covered(addr, size):
        cur, end = addr, addr + size
        for a in sorted(pieces):
            if a <= cur < a + pieces[a]:
                cur = a + pieces[a]
        return cur >= end

    trace = snapshot["device_traces"][0]
    for i, e in enumerate(trace):
        action, addr, size = e["action"], e["addr"], e["size"]
        if action in ("segment_alloc", "segment_map"):
            assert not any(a < addr + size and addr < a + s for a, s in pieces.items())
            pieces[addr] = size
            reserved += size
        elif action == "alloc":
            assert covered(addr, size), e
            assert not any(a < addr + size and addr < a + s for a, s in blocks.items()), e
            blocks[addr] = size
            live += size
        elif action == "free_requested":
            assert blocks[addr] == size and trace[i + 1]["action"] == "free_completed"
        elif action == "free_completed":
            assert trace[i - 1]["action"] == "free_requested" and trace[i - 1]["addr"] == addr
            live -= blocks.pop(addr)
        else:  # without a capacity, the simulated allocator never gives memory back
            raise AssertionError(f"unexpected action {action}")
        max_live, max_reserved = max(max_live, live), max(max_reserved, reserved)
    # Every allocation is freed in the trace or active in the final segments, and vice versa.
    active = {}
    for seg in snapshot["segments"]:
        assert seg["total_size"] == sum(b["size"] for b in seg["blocks"])
        addr = seg["address"]
        for b in seg["blocks"]:
            assert b["address"] == addr
            addr += b["size"]
            if b["state"] == "active_allocated":
                active[b["address"]] = cuda_block_size(b["requested_size"])
    assert active == blocks
    final = [(s["address"], s["address"] + s["total_size"]) for s in snapshot["segments"]]
    traced = [(a, a + s) for a, s in pieces.items()]
    if any(s["is_expandable"] for s in snapshot["segments"]):  # mapped ranges merge
        assert _merged(final) == _merged(traced)
    else:
        assert sorted(final) == sorted(traced)
    return max_live, max_reserved


def test_hand_stream_exact(tmp_path):
    p = hand_profile()
    assert p.peak_allocated_bytes == 1024 + 3 * MiB + 1024
    path = tmp_path / "s.pickle"
    to_memory_viz(p, path)
    snap = pickle.loads(path.read_bytes())
    trace = snap["device_traces"][0]
    got = [(e["action"], e["addr"] - BASE, e["size"], e["time_us"]) for e in trace]
    assert got == [
        ("segment_alloc", 20 * MiB, 2 * MiB, 0),  # small pool: 2 MiB segment
        ("alloc", 20 * MiB, 1024, 0),
        ("segment_alloc", 0, 20 * MiB, 2),  # large pool: 20 MiB segment, below the first
        ("alloc", 0, 3 * MiB, 2),
        ("alloc", 20 * MiB + 1024, 1024, 4),  # split from the small segment
        ("free_requested", 20 * MiB + 1024, 1024, 5),
        ("free_completed", 20 * MiB + 1024, 1024, 5),
        ("alloc", 20 * MiB + 1024, 512, 7),  # best fit: the freed block, merged again
        ("free_requested", 0, 3 * MiB, 8),
        ("free_completed", 0, 3 * MiB, 8),
    ]
    assert trace[3]["frames"] == [
        {"filename": "lin", "line": 0, "name": "op1 [activations]"},
        {"filename": "<memfit>", "line": 0, "name": "forward step 0"},
    ]
    assert trace[3]["category"] == "activations" and trace[0]["category"] == "unknown"
    large, small = snap["segments"]  # in address order
    assert (small["address"], small["total_size"], small["segment_type"]) == (
        BASE + 20 * MiB,
        2 * MiB,
        "small",
    )
    assert [(b["size"], b["requested_size"], b["state"]) for b in small["blocks"]] == [
        (1024, 1000, "active_allocated"),
        (512, 500, "active_allocated"),
        (2 * MiB - 1536, 0, "inactive"),
    ]
    assert (small["allocated_size"], small["active_size"], small["requested_size"]) == (
        1536,
        1536,
        1500,
    )
    assert (large["address"], large["total_size"], large["segment_type"]) == (
        BASE,
        20 * MiB,
        "large",
    )
    assert [(b["size"], b["state"]) for b in large["blocks"]] == [(20 * MiB, "inactive")]
    assert replay(snap) == (p.peak_allocated_bytes, 22 * MiB)


def test_pickle_is_what_memory_viz_reads(tmp_path):
    path = tmp_path / "s.pickle"
    to_memory_viz(hand_profile(), path)
    ops = list(pickletools.genops(path.read_bytes()))
    assert ops[0][0].name == "PROTO" and ops[0][1] == 4  # MemoryViz.js reads protocols 2-4
    assert {op.name for op, _, _ in ops} <= JS_OPCODES


def _stream(p: MemoryProfile):
    # As memfit.estimator.device_memory feeds the allocator simulation: host storages take no
    # device memory.
    return [
        (1 if k == ALLOC else -1, sid, 0 if p.records[sid].host else p.records[sid].nbytes)
        for k, sid, *_ in p.events
    ]


@pytest.fixture(scope="module")
def gpt2_profile() -> MemoryProfile:
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel

    import memfit

    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32)
    cfg.bos_token_id = cfg.eos_token_id = 0
    est = memfit.estimate(GPT2LMHeadModel(cfg), memfit.Workload(batch_size=2, seq_len=16))
    return est.profile


@pytest.mark.parametrize("conf", ["", "expandable_segments:True"])
def test_real_estimate_replays_to_the_profile(gpt2_profile, conf, tmp_path):
    p = gpt2_profile
    cfg = AllocatorConfig.from_string(conf) if conf else AllocatorConfig()
    path = tmp_path / "s.pickle"
    to_memory_viz(p, path, config=cfg)
    snap = pickle.loads(path.read_bytes())
    max_live, max_reserved = replay(snap)
    assert max_live == p.peak_allocated_bytes
    assert max_reserved == simulate(_stream(p), config=cfg).peak_reserved_bytes
    assert all(s["is_expandable"] == bool(conf) for s in snap["segments"])
    seg_actions = {e["action"] for e in snap["device_traces"][0] if "segment" in e["action"]}
    assert seg_actions == ({"segment_map"} if conf else {"segment_alloc"})

    # PyTorch's own tooling reads it (the flamegraph step is replaced by the identity, as
    # formatting it downloads flamegraph.pl).
    def no_flamegraph(lines):
        return lines

    assert "total_reserved" in memory_viz.segsum(snap)  # also checks the segments' accounting
    assert memory_viz.trace(snap).startswith("Device 0")
    line = re.compile(
        r"stream_0;(inactive;(<non-python>|<gaps>)|active_allocated;(<gaps>|"
        r"<memfit>:0:\w+ step \d+;[\w.<>]+:0:\S+ \[\w+\])) \d+"
    )
    memory_lines = memory_viz.memory(snap, format_flamegraph=no_flamegraph).splitlines()
    assert memory_lines and all(line.fullmatch(m) for m in memory_lines)
    assert memory_viz.segments(snap, format_flamegraph=no_flamegraph)
    assert "Active Memory Timeline" in memory_viz.trace_plot(snap)
    assert "Allocator State History" in memory_viz.segment_plot(snap)


class _ClassFree(pickle.Unpickler):
    """An unpickler that knows no class, as MemoryViz.js's: a snapshot must hold only the plain
    types `torch.cuda.memory._snapshot()` gives (dict, list, tuple, str, int, float, bool)."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"the snapshot refers to {module}.{name}")


def test_a_real_estimate_pickles_to_plain_types_memory_viz_reads(gpt2_profile, tmp_path):
    # Regression: entries held memfit's Category enum, so the file needed memfit to load and
    # used STACK_GLOBAL/REDUCE, which MemoryViz.js rejects.
    path = tmp_path / "s.pickle"
    to_memory_viz(gpt2_profile, path)
    data = path.read_bytes()
    assert {op.name for op, _, _ in pickletools.genops(data)} <= JS_OPCODES
    snap = _ClassFree(io.BytesIO(data)).load()
    cats = {e["category"] for e in snap["device_traces"][0]}
    assert all(type(c) is str for c in cats)
    assert {"parameters", "activations", "unknown"} <= cats


def test_snapshot_dict_is_returned_without_writing():
    snap = memory_viz_snapshot(hand_profile())
    assert set(snap) == {"segments", "device_traces"} and len(snap["device_traces"]) == 1
