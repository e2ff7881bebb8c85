"""Decode steps extended: trace a few model calls of a generation, rebuild the stream of N.

A generation of N tokens calls the model N times, and from one decode step to the next only the
context grows, by one position. `extend_decode` traces TRACED_CALLS calls (and two short
checks) instead of N, and rebuilds the stream of N calls, verified as the block replay is.

Note: [How the decode steps are extended]
    The stream is cut at its CALL_END_OP markers into segments: segment 0 is generate's setup
    and the prefill; segment s (1 <= s < calls) is the bookkeeping after call s - 1 (the next
    token picked and appended to the ids, the stopping check) followed by model call s; the
    tail is what follows the last call (the last token, beam search's final selection).

    Every event is written in a form that names no storage: an allocation by its record (bytes,
    category, op, module, owner, cache layer); a free by the allocation it frees, as (segments
    back, index among that segment's allocations), or by its index in segment 0 for setup and
    prefill storages. In that form consecutive decode segments are the same list, except for
    integer fields that grow by the same amount each step: bytes (the keys and values of each
    layer, the attention scores, the ids: one more position each), the step, the forward
    region. So, from three traces:

      A, K = TRACED_CALLS calls: segments 0..K-1 are kept as traced; the template of a decode
        segment is A's last two segments (same form, each integer linear in s);
      B, K + 1 calls: its segments 0..K-1 must equal A's; the tail's integers are linear in
        the number of calls, from A's tail and B's;
      C, K + 3 calls: the stream predicted for K + 3 calls must equal C event for event and
        record for record (and the FLOPs step for step).

    Only then is the stream of N calls built; otherwise the caller traces all N calls
    (`extend_decode` does, and says so in `DecodeExtension.extended`). A static cache is
    allocated at the whole workload's length whatever the calls traced
    (generation.generate_kwargs), so its segments are constant and fit the same form.

    The last call of a static cache's generation may differ from the steps before it: it
    fills the cache. On transformers < 5.18, masking_utils.prepare_padding_mask pads
    generate's 2-D mask to the cache's length on every call but the last, where the mask is
    as long as the cache (no pad is made). No trace of K calls sees that call, so the caller
    gives a fourth tracer, `trace_filled(n)`: a generation of n calls whose last call fills
    the same cache (a prompt longer by N - n: the same cache and mask lengths as the
    workload's last calls):
      E, K calls: its prefill and its segment K - 2 must have the forms of A's prefill and of
        the predicted segment N - 2; the events of its segment K - 2 that its last segment
        does not make (a last call may only make fewer) are dropped from the predicted last
        segment, whose other events keep the predicted integers (beam search sizes some of
        its bookkeeping by the tokens generated, which E does not share);
      F, K + 1 calls: its last segment must drop the same events;
    and the result's last segment and tail must have the forms of E's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from memfit.events import ALLOC, Event, StorageRecord

#: Model calls traced for the template (the prefill and 4 decode steps): segments 1 and 2 may
#: differ from the steady state (the prefill's cache and logits are released in them), so the
#: template is fitted on segments 3 and 4.
TRACED_CALLS = 5
#: Calls of the verification trace C: TRACED_CALLS + VERIFY_EXTRA.
VERIFY_EXTRA = 3
#: A generation of at most this many calls is traced whole: the extension traces A, B and C,
#: TRACED_CALLS * 3 + 1 + VERIFY_EXTRA calls in all, which is no cheaper.
EXTEND_ABOVE = 3 * TRACED_CALLS + 1 + VERIFY_EXTRA

#: The op name of the zero-byte marker left in the stream at the end of every model call; the
#: estimate reads the KV cache there and removes the markers before the allocator replay.
CALL_END_OP = "<model_call_end>"
#: The Trace attribute holding the KV storages' cache layers (storage id -> layer).
KV_LAYER_ATTR = "_memfit_kv_layer"


class DecodeMismatch(Exception):
    """The traced decode steps do not extend (their forms differ); trace every call."""


# One event in storage-free form: (fixed fields, integer fields linear in the step).
_Canon = tuple[tuple[Any, ...], tuple[int, ...]]


@dataclass
class _Segments:
    """A traced generation cut into segments 0..calls-1 and the tail (index `calls`)."""

    calls: int
    #: Per segment (the tail last): its events in storage-free form.
    canon: list[list[_Canon]]
    #: Per segment (the tail last): the storage ids its allocations made, in order.
    allocs: list[list[int]]


def _cut(trace: Any) -> _Segments:
    events: list[Event] = trace.events
    records: dict[int, StorageRecord] = trace.records
    kv_layer: dict[int, int] = getattr(trace, KV_LAYER_ATTR, {})
    marks = [i for i, ev in enumerate(events) if ev.op == CALL_END_OP]
    bounds = [0] + [m + 1 for m in marks] + [len(events)]
    calls = len(marks)
    where: dict[int, tuple[int, int]] = {}  # sid -> (segment, index among its allocations)
    seg = _Segments(calls=calls, canon=[], allocs=[])
    for s in range(calls + 1):
        raw = events[bounds[s] : bounds[s + 1]]
        canon: list[_Canon] = []
        allocs: list[int] = []
        for ev in raw:
            if ev.kind == ALLOC:
                r = records[ev.sid]
                where[ev.sid] = (s, len(allocs))
                allocs.append(ev.sid)
                fixed: tuple[Any, ...] = (
                    ALLOC, ev.phase, ev.op, ev.module, ev.owner, str(r.category), r.phase, r.op,
                    r.module, r.owner, r.host, r.paged, kv_layer.get(ev.sid),
                )  # fmt: skip
                canon.append((fixed, (r.nbytes, ev.step, r.step, r.region)))
            else:
                if ev.sid not in where:
                    raise DecodeMismatch(f"a free of storage {ev.sid} before its allocation")
                at, index = where[ev.sid]
                ref = ("prefill", index) if at == 0 else ("back", s - at, index)
                canon.append(((ev.kind, ref, ev.phase, ev.op, ev.module, ev.owner), (ev.step,)))
        seg.canon.append(canon)
        seg.allocs.append(allocs)
    return seg


def _linear(a: list[_Canon], b: list[_Canon], what: str) -> list[tuple[int, ...]]:
    """Per event, how its integers grow from `a` to `b` (same form required)."""
    if len(a) != len(b) or any(x[0] != y[0] for x, y in zip(a, b, strict=True)):
        raise DecodeMismatch(f"{what} differ in form")
    pairs = zip(a, b, strict=True)
    return [tuple(q - p for p, q in zip(x[1], y[1], strict=True)) for x, y in pairs]


@dataclass
class _Model:
    """The stream of any number of calls, from traces A (K calls) and B (K + 1 calls).

    An integer of segment s in a generation of `calls` calls is A's, plus (s - (K - 1)) times
    its growth per step (A's last two segments) for s >= K, plus (calls - K) times its growth
    per call (B less A: what generate sizes by the length it will reach, as beam search's
    running sequences).
    """

    a: Any
    seg: _Segments
    per_call: list[list[tuple[int, ...]]]  # per segment 0..K-1, per event: B less A
    growth: list[tuple[int, ...]]  # per event of a decode segment, per step
    tail_growth: list[tuple[int, ...]]  # per tail event, per call
    flops_a: dict[tuple[int, str, int], int]
    flops_b: dict[tuple[int, str, int], int]

    @classmethod
    def fit(cls, a: Any, b: Any) -> _Model:
        sa, sb = _cut(a), _cut(b)
        k = sa.calls
        if k < 3 or sb.calls != k + 1:
            raise DecodeMismatch(f"traces of {sa.calls} and {sb.calls} calls")
        per_call = [
            _linear(sa.canon[s], sb.canon[s], f"call {s} of the two traces") for s in range(k)
        ]
        growth = _linear(sa.canon[k - 2], sa.canon[k - 1], "consecutive decode steps")
        tail_growth = _linear(sa.canon[k], sb.canon[k + 1], "the tails after the last call")
        return cls(
            a=a, seg=sa, per_call=per_call, growth=growth, tail_growth=tail_growth,
            flops_a=dict(a.flops), flops_b=dict(b.flops),
        )  # fmt: skip

    def stream(self, calls: int) -> tuple[dict[int, StorageRecord], list[Event], dict[int, int]]:
        """Records, events and the KV layer map of a generation of `calls` model calls."""
        k, canon = self.seg.calls, self.seg.canon
        made = {sid for allocs in self.seg.allocs for sid in allocs}
        # Records no event allocates (none known) are carried as they are.
        records = {sid: r for sid, r in self.a.records.items() if sid not in made}
        events: list[Event] = []
        kv_layer: dict[int, int] = {}
        allocs: list[list[int]] = []
        next_sid = max(self.a.records) + 1
        more = calls - k

        def emit(s: int, form: list[_Canon], *grows: tuple[list[tuple[int, ...]], int]) -> None:
            nonlocal next_sid
            mine: list[int] = []
            allocs.append(mine)
            for i, (fixed, ints) in enumerate(form):
                now = list(ints)
                for grow, times in grows:
                    now = [v + times * g for v, g in zip(now, grow[i], strict=True)]
                if fixed[0] == ALLOC:
                    _, phase, op, module, owner, cat, r_phase, r_op, r_module, r_owner = fixed[:10]
                    host, paged, layer = fixed[10:]
                    nbytes, step, r_step, region = now
                    sid, next_sid = next_sid, next_sid + 1
                    records[sid] = StorageRecord(
                        sid, nbytes, cat, r_phase, r_step, r_op, r_module, r_owner, region,
                        host, paged,
                    )  # fmt: skip
                    if layer is not None:
                        kv_layer[sid] = layer
                    mine.append(sid)
                    events.append(Event(ALLOC, sid, phase, step, op, module, owner))
                else:
                    kind, ref, phase, op, module, owner = fixed
                    sid = allocs[0][ref[1]] if ref[0] == "prefill" else allocs[s - ref[1]][ref[2]]
                    events.append(Event(kind, sid, phase, now[0], op, module, owner))

        for s in range(k):
            emit(s, canon[s], (self.per_call[s], more))
        for s in range(k, calls):
            emit(s, canon[k - 1], (self.growth, s - (k - 1)), (self.per_call[k - 1], more))
        emit(calls, canon[k], (self.tail_growth, more))
        return records, events, kv_layer

    def decode_segment(self, s: int, calls: int) -> list[_Canon]:
        """Segment s (K <= s < calls) of a generation of `calls` calls, in storage-free form."""
        k = self.seg.calls
        steps, more = s - (k - 1), calls - k
        return [
            (
                fixed,
                tuple(v + steps * g + more * c for v, g, c in zip(ints, grow, per, strict=True)),
            )
            for (fixed, ints), grow, per in zip(
                self.seg.canon[k - 1], self.growth, self.per_call[k - 1], strict=True
            )
        ]

    def flops(self, calls: int) -> dict[tuple[int, str, int], int]:
        """FLOPs by (step, phase, owner): steps before K - 1 as in A; the middle steps linear
        from B's steps K - 2 and K - 1; the last step linear from A's last and B's last."""
        k = self.seg.calls
        out = {key: f for key, f in self.flops_a.items() if key[0] < k - 1}
        b = self.flops_b
        for phase, owner in {(key[1], key[2]) for key in b if key[0] >= k - 2}:
            f1, f0 = b.get((k - 1, phase, owner), 0), b.get((k - 2, phase, owner), 0)
            for step in range(k - 1, calls - 1):
                out[(step, phase, owner)] = f1 + (step - (k - 1)) * (f1 - f0)
        for phase, owner in {(key[1], key[2]) for key in (*self.flops_a, *b)}:
            last_a = self.flops_a.get((k - 1, phase, owner), 0)
            last_b = b.get((k, phase, owner), 0)
            value = last_a + (calls - k) * (last_b - last_a)
            if value or (calls - 1, phase, owner) in out:
                out[(calls - 1, phase, owner)] = value
        return {key: f for key, f in out.items() if f}

    def trace(self, calls: int) -> Any:
        records, events, kv_layer = self.stream(calls)
        out = replace(self.a, records=records, events=events, flops=self.flops(calls))
        setattr(out, KV_LAYER_ATTR, kv_layer)
        return out


@dataclass
class DecodeExtension:
    """A generation's trace, and how it was made.

    Attributes:
        trace: the stream of all the generation's model calls (a step_runner.Trace).
        extended: True when TRACED_CALLS calls were traced and the rest rebuilt (verified
            against a trace of TRACED_CALLS + VERIFY_EXTRA calls); False when every call was
            traced (a short generation, or decode steps that did not extend).
        why_not: when a long generation was traced whole, the form that differed.
    """

    trace: Any
    extended: bool
    why_not: str | None = None


def extend_decode(
    trace_calls: Callable[[int], Any],
    calls: int,
    *,
    why_not: str | None = None,
    trace_filled: Callable[[int], Any] | None = None,
) -> DecodeExtension:
    """The trace of a generation of `calls` model calls, from `trace_calls(n)` (a Trace of a
    generation of n calls), extended from a few calls when that is verified exactly.

    See Note: [How the decode steps are extended]. `trace_calls(TRACED_CALLS)` is called
    first, so a caller may reuse a trace it already made for that many calls. `why_not`: the
    caller knows the decode steps change beyond the traced ones (a quantized cache's flush,
    which a check on TRACED_CALLS + VERIFY_EXTRA calls would not see): every call is traced.
    `trace_filled(n)`: the caller knows the last call differs (it fills a static cache): a
    generation of n calls whose last call is the workload's last, from which the last call
    and the tail are taken.
    """
    if calls <= EXTEND_ABOVE:
        return DecodeExtension(trace_calls(calls), extended=False)
    if why_not is not None:
        return DecodeExtension(trace_calls(calls), extended=False, why_not=why_not)
    a = trace_calls(TRACED_CALLS)
    b = trace_calls(TRACED_CALLS + 1)
    c = trace_calls(TRACED_CALLS + VERIFY_EXTRA)
    try:
        model = _Model.fit(a, b)
        predicted = model.trace(TRACED_CALLS + VERIFY_EXTRA)
        if _cut(predicted).canon != _cut(c).canon:
            raise DecodeMismatch(f"the stream predicted for {_calls(c)} calls is not its trace")
        if predicted.flops != {key: f for key, f in c.flops.items() if f}:
            raise DecodeMismatch(f"the FLOPs predicted for {_calls(c)} calls are not traced")
        out = model.trace(calls)
        if trace_filled is not None:
            out = _last_call_filled(out, model, trace_filled, calls)
    except DecodeMismatch as e:
        return DecodeExtension(trace_calls(calls), extended=False, why_not=str(e))
    return DecodeExtension(out, extended=True)


def _keys(seg: _Segments, s: int) -> list[tuple[Any, ...]]:
    """Segment s's events, each named by what it is without an index: an allocation by its
    fixed fields, a free by its own and those of the allocation it frees (and how far back)."""
    keys: list[tuple[Any, ...]] = []
    for fixed, _ in seg.canon[s]:
        if fixed[0] == ALLOC:
            keys.append(fixed)
            continue
        ref = fixed[1]
        at, index = (0, ref[1]) if ref[0] == "prefill" else (s - ref[1], ref[2])
        allocs = [f for f, _ in seg.canon[at] if f[0] == ALLOC]
        keys.append((fixed[0], *fixed[2:], s - at, allocs[index]))
    return keys


def _dropped(seg: _Segments, before: int, last: int) -> list[int]:
    """Positions of the events of segment `before` that segment `last` does not make (its
    events are `before`'s less those); DecodeMismatch when it makes others."""
    import difflib

    a, b = _keys(seg, before), _keys(seg, last)
    dropped: list[int] = []
    for op, i1, i2, _, _ in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "delete":
            dropped.extend(range(i1, i2))
        elif op != "equal":
            raise DecodeMismatch("the last call makes what the steps before it do not")
    return dropped


def _last_call_filled(
    out: Any, model: _Model, trace_filled: Callable[[int], Any], calls: int
) -> Any:
    """The extended trace `out` with its last call made as a call that fills the cache makes
    it (see the Note): the events that call does not make, found in two filled traces, are
    dropped; DecodeMismatch when the filled traces do not fit the stream."""
    k = TRACED_CALLS
    e, f = _cut(trace_filled(k)), _cut(trace_filled(k + 1))
    if e.calls != k or f.calls != k + 1:
        raise DecodeMismatch(f"filled traces of {e.calls} and {f.calls} calls")
    forms = lambda form: [fixed for fixed, _ in form]  # noqa: E731
    if forms(e.canon[0]) != forms(model.seg.canon[0]):
        raise DecodeMismatch("the prefill of a generation that fills the cache differs in form")
    if forms(e.canon[k - 2]) != forms(model.decode_segment(calls - 2, calls)):
        raise DecodeMismatch("the step before the last differs from a generation that fills it")
    dropped = _dropped(e, k - 2, k - 1)
    if dropped != _dropped(f, k - 1, k):
        raise DecodeMismatch("the last calls of two generations that fill the cache differ")
    if dropped:
        marks = [i for i, ev in enumerate(out.events) if ev.op == CALL_END_OP]
        first = marks[calls - 2] + 1  # the last call's segment: after the marker before it
        drop = {first + i for i in dropped}
        sids = {out.events[i].sid for i in drop if out.events[i].kind == ALLOC}
        kv_layer = {sid: n for sid, n in getattr(out, KV_LAYER_ATTR, {}).items() if sid not in sids}
        out = replace(
            out,
            events=[ev for i, ev in enumerate(out.events) if i not in drop],
            records={sid: r for sid, r in out.records.items() if sid not in sids},
        )
        setattr(out, KV_LAYER_ATTR, kv_layer)
    got = _cut(out)
    if forms(got.canon[calls - 1]) != forms(e.canon[k - 1]) or forms(got.canon[calls]) != forms(
        e.canon[k]
    ):
        raise DecodeMismatch("the last call is not the one a generation that fills the cache makes")
    return out


def _calls(trace: Any) -> int:
    return sum(1 for ev in trace.events if ev.op == CALL_END_OP)
