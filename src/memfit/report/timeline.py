"""Renderers of a `MemoryProfile`'s timeline: live device bytes by category over the step.

`category_timeline` returns the data (integer bytes after each event, per category);
`render_png` draws it with matplotlib (the `plot` extra); `render_html` writes a
self-contained page (inline SVG and tables: no script, nothing fetched from the network).

The x axis is the event index: one point per allocation or free, in stream order, as in
`profile.timeline`. Host storages (`record.host`) keep their index but add no device bytes.
A storage counts under its final category (a backward buffer that became a gradient is a
gradient from its allocation on), as in `profile.breakdown`.

Example:
    >>> est = memfit.estimate("gpt2", memfit.Workload(batch_size=2, seq_len=128))
    >>> render_png(est.profile, "gpt2.png", title="gpt2, batch 2 x 128")
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

from memfit.cuda.allocator_config import cuda_block_size
from memfit.errors import BadInputError
from memfit.events import ALLOC, CATEGORIES
from memfit.profile import MemoryProfile
from memfit.units import BINARY_UNITS, format_bytes

#: One colour per category (Tableau 10, the palette of matplotlib's "tab10" and memory_viz).
CATEGORY_COLORS = {
    "parameters": "#4e79a7",
    "buffers": "#9c755f",
    "gradients": "#f28e2c",
    "optimizer_state": "#e15759",
    "inputs": "#76b7b2",
    "activations": "#59a14f",
    "temporaries": "#edc949",
    "workspaces": "#af7aa1",
}
PHASE_COLORS = {
    "setup": "#f2f2f2",
    "forward": "#dceaf7",
    "backward": "#fde5cf",
    "optimizer": "#eadff2",
    "zero_grad": "#e6e6e6",
}
_OTHER_PHASE_COLOR = "#eeeeee"
#: Points drawn at most per series; longer streams keep the min and max of each bucket (and
#: the peak, exactly).
DEFAULT_MAX_POINTS = 4000


@dataclass(frozen=True, kw_only=True)
class CategoryTimeline:
    """Live device bytes after each event: `total` (== `profile.timeline`) and, for every
    category of `memfit.events.CATEGORIES`, `by_category[c]`; at each index the categories sum to
    `total`."""

    total: tuple[int, ...]
    by_category: dict[str, tuple[int, ...]]

    def present(self) -> list[str]:
        """Categories that hold bytes at some point, in `CATEGORIES` order."""
        return [c for c in CATEGORIES if any(self.by_category[c])]


def category_timeline(profile: MemoryProfile) -> CategoryTimeline:
    """Live device bytes per category after each event of `profile.events`.

    Example:
        >>> ct = category_timeline(est.profile)
        >>> ct.by_category["activations"][est.profile.peak_index]
    """
    records, events = profile.records, profile.events
    if len(events) != len(profile.timeline):
        raise BadInputError(
            f"this profile carries {len(events)} events for {len(profile.timeline)} timeline "
            "points; build it with MemoryProfile.from_events(records, events) to render it."
        )
    unknown = sorted({r.category for r in records.values()} - set(CATEGORIES))
    if unknown:
        raise BadInputError(f"unknown categories {unknown}; expected one of {list(CATEGORIES)}.")
    deltas = {c: [0] * len(events) for c in CATEGORIES}
    for i, ev in enumerate(events):
        rec = records[ev.sid]
        if not rec.host:
            size = cuda_block_size(rec.nbytes)
            deltas[rec.category][i] = size if ev.kind == ALLOC else -size
    by_cat = {c: tuple(accumulate(d)) for c, d in deltas.items()}
    total = tuple(sum(col) for col in zip(*by_cat.values(), strict=True)) if events else ()
    return CategoryTimeline(total=total, by_category=by_cat)


def sample_indices(values: tuple[int, ...], keep: int, max_points: int) -> list[int]:
    """Indices to plot: all of them, or the min and max of each of `max_points // 2` buckets,
    plus the first, the last and `keep` (the peak), in order."""
    n = len(values)
    if n <= max_points:
        return list(range(n))
    out = {0, n - 1, keep}
    buckets = max(max_points // 2, 1)
    for b in range(buckets):
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        if lo < hi:
            chunk = range(lo, hi)
            out.add(min(chunk, key=values.__getitem__))
            out.add(max(chunk, key=values.__getitem__))
    return sorted(out)


def _unit(nbytes: int) -> tuple[str, int]:
    """The largest binary unit in which `nbytes` is at least 1."""
    name, div = BINARY_UNITS[0]
    for u, d in BINARY_UNITS:
        if nbytes >= d:
            name, div = u, d
    return name, div


def phase_spans(profile: MemoryProfile) -> list[tuple[int, int, str]]:
    """Runs of equal (step, phase) in the timeline as (start, end exclusive, label); the label
    is the phase, with the step when the stream has several."""
    tp = profile.timeline_phases
    multi = len({s for s, _ in tp}) > 1
    spans: list[tuple[int, int, str]] = []
    start = 0
    for i in range(1, len(tp) + 1):
        if i == len(tp) or tp[i] != tp[start]:
            step, phase = tp[start]
            spans.append((start, i, f"{phase} {step}" if multi else phase))
            start = i
    return spans


def label_fits(label: str, width_fraction: float, char_fraction: float) -> bool:
    """True when a phase label fits over a span of `width_fraction` of the plot width, with
    characters `char_fraction` of the plot width wide (and one character of margin a side)."""
    return width_fraction >= char_fraction * (len(label) + 2)


def _peak_text(p: MemoryProfile) -> str:
    where = f"{p.peak_op} in {p.peak_module or '<top>'}"
    return (
        f"peak {format_bytes(p.peak_allocated_bytes)}\n{where} ({p.peak_phase}, step {p.peak_step})"
    )


def render_png(
    profile: MemoryProfile,
    path: str | Path,
    *,
    title: str | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
) -> None:
    """Write a PNG of the stacked live bytes by category, phases shaded, the peak annotated
    and simulated reserved memory (when known) as a dashed line. Needs matplotlib."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.transforms import blended_transform_factory
    except ImportError as e:
        raise ImportError("render_png needs matplotlib: pip install 'memfit[plot]'") from e
    ct = category_timeline(profile)
    n = len(ct.total)
    idx = sample_indices(ct.total, profile.peak_index, max_points)
    top = max(profile.peak_allocated_bytes, profile.peak_reserved_bytes or 0, 1)
    unit, div = _unit(top)
    fig = Figure(figsize=(12, 6), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    xdata_yaxes = blended_transform_factory(ax.transData, ax.transAxes)
    for start, end, label in phase_spans(profile):
        phase = profile.timeline_phases[start][1]
        ax.axvspan(start, end, color=PHASE_COLORS.get(phase, _OTHER_PHASE_COLOR), lw=0, zorder=0)
        if label_fits(label, (end - start) / max(n, 1), 0.005):  # 8 pt on 10 inches
            ax.text((start + end) / 2, 1.01, label, transform=xdata_yaxes, ha="center", fontsize=8)
    present = ct.present()
    if idx and present:
        ys = [[ct.by_category[c][i] / div for i in idx] for c in present]
        colors = [CATEGORY_COLORS[c] for c in present]
        ax.stackplot(idx, ys, labels=present, colors=colors, step="post", zorder=2)
    if profile.peak_reserved_bytes is not None:
        y = profile.peak_reserved_bytes / div
        ax.axhline(y, color="black", ls="--", lw=1, zorder=3)
        text = f"reserved (simulated) {format_bytes(profile.peak_reserved_bytes)}"
        ax.text(0.995, y, text, transform=ax.get_yaxis_transform(), ha="right", va="bottom")
    if n:
        right = profile.peak_index > n / 2
        ax.annotate(
            _peak_text(profile),
            xy=(profile.peak_index, profile.peak_allocated_bytes / div),
            xytext=(-20 if right else 20, 12),
            textcoords="offset points",
            ha="right" if right else "left",
            fontsize=9,
            arrowprops={"arrowstyle": "->"},
            bbox={"boxstyle": "round", "fc": "white", "alpha": 0.85},
            zorder=4,
        )
    ax.set_xlim(0, max(n, 1))
    ax.set_ylim(0, top / div * 1.25)
    ax.set_xlabel("event index (each allocation or free on the device, in order)")
    ax.set_ylabel(f"live allocated memory ({unit})")
    ax.set_title(title or "Memory timeline by category", pad=16)
    if present:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.savefig(path, format="png")


# ---- HTML ---------------------------------------------------------------------------------
