"""The timeline as a self-contained HTML page: inline SVG and tables, no script, nothing
fetched from the network (see memfit.report.timeline for the data and the PNG)."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from memfit.profile import MemoryProfile
from memfit.report.text import grouped_modules
from memfit.report.timeline import (
    _OTHER_PHASE_COLOR,
    CATEGORY_COLORS,
    PHASE_COLORS,
    CategoryTimeline,
    _peak_text,
    _unit,
    category_timeline,
    label_fits,
    phase_spans,
    sample_indices,
)
from memfit.units import format_bytes

_W, _H, _L, _R, _T, _B = 1000, 420, 80, 20, 30, 40  # SVG size and margins

_CSS = (
    "body{font-family:sans-serif;margin:24px;color:#222}"
    "table{border-collapse:collapse;margin:8px 24px 16px 0;display:inline-table;"
    "vertical-align:top}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    "td:first-child,th:first-child{text-align:left}.sw{display:inline-block;width:10px;"
    "height:10px;margin-right:6px}svg text{font-size:11px}"
)


def _nice_step(span: float) -> float:
    """A 1-2-5 step that cuts `span` (> 0) into at most 5 intervals."""
    raw = span / 5
    mag = 10.0 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


#: The peak's two-line label: its first baseline sits this far above the peak, the second
#: line 13 px lower; glyphs reach about 11 px above a baseline and 3 px below.
_LABEL_ABOVE, _LINE, _ASCENT, _DESCENT = 18, 13, 11, 3


def peak_label_y(peak_y: float, reserved_y: float | None) -> float:
    """The first baseline of the peak's label: above the peak, moved above the reserved line
    (or below it, when there is no room above) when the line would cross its text."""
    top = peak_y - _LABEL_ABOVE
    if reserved_y is None or not top - _ASCENT <= reserved_y <= top + _LINE + _DESCENT:
        return top
    above = reserved_y - _DESCENT - 2 - _LINE
    return above if above - _ASCENT >= _T else reserved_y + _ASCENT + 2


def _svg(profile: MemoryProfile, ct: CategoryTimeline, max_points: int) -> str:
    e = html.escape
    n = max(len(ct.total), 1)
    top = max(profile.peak_allocated_bytes, profile.peak_reserved_bytes or 0, 1)
    unit, div = _unit(top)
    ymax = top * 1.2
    pw, ph = _W - _L - _R, _H - _T - _B

    def x(i: float) -> str:
        return f"{_L + pw * i / n:.1f}"

    def y(v: float) -> str:
        return f"{_T + ph * (1 - v / ymax):.1f}"

    def hline(v: float, style: str) -> str:
        return f'<line x1="{_L}" x2="{_L + pw}" y1="{y(v)}" y2="{y(v)}" {style}/>'

    def text(tx: float | str, ty: float | str, body: str, anchor: str = "middle") -> str:
        return f'<text x="{tx}" y="{ty}" text-anchor="{anchor}">{body}</text>'

    out = [f'<svg width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" role="img">']
    for start, end, label in phase_spans(profile):
        color = PHASE_COLORS.get(profile.timeline_phases[start][1], _OTHER_PHASE_COLOR)
        w = pw * (end - start) / n
        out.append(
            f'<rect x="{x(start)}" y="{_T}" width="{w:.1f}" height="{ph}" fill="{color}">'
            f"<title>{e(label)}</title></rect>"
        )
        if label_fits(label, w / pw, 0.007):  # 11 px on 900 px
            out.append(text(x((start + end) / 2), _T - 6, e(label)))
    idx = sample_indices(ct.total, profile.peak_index, max_points)
    ends = [*idx[1:], n]
    lower = [0] * len(idx)
    for c in ct.present():
        upper = [lo + ct.by_category[c][i] for lo, i in zip(lower, idx, strict=True)]
        # Step-shaped band: each value holds from its event to the next sampled one.
        up = [f"{x(a)},{y(v)} {x(b)},{y(v)}" for a, b, v in zip(idx, ends, upper, strict=True)]
        lo = [f"{x(b)},{y(v)} {x(a)},{y(v)}" for a, b, v in zip(idx, ends, lower, strict=True)]
        points = " ".join(up + lo[::-1])
        out.append(
            f'<polygon fill="{CATEGORY_COLORS[c]}" points="{points}"><title>{e(c)}</title>'
            "</polygon>"
        )
        lower = upper
    step = _nice_step(ymax / div)
    k = 0
    while k * step * div <= ymax:
        v = k * step * div
        out.append(hline(v, 'stroke="#0002"'))
        out.append(text(_L - 6, f"{float(y(v)) + 4:.1f}", f"{k * step:g} {unit}", "end"))
        k += 1
    xstep = max(int(_nice_step(n)), 1)
    for i in range(0, n + 1, xstep):
        out.append(text(x(i), _T + ph + 14, str(i)))
    out.append(text(_L + pw / 2, _H - 4, "event index (each allocation or free, in order)"))
    ry = None
    if profile.peak_reserved_bytes is not None:
        label = e(f"reserved (simulated) {format_bytes(profile.peak_reserved_bytes)}")
        ry = float(y(profile.peak_reserved_bytes))
        out.append(hline(profile.peak_reserved_bytes, 'stroke="#000" stroke-dasharray="6 4"'))
        out.append(text(_L + pw - 4, f"{ry - 4:.1f}", label, "end"))
    if ct.total:
        px, py = x(profile.peak_index), float(y(profile.peak_allocated_bytes))
        right = profile.peak_index > n / 2
        tx = f"{float(px) + (-8 if right else 8):.1f}"
        first, second = (e(t) for t in _peak_text(profile).split("\n"))
        out.append(f'<circle cx="{px}" cy="{py:.1f}" r="4" fill="#000"/>')
        body = f'<tspan font-weight="bold">{first}</tspan><tspan x="{tx}" dy="13">{second}</tspan>'
        out.append(text(tx, f"{peak_label_y(py, ry):.1f}", body, "end" if right else "start"))
    out.append("</svg>")
    return "\n".join(out)


def _table(title: str, header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><caption>{e(title)}</caption><tr>{head}</tr>{body}</table>"


def render_html(
    profile: MemoryProfile,
    path: str | Path,
    *,
    title: str | None = None,
    max_points: int = 1500,
) -> None:
    """Write a self-contained HTML page: the stacked timeline (inline SVG, hover a band for
    its category), phases, the peak, and tables of the breakdown at the peak, the top
    modules, the peak of each phase and the largest tensors alive at the peak."""
    e = html.escape
    ct = category_timeline(profile)
    peak = profile.peak_allocated_bytes
    present = ct.present()

    def pct(b: int) -> str:
        return f"{100 * b / peak:.1f}%" if peak else "-"

    def swatch(c: str) -> str:
        return f'<span class="sw" style="background:{CATEGORY_COLORS[c]}"></span>{e(c)}'

    bd = []
    for c in present:
        b = profile.breakdown.get(c, 0)
        bd.append((swatch(c), f"{b:,}", e(format_bytes(b)), pct(b)))
    bd.append(("<b>allocated</b>", f"{peak:,}", e(format_bytes(peak)), pct(peak)))
    for label, v in (
        ("reserved (simulated)", profile.peak_reserved_bytes),
        ("device total (nvidia-smi)", profile.device_total_bytes),
    ):
        if v is not None:
            bd.append((e(label), f"{v:,}", e(format_bytes(v)), ""))
    mods = list(grouped_modules(profile.by_module).items())[:15]
    mod_rows = [(e(m or "<top>"), f"{b:,}", e(format_bytes(b)), pct(b)) for m, b in mods]
    ph_rows = [
        (e(f"{p.phase} (step {p.step})"), f"{p.peak_bytes:,}", e(format_bytes(p.peak_bytes)))
        for p in profile.phases
    ]
    tt_rows = [
        (
            e(t["module"] or "<top>"),
            e(t["op"]),
            swatch(t["category"]),
            e(t["phase"]),
            e(format_bytes(t["bytes"])),
        )
        for t in profile.top_tensors
    ]
    doc_title = title or "memfit memory timeline"
    parts = [
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(doc_title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{e(doc_title)}</h1>",
        f"<p>Peak allocated: <b>{e(format_bytes(peak))}</b> ({peak:,} bytes) at "
        f"<code>{e(profile.peak_op)}</code> in <code>{e(profile.peak_module or '<top>')}"
        f"</code>, {e(profile.peak_phase)} of step {profile.peak_step}.</p>",
        "<p>" + " ".join(swatch(c) for c in present) + "</p>",
        _svg(profile, ct, max_points),
        "<div>",
        _table("Breakdown at the peak", ("category", "bytes", "size", "share"), bd),
        _table("Top modules at the peak", ("module", "bytes", "size", "share"), mod_rows),
        _table("Peak of each phase", ("phase", "bytes", "size"), ph_rows),
        _table(
            "Largest tensors at the peak", ("module", "op", "category", "phase", "size"), tt_rows
        ),
        "</div></body></html>\n",
    ]
    Path(path).write_text("\n".join(parts), encoding="utf-8")
