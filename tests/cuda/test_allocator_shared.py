"""Allocator runs shared within `shared_runs()` (memfit.cuda.allocator_replay): read back only
for the same stream under the same settings, and equal to a replay."""

from __future__ import annotations

import pytest

from memfit.cuda import allocator_replay
from memfit.cuda.allocator_config import AllocatorConfig
from memfit.cuda.allocator_replay import shared_runs, simulate, simulate_shared

MIB = 1 << 20
#: 3 MiB + 5 MiB requests, the first freed, then 1 KiB: a 20 MiB segment (large pool) and a
#: 2 MiB one (small pool).
STREAM = [(1, 1, 3 * MIB), (1, 2, 5 * MIB), (-1, 1, 0), (1, 3, 1024)]


@pytest.fixture
def replays(monkeypatch) -> list[int]:
    """The number of real replays (`simulate` calls) made through `simulate_shared`."""
    calls: list[int] = []

    def counted(events, **kw):
        calls.append(1)
        return simulate(events, **kw)

    monkeypatch.setattr(allocator_replay, "simulate", counted)
    return calls


def test_the_same_stream_is_replayed_once_and_read_back_equal(replays):
    with shared_runs():
        first = simulate_shared(STREAM, total_bytes=24 << 30, record_blocks=True)
        # Another device size, no memory fraction: the same run (the size does not enter).
        again = simulate_shared(list(STREAM), total_bytes=80 << 30, record_blocks=True)
    assert len(replays) == 1
    assert again == first == simulate(STREAM, record_blocks=True)
    # By hand: 20 MiB + 2 MiB reserved; 3 + 5 MiB allocated at the peak; 1 KiB counts 512 B
    # rounded up to 1 KiB.
    assert first.peak_reserved_bytes == 22 * MIB and first.peak_allocated_bytes == 8 * MIB
    assert again.block_bytes == {1: 3 * MIB, 2: 5 * MIB, 3: 1024}
    assert again.block_bytes is not first.block_bytes  # a caller may keep or change its own


@pytest.mark.parametrize(
    "other",
    [
        {"stream": STREAM[:-1]},
        {"stream": [(1, 1, 3 * MIB), (1, 2, 5 * MIB + 512), (-1, 1, 0), (1, 3, 1024)]},
        {"capacity_bytes": 21 * MIB},
        {"config": AllocatorConfig(expandable_segments=True)},
        {"config": AllocatorConfig(per_process_memory_fraction=0.5), "total_bytes": 40 * MIB},
        {"record_blocks": False},
    ],
)
def test_another_stream_or_setting_is_replayed_again(replays, other):
    base = {"config": AllocatorConfig(), "capacity_bytes": None, "total_bytes": 24 << 30,
            "record_blocks": True}  # fmt: skip
    changed = {**base, **{k: v for k, v in other.items() if k != "stream"}}
    stream = other.get("stream", STREAM)
    with shared_runs():
        simulate_shared(STREAM, **base)
        got = simulate_shared(stream, **changed)
    assert len(replays) == 2
    assert got == simulate(stream, **changed)


def test_a_memory_fraction_makes_the_device_size_count(replays):
    cfg = AllocatorConfig(per_process_memory_fraction=0.5)
    with shared_runs():
        small = simulate_shared(STREAM, config=cfg, total_bytes=20 * MIB)
        large = simulate_shared(STREAM, config=cfg, total_bytes=80 * MIB)
    assert len(replays) == 2
    assert small.oom is not None and large.oom is None  # 10 MiB allowed: the 20 MiB segment fails


def test_outside_the_block_nothing_is_kept(replays):
    with shared_runs():
        simulate_shared(STREAM)
    simulate_shared(STREAM)
    simulate_shared(STREAM)
    assert len(replays) == 3
    assert allocator_replay._shared is None


def test_without_blocks_a_read_back_run_has_none(replays):
    with shared_runs():
        first = simulate_shared(STREAM)
        again = simulate_shared(STREAM)
    assert len(replays) == 1 and again.block_bytes is None and again == first


def test_least_recently_used_runs_are_dropped(replays, monkeypatch):
    monkeypatch.setattr(allocator_replay, "SHARED_RUNS_KEPT", 2)
    streams = [[(1, 1, n * MIB)] for n in (1, 2, 3)]
    with shared_runs():
        for s in streams:
            simulate_shared(s)
        simulate_shared(streams[2])  # kept
        simulate_shared(streams[0])  # dropped when the third came
    assert len(replays) == 4


class Size(int):
    """An int of another type: marshal, which makes the key, does not take it."""


def test_a_stream_of_other_numbers_is_replayed_not_shared(replays):
    odd = [(1, 1, Size(3 * MIB))]
    with shared_runs():
        first = simulate_shared(odd)
        again = simulate_shared(odd)
    assert len(replays) == 2 and again == first
