"""`MemoryProfile`: the one result type for estimated and measured memory.

Built from an event stream (the tracer's, or a measurement's), it holds the peak of allocated
memory and when it happens (phase, op, module), the bytes per category and per module at that
peak, the peak of each phase, and the timeline. Device-level figures (reserved memory from the
allocator simulation, CUDA context and workspaces) are attached by `memfit.estimate`.

Every byte count is an int. Block sizes are rounded as the CUDA caching allocator rounds them
(`memfit.cuda.allocator_config.cuda_block_size`; in an estimate, the block the allocator simulation
handed out, which
is larger when the rest of a block was too small to split off), so `peak_allocated_bytes` is
what `torch.cuda.max_memory_allocated` would report.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from memfit.cuda.allocator_config import cuda_block_size
from memfit.events import ALLOC, CATEGORIES, Event, StorageRecord


def live_sids(events: Iterable[Event]) -> list[int]:
    """The storages still allocated after `events`, in allocation order."""
    alive: dict[int, None] = {}
    for ev in events:
        if ev.kind == ALLOC:
            alive[ev.sid] = None
        else:
            alive.pop(ev.sid, None)
    return list(alive)


@dataclass(frozen=True, kw_only=True)
class PhasePeak:
    step: int
    phase: str
    peak_bytes: int


@dataclass(kw_only=True)
class MemoryProfile:
    """Peak memory of a step, broken down. Integer bytes everywhere.

    Attributes:
        peak_allocated_bytes: max over the step of live (rounded) bytes on the device.
        peak_index: index in `timeline` of that peak.
        peak_step, peak_phase, peak_op, peak_module: where the peak happens.
        breakdown: bytes per category at the peak (keys of memfit.events.CATEGORIES).
        by_module: bytes per allocating module path at the peak ("" is the top level).
        phases: the peak of each (step, phase).
        timeline: live bytes after each event (allocated), in event order.
        timeline_phases: the (step, phase) of each timeline point.
        peak_reserved_bytes / device_total_bytes / reserved_breakdown: filled by the estimate
            (allocator simulation and device overhead); None until then.
    """

    peak_allocated_bytes: int
    peak_index: int
    peak_step: int
    peak_phase: str
    peak_op: str
    peak_module: str
    breakdown: dict[str, int]
    by_module: dict[str, int]
    phases: list[PhasePeak]
    timeline: list[int]
    timeline_phases: list[tuple[int, str]]
    top_tensors: list[dict[str, Any]] = field(default_factory=list)
    max_activation_bytes: int = 0
    peak_reserved_bytes: int | None = None
    device_total_bytes: int | None = None
    device_breakdown: dict[str, int] = field(default_factory=dict)
    #: The stream the profile was built from (records by storage id, events in order), kept by
    #: reference for renderers that need more than the totals (timeline by category, the
    #: memory_viz export). Not part of equality or repr.
    records: dict[int, StorageRecord] = field(default_factory=dict, compare=False, repr=False)
    events: list[Event] = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def from_events(
        cls,
        records: dict[int, StorageRecord],
        events: Iterable[Event],
        *,
        top_n: int = 10,
        block_bytes: dict[int, int] | None = None,
    ) -> MemoryProfile:
        """Build the profile of a stream; host-side storages (`record.host`) are not counted.

        Each storage counts as its 512-byte-rounded size, or as the size of the block the
        allocator simulation gave it (`block_bytes`, by storage id) where there is one.
        """
        events = list(events)
        given = block_bytes or {}
        sizes = {
            sid: (0 if r.host else given.get(sid) or cuda_block_size(r.nbytes))
            for sid, r in records.items()
        }
        live = 0
        peak = -1
        peak_i = 0
        timeline: list[int] = []
        tl_phases: list[tuple[int, str]] = []
        phase_peak: dict[tuple[int, str], int] = {}
        act = 0
        max_act = 0
        for i, ev in enumerate(events):
            kind, sid, phase, step = ev.kind, ev.sid, ev.phase, ev.step
            delta = sizes[sid] if kind == ALLOC else -sizes[sid]
            live += delta
            if records[sid].category == "activations":
                act += delta
                max_act = max(max_act, act)
            timeline.append(live)
            key = (step, phase)
            tl_phases.append(key)
            if live > phase_peak.get(key, -1):
                phase_peak[key] = live
            if live > peak:
                peak, peak_i = live, i
        if not events:
            peak = 0
        alive = live_sids(events[: peak_i + 1])
        breakdown = dict.fromkeys(CATEGORIES, 0)
        by_module: dict[str, int] = defaultdict(int)
        for sid in alive:
            rec = records[sid]
            if rec.host:
                continue
            breakdown[rec.category] += sizes[sid]
            by_module[rec.module] += sizes[sid]
        top = sorted((records[s] for s in alive if not records[s].host), key=lambda r: -r.nbytes)
        top_tensors = [
            {
                "bytes": sizes[r.sid],
                "category": r.category,
                "module": r.module,
                "op": r.op,
                "phase": r.phase,
            }
            for r in top[:top_n]
        ]
        pe = events[peak_i] if events else Event(ALLOC, -1, "setup", 0, "", "", -1)
        return cls(
            peak_allocated_bytes=peak,
            peak_index=peak_i,
            peak_step=pe.step,
            peak_phase=pe.phase,
            peak_op=pe.op,
            peak_module=pe.module,
            breakdown=breakdown,
            by_module=dict(sorted(by_module.items(), key=lambda kv: -kv[1])),
            phases=[PhasePeak(step=s, phase=p, peak_bytes=b) for (s, p), b in phase_peak.items()],
            timeline=timeline,
            timeline_phases=tl_phases,
            top_tensors=top_tensors,
            max_activation_bytes=max_act,
            records=records,
            events=events,
        )

    def modules_at_depth(self, depth: int) -> dict[str, int]:
        """`by_module` summed up to module paths of at most `depth` components."""
        out: dict[str, int] = defaultdict(int)
        for path, b in self.by_module.items():
            key = ".".join(path.split(".")[:depth]) if path else "<top>"
            out[key] += b
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))
