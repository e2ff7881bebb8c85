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

from collections.abc import Callable
from typing import Any

from memfit.events import ALLOC, FREE, Event, StorageRecord
from memfit.models.layers import LayerUnits

TRACED_BLOCKS = 3


class ReplayMismatch(Exception):
    """The traced blocks do not behave identically; the whole model must be traced."""


def _effective_owners(events: list[Event], records: dict[int, StorageRecord]) -> list[int]:
    """The block each event is replayed with (see Note: [How the stream is expanded]).

    Two kinds of free are moved into a neighbouring block's run:
    - frees sandwiched between events of one block, or of no block (a per-parameter optimizer
      frees the previous parameter's temporary while it works on the next one);
    - in forward, frees right after a block's events and outside any block (the parent loop
      releases the previous block's output once the next block has returned).
    """
    own = [ev.owner for ev in events]
    n = len(events)
    # Host storages (CPU-side scalars) carry no device bytes. One whose owner matches neither
    # nearest device event (a step increment created after the per-parameter loop, owned by
    # whichever parameter was looked up last) belongs to no block, so it never splits a run.
    # A parameter belongs to its module's block wherever it lives (FSDP2's CPU offload keeps
    # the shards on the host).
    device = [not records[ev.sid].host for ev in events]
    for i, ev in enumerate(events):
        if device[i] or records[ev.sid].category == "parameters":
            continue
        near = set()
        for step in (-1, 1):
            k = i + step
            while 0 <= k < n and not device[k]:
                k += step
            if 0 <= k < n and events[k].phase == ev.phase and events[k].step == ev.step:
                near.add(own[k])
        if own[i] not in near:
            own[i] = -1

    def same_span(a: int, b: int) -> bool:
        return events[a][2] == events[b][2] and events[a][3] == events[b][3]

    i = 0
    while i < n:
        if events[i][0] != FREE:
            i += 1
            continue
        j = i
        while j < n and events[j][0] == FREE and same_span(i, j):
            j += 1
        prev = own[i - 1] if i > 0 and same_span(i - 1, i) else None
        nxt = own[j] if j < n and same_span(j, i) else None
        if prev is not None and prev == nxt:
            own[i:j] = [prev] * (j - i)
        elif prev is not None and prev >= 0 and events[i][2] == "forward":
            for k in range(i, j):
                if own[k] < 0:
                    own[k] = prev
        i = j
    # A single free between two events of one other owner joins them (in zero_grad, the
    # gradient of a non-block parameter that block 0's backward happened to allocate).
    for i in range(1, n - 1):
        if (
            events[i][0] == FREE
            and own[i - 1] == own[i + 1] != own[i]
            and same_span(i - 1, i)
            and same_span(i, i + 1)
        ):
            own[i] = own[i - 1]
    return own


def _runs(events: list[Event], own: list[int]) -> list[tuple[int, int, int]]:
    """(start, end, owner) of each run of consecutive events with one owner and phase.

    A run also ends where a list of optimizer temporaries (a foreach op's outputs, or a list
    built per parameter) gives way to its frees: a Python list frees its items from the end,
    so the block at the end of the parameter list would otherwise merge its allocations and
    its frees into one run.
    """
    runs = []
    start = 0
    for i in range(1, len(events) + 1):
        if (
            i == len(events)
            or own[i] != own[start]
            or events[i][2] != events[start][2]
            or events[i][3] != events[start][3]
            or (
                events[i][0] == FREE
                and events[i - 1][0] == ALLOC
                # In backward a block's events stay one run: with the optimizer step in
                # backward, each parameter's foreach step lies inside its block's backward.
                and events[i][2] != "backward"
                and (
                    events[i - 1][4].startswith("_foreach")
                    # A list built in the optimizer (e.g. Adafactor's per-parameter norms)
                    # released from its end: the first of several frees is of the last of
                    # several allocations by one op.
                    or (
                        events[i][2] == "optimizer"
                        and events[i][1] == events[i - 1][1]
                        and i + 1 < len(events)
                        and events[i + 1][0] == FREE
                        and i >= 2
                        and events[i - 2][0] == ALLOC
                        and events[i - 2][4] == events[i - 1][4]
                    )
                )
            )
        ):
            runs.append((start, i, own[start]))
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
    ex = _Expansion(records, events, num_blocks, block_paths)
    out: list[Event] = []
    for s, e, owner in ex.runs:
        if owner == 1:
            ex.replicate_block_run(s, e, out)
        else:
            ex.copy_outside_run(s, e, owner, out)
    return ex.expanded_records(), out


class _Expansion:
    """One expansion: T1 (the middle traced block) is copied `last + 1` times (copies c = 0
    .. last; c = 0 is the traced T1), T0 stays block 0 and T2 becomes the last block."""

    def __init__(
        self,
        records: dict[int, StorageRecord],
        events: list[Event],
        num_blocks: int,
        block_paths: list[str],
    ) -> None:
        self.records, self.events, self.num_blocks = records, events, num_blocks
        self.last = num_blocks - TRACED_BLOCKS
        self.own_of = _effective_owners(events, records)
        self.runs = _runs(events, self.own_of)
        self.offset = max(records) + 1 if records else 1
        first = block_paths[0]
        self.prefix = first.rsplit(".", 1)[0] + "." if "." in first else ""
        self.head, self.period = _layout(block_paths)
        self.corr_prev: dict[int, int] = {}  # T0 sid -> the T1 sid in the same role
        self.corr_next: dict[int, int] = {}  # T2 sid -> T1 sid
        self.descending: dict[int, bool] = {}  # T1 run start -> runs in descending block order
        self._pair_blocks()

    def _pair_blocks(self) -> None:
        """Match the runs of blocks 1 and 2 event by event, and pair their storages."""
        by_owner: dict[int, list[tuple[int, int]]] = {1: [], 2: []}
        for s, e, o in self.runs:
            if o in by_owner:
                by_owner[o].append((s, e))
        if len(by_owner[1]) != len(by_owner[2]):
            raise ReplayMismatch(
                f"blocks 1 and 2 have different numbers of event runs "
                f"({len(by_owner[1])}, {len(by_owner[2])})"
            )
        events, records = self.events, self.records
        for (s1, e1), (s2, e2) in zip(by_owner[1], by_owner[2], strict=True):
            if self._signature(s1, e1) != self._signature(s2, e2):
                raise ReplayMismatch(f"block runs differ at event {s1} (op {events[s1].op})")
            self.descending[s1] = s2 < s1
            a1, a2 = (
                [ev.sid for ev in events[s:e] if ev.kind == ALLOC and not records[ev.sid].host]
                for s, e in ((s1, e1), (s2, e2))
            )
            self.corr_next.update(zip(a2, a1, strict=True))
            # Block 1 frees block 0's storage where block 2 frees block 1's: that pairs them.
            # Block 0 itself may differ from the others (its input may need no gradient, as
            # with a frozen embedding), so it is not the pattern; it is kept as traced.
            p1, p2 = (
                [
                    ev.sid
                    for ev in events[s:e]
                    if ev.kind == FREE
                    and not records[ev.sid].host
                    and records[ev.sid].owner == k - 1
                ]
                for s, e, k in ((s1, e1, 1), (s2, e2, 2))
            )
            self.corr_prev.update(zip(p1, p2, strict=True))

    def _signature(self, s: int, e: int) -> list[tuple[int, int, str]]:
        # A block's signature: its allocations, the frees of its own storages, and the frees of
        # the previous block's storages (marked -2). Frees of the next block's storages differ
        # at the end of the stack (the last block has none) and are remapped by relation;
        # frees of shared storages happen once, in whichever block uses them last.
        own = self.own_of[s]
        sig = []
        for ev in self.events[s:e]:
            rec = self.records[ev.sid]
            if rec.host:
                continue
            if ev.kind == ALLOC or rec.owner == own:
                sig.append((ev.kind, rec.nbytes, ev.op))
            elif rec.owner == own - 1:
                sig.append((-2, rec.nbytes, ev.op))
        return sig

    def copy_sid(self, sid: int, c: int) -> int:
        return sid if c == 0 else sid + c * self.offset

    def _rename(self, path: str, old: int, new: int) -> str:
        return self._renamer(path, old)(new)

    def _fixed_owner(self, o: int, run_owner: int) -> int:
        # Outside T1's runs: T0 stays block 0 and T2 becomes the last block; T1 is the copy
        # next to the run's block (the first copy beside T0, the last beside T2).
        if o == 2:
            return self.num_blocks - 1
        if o == 1 and run_owner == 2:
            return self.num_blocks - 2
        return o

    def expanded_records(self) -> dict[int, StorageRecord]:
        out: dict[int, StorageRecord] = {}
        last, n, offset = self.last, self.num_blocks, self.offset
        for sid, rec in self.records.items():
            if rec.owner == 1:
                renamed = self._renamer(rec.module)
                for c in range(last + 1):
                    out[sid + c * offset] = rec.moved(sid + c * offset, 1 + c, renamed(1 + c))
            elif rec.owner == 2:
                out[sid] = rec.moved(sid, n - 1, self._rename(rec.module, 2, n - 1))
            else:
                out[sid] = rec
        return out

    def _renamer(self, path: str, old: int = 1) -> Callable[[int], str]:
        """new -> `path` with block `old` renamed block `new` (a path outside block `old` stays):
        made once per path, called once per copy. A block is a unit of `period` layers after
        the first `head` (one layer each, unless the model is replayed by units): layer i of
        unit `old` becomes layer i + (new - old) * period."""
        prefix = self.prefix
        if not path.startswith(prefix):
            return lambda new: path
        index, dot, tail = path[len(prefix) :].partition(".")
        if not index.isdigit():
            return lambda new: path
        layer = int(index)
        unit = 0 if layer < self.head else 1 + (layer - self.head) // self.period
        if unit != old:
            return lambda new: path
        period, rest = self.period, dot + tail
        return lambda new: f"{prefix}{layer + (new - old) * period}{rest}"

    def copy_outside_run(self, s: int, e: int, owner: int, out: list[Event]) -> None:
        """A run of T0, T2 or outside any block: copied once, T2 renamed to the last block."""
        released: list[Event] = []  # consecutive frees of T1 storages outside any block
        records, n = self.records, self.num_blocks
        for ev in self.events[s:e]:
            sid = ev.sid
            module = self._rename(ev.module, 2, n - 1) if owner == 2 else ev.module
            if records[sid].owner == 1 and owner not in (0, 2):
                if ev.kind != FREE:
                    raise ReplayMismatch(
                        f"a non-block event allocates block storage at {s}: {ev.op} in "
                        f"{ev.module or '<top>'} ({ev.phase}, step {ev.step})"
                    )
                released.append(ev)
                continue
            _flush_released(released, out, self.last, self.copy_sid)
            if records[sid].owner == 1:
                sid = self.copy_sid(sid, self.last if owner == 2 else 0)
            out.append(
                ev._replace(sid=sid, module=module, owner=self._fixed_owner(ev.owner, owner))
            )
        _flush_released(released, out, self.last, self.copy_sid)

    def replicate_block_run(self, s: int, e: int, out: list[Event]) -> None:
        """A run of T1: once per copy, in the order the blocks ran (descending in backward)."""
        order = range(self.last, -1, -1) if self.descending[s] else range(self.last + 1)
        last_in_time = order[-1]
        # Each event once: how its storage is named in copy c (_ref_from_copy, unrolled)
        # and its module's name there.
        plan = []
        for ev in self.events[s:e]:
            owner = self.records[ev.sid].owner
            if owner == 1:
                ref = (ev.sid, ev.sid, -1)  # the same copy's: sid + c * offset
            elif owner == 0:  # copy c-1's (block 0's for the first copy)
                ref = (_lookup(self.corr_prev, ev.sid) - self.offset, ev.sid, 0)
            elif owner == 2:  # copy c+1's (the traced T2 for the last copy)
                ref = (_lookup(self.corr_next, ev.sid) + self.offset, ev.sid, self.last)
            else:
                if ev.kind == ALLOC:
                    raise ReplayMismatch(f"block run allocates a non-block storage at {s}")
                ref = None
            plan.append((ev, ref, self._renamer(ev.module)))
        offset = self.offset
        for c in order:
            for ev, ref, renamed in plan:
                if ref is None:
                    if ev.kind == FREE and c != last_in_time:
                        continue
                    sid = ev.sid  # shared: freed once, in the copy last in time
                else:
                    base, fixed, at = ref
                    sid = fixed if c == at else base + c * offset
                who = -1 if ev.owner < 0 else ev.owner + c  # T0, T1, T2 are blocks c, 1+c, 2+c
                out.append(Event(ev.kind, sid, ev.phase, ev.step, ev.op, renamed(1 + c), who))


def _layout(block_paths: list[str]) -> tuple[int, int]:
    """(head, period) of the blocks: the layer index of block 1's first layer, and the layers
    from it to block 2's (1, 1 for blocks of one layer each; memfit.models.layers.LayerUnits)."""
    try:
        first, second, third = (int(p.rsplit(".", 1)[-1]) for p in block_paths[:3])
    except ValueError:  # blocks not named by index: one layer each
        return 1, 1
    return second - first, third - second


def _flush_released(
    released: list[Event], out: list[Event], last: int, copy_sid: Callable[[int, int], int]
) -> None:
    """Frees of T1 storages outside any block (outputs dropped after forward, the autocast
    cache cleared): every copy releases its storages at this point, block after block."""
    for c in range(last + 1):
        for r in released:
            who = 1 + c if r.owner == 1 else r.owner
            out.append(r._replace(kind=FREE, sid=copy_sid(r.sid, c), owner=who))
    released.clear()


def _lookup(table: dict[int, int], sid: int) -> int:
    try:
        return table[sid]
    except KeyError:
        raise ReplayMismatch(f"storage {sid} has no counterpart in block 1") from None


def by_units(trace: Any, units: LayerUnits, count: int) -> bool:
    """File a trace of the first `count` units of a model replayed by units of layers
    (memfit.models.layers.LayerUnits; the tracer filed it by layer, its blocks being the layers)
    under those units: the owner of every event and storage of layer i becomes unit
    `units.unit_of(i)`, FLOPs too, and `block_paths` the first layer of each unit (`expand`
    reads the units' layout from them). False, and the trace left as it is, when its layers
    are not those of `count` units."""
    layers = trace.block_paths
    if len(layers) != units.layers_of(count):
        return False

    def unit(owner: int) -> int:
        return owner if owner < 0 else units.unit_of(owner)

    trace.events = [ev._replace(owner=unit(ev.owner)) for ev in trace.events]
    for rec in trace.records.values():
        rec.owner = unit(rec.owner)
    flops: dict[tuple[int, str, int], int] = {}
    for (step, phase, owner), f in trace.flops.items():
        flops[(step, phase, unit(owner))] = flops.get((step, phase, unit(owner)), 0) + f
    trace.flops = flops
    trace.block_paths = [layers[0], *(layers[units.layers_of(u)] for u in range(1, count))]
    return True
