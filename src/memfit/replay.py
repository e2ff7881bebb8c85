"""Replay of repeated blocks: trace 3 of N identical blocks, rebuild the stream of all N.

The 32 decoder layers of a 7B model do the same thing 32 times. The tracer runs a model built
with 3 of them (T0, T1, T2) and `expand` rebuilds the event stream of N blocks by replicating
T1's events N - 3 times, so the estimate of a 70B model costs about what a 1B one does.

Note: [How the stream is expanded]
    Every event has an owner: the block it belongs to (module context in forward/backward; for
    optimizer and zero_grad events, the block of the parameter it concerns). The stream is cut
    into runs: maximal stretches of consecutive events of one owner within one (step, phase).
    Runs of T0, T1 and T2 are paired by order of occurrence; paired runs must have the same
    signature (kind, bytes, op of every event), otherwise `expand` refuses (ReplayMismatch) and
    the caller traces the whole model. Blocks run in ascending order (forward, optimizer) or
    descending order (backward); the order of each run triple tells which.

    In the expanded stream, T1 becomes blocks 1..N-2 (copy c is block 1 + c) and T2 becomes
    block N-1. An event of copy c that refers to an allocation of
      - T1: refers to the same copy's allocation;
      - T0 (the previous block): refers to copy c-1's corresponding allocation (T0's for c=0);
      - T2 (the next block): refers to copy c+1's corresponding allocation (T2's for c=last);
      - no block (shared tensors): refers to it, and a free of it is kept only in the copy
        that comes last in time (it is freed once).
    An event of T2 that refers to a T1 allocation refers to the last copy; T0's to copy 0.
    "Corresponding" pairs the i-th allocation of a T0 (or T2) run with the i-th allocation of
    the paired T1 run. The test suite checks that the expansion equals a full trace event for
    event on models small enough to trace fully.
"""

from __future__ import annotations

from dataclasses import replace

from memfit.tracer import ALLOC, FREE, Event, StorageRecord

TRACED_BLOCKS = 3


class ReplayMismatch(Exception):
    """The traced blocks do not behave identically; the whole model must be traced."""


def _runs(events: list[Event]) -> list[tuple[int, int, int]]:
    """(start, end, owner) of each run of consecutive events with one owner and phase."""
    runs = []
    start = 0
    for i in range(1, len(events) + 1):
        if (
            i == len(events)
            or events[i][6] != events[start][6]
            or events[i][2] != events[start][2]
            or events[i][3] != events[start][3]
        ):
            runs.append((start, i, events[start][6]))
            start = i
    return runs


def expand(
    records: dict[int, StorageRecord],
    events: list[Event],
    num_blocks: int,
    block_paths: list[str],
) -> tuple[dict[int, StorageRecord], list[Event]]:
    """Rebuild the stream of `num_blocks` blocks from a trace of TRACED_BLOCKS of them."""
    extra = num_blocks - TRACED_BLOCKS
    if extra < 0:
        raise ValueError(f"cannot expand {TRACED_BLOCKS} traced blocks to {num_blocks}")
    if extra == 0:
        return records, events
    runs = _runs(events)
    by_owner: dict[int, list[tuple[int, int]]] = {0: [], 1: [], 2: []}
    for s, e, o in runs:
        if o in by_owner:
            by_owner[o].append((s, e))
    if not (len(by_owner[0]) == len(by_owner[1]) == len(by_owner[2])):
        raise ReplayMismatch(
            f"blocks have different numbers of event runs "
            f"({len(by_owner[0])}, {len(by_owner[1])}, {len(by_owner[2])})"
        )

    def signature(s: int, e: int) -> list[tuple[int, int, str]]:
        # A block's signature is its allocations and the frees of its own storages. Frees of a
        # neighbour's storage differ at the ends of the stack (block 0 has no previous block,
        # the last has no next one) and are remapped by relation below; frees of shared
        # storages happen once, in whichever block uses them last.
        own = events[s][6]
        return [
            (ev[0], records[ev[1]].nbytes, ev[4])
            for ev in events[s:e]
            if ev[0] == ALLOC or records[ev[1]].owner == own
        ]

    corr_prev: dict[int, int] = {}  # T0 sid -> T1 sid
    corr_next: dict[int, int] = {}  # T2 sid -> T1 sid
    descending: dict[int, bool] = {}  # T1 run start -> runs in descending block order
    for (s0, e0), (s1, e1), (s2, e2) in zip(by_owner[0], by_owner[1], by_owner[2], strict=True):
        sig1 = signature(s1, e1)
        if signature(s0, e0) != sig1 or signature(s2, e2) != sig1:
            raise ReplayMismatch(f"block runs differ at event {s1} (op {events[s1][4]})")
        if s0 < s1 < s2:
            descending[s1] = False
        elif s2 < s1 < s0:
            descending[s1] = True
        else:
            raise ReplayMismatch(f"block runs are interleaved at event {s1}")
        a0 = [ev[1] for ev in events[s0:e0] if ev[0] == ALLOC]
        a1 = [ev[1] for ev in events[s1:e1] if ev[0] == ALLOC]
        a2 = [ev[1] for ev in events[s2:e2] if ev[0] == ALLOC]
        corr_prev.update(zip(a0, a1, strict=True))
        corr_next.update(zip(a2, a1, strict=True))

    offset = max(records) + 1 if records else 1
    last = extra  # copies are c = 0..last; c = 0 is the traced T1

    def copy_sid(sid: int, c: int) -> int:
        return sid if c == 0 else sid + c * offset

    def ref_from_copy(sid: int, c: int) -> int | None:
        owner = records[sid].owner
        if owner == 1:
            return copy_sid(sid, c)
        if owner == 0:
            return sid if c == 0 else copy_sid(_lookup(corr_prev, sid), c - 1)
        if owner == 2:
            return sid if c == last else copy_sid(_lookup(corr_next, sid), c + 1)
        return None  # not a block allocation

    prefix = block_paths[0].rsplit(".", 1)[0] + "." if "." in block_paths[0] else ""

    def rename(path: str, old: int, new: int) -> str:
        head = f"{prefix}{old}"
        if path == head or path.startswith(head + "."):
            return f"{prefix}{new}" + path[len(head) :]
        return path

    out_records: dict[int, StorageRecord] = {}
    for sid, rec in records.items():
        if rec.owner == 1:
            for c in range(last + 1):
                out_records[copy_sid(sid, c)] = replace(
                    rec, sid=copy_sid(sid, c), owner=1 + c, module=rename(rec.module, 1, 1 + c)
                )
        elif rec.owner == 2:
            out_records[sid] = replace(
                rec, owner=num_blocks - 1, module=rename(rec.module, 2, num_blocks - 1)
            )
        else:
            out_records[sid] = rec

    out: list[Event] = []
    for s, e, owner in runs:
        if owner != 1:
            new_owner = num_blocks - 1 if owner == 2 else owner
            for ev in events[s:e]:
                sid = ev[1]
                module = rename(ev[5], 2, num_blocks - 1) if owner == 2 else ev[5]
                if records[sid].owner == 1:
                    if owner in (0, 2):
                        sid = copy_sid(sid, last if owner == 2 else 0)
                    elif ev[0] == FREE:
                        # Released outside any block (e.g. outputs dropped after forward): every
                        # copy is released at this point, in block order.
                        for c in range(last + 1):
                            out.append((FREE, copy_sid(sid, c), ev[2], ev[3], ev[4], module, -1))
                        continue
                    else:
                        raise ReplayMismatch(f"a non-block event allocates block storage at {s}")
                out.append((ev[0], sid, ev[2], ev[3], ev[4], module, new_owner))
            continue
        order = range(last, -1, -1) if descending[s] else range(last + 1)
        last_in_time = order[-1]
        for c in order:
            for ev in events[s:e]:
                ref = ref_from_copy(ev[1], c)
                if ref is None:
                    if ev[0] == FREE and c != last_in_time:
                        continue
                    if ev[0] == ALLOC:
                        raise ReplayMismatch(f"block run allocates a non-block storage at {s}")
                    ref = ev[1]
                out.append((ev[0], ref, ev[2], ev[3], ev[4], rename(ev[5], 1, 1 + c), 1 + c))
    return out_records, out


def _lookup(table: dict[int, int], sid: int) -> int:
    try:
        return table[sid]
    except KeyError:
        raise ReplayMismatch(f"storage {sid} has no counterpart in block 1") from None
