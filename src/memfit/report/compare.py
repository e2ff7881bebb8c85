"""Estimated against measured: the same JSON for both, and the differences per category.

`memfit estimate ... --json` and `memfit profile ... --json` write the same keys (the DESIGN.md
contract: peak_allocated_bytes, peak_reserved_bytes, device_total_bytes, breakdown, peak_phase,
peak_op, peak_module, by_module). `compare` reads two such objects, whichever made them.

Example:
    $ memfit estimate gpt2 --batch 8 --seq 512 --json > est.json
    $ memfit profile train.py --json > measured.json
    $ memfit compare est.json measured.json
    $ memfit compare baseline.json new.json --fail-above 2   # a CI gate: exit 1 past 2 %

As a gate (`check_limits`), each total (peak allocated, reserved, device total) and, when asked,
each category, may differ from the first report by at most a percentage of the first report's
value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memfit.errors import BadInputError, closest
from memfit.events import CATEGORIES
from memfit.units import format_bytes

TOTALS = ("peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes")
#: The tracer's categories, then what only device memory has (the JSON contract's breakdown).
CATEGORY_KEYS = (*CATEGORIES, "allocator_cache", "cuda_context")


@dataclass(frozen=True)
class Row:
    """One compared quantity; `diff` is b - a, `relative` is diff / a (None when a is 0)."""

    name: str
    a: int | None
    b: int | None

    @property
    def diff(self) -> int | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def relative(self) -> float | None:
        d = self.diff
        return None if d is None or not self.a else d / self.a


@dataclass(frozen=True)
class Comparison:
    a_label: str
    b_label: str
    totals: list[Row]
    categories: list[Row]
    where: list[tuple[str, str, str]]  # (what, a, b): peak phase / op / module
    #: What was left out to compare like with like, and why (printed under the table).
    notes: tuple[str, ...] = ()


def load_report(path: str | Path) -> dict[str, Any]:
    """Read a JSON report written by `memfit estimate --json` or `memfit profile --json`."""
    p = Path(path)
    if not p.is_file():
        raise BadInputError(f"No such report: {str(p)!r}. Write one with --json > {p.name}.")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise BadInputError(
            f"{str(p)!r} is not JSON ({e.msg} at line {e.lineno}). Give the output of "
            "`memfit estimate --json` or `memfit profile --json`."
        ) from e
    if not isinstance(data, dict) or "peak_allocated_bytes" not in data:
        raise BadInputError(f"{str(p)!r} has no 'peak_allocated_bytes': it is not a memfit report.")
    breakdown = data.get("breakdown") or {}
    if not isinstance(breakdown, dict):
        raise BadInputError(f"{str(p)!r}: 'breakdown' is {breakdown!r}, not bytes by category.")
    for key, value in [*((k, data.get(k)) for k in TOTALS), *breakdown.items()]:
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise BadInputError(
                f"{str(p)!r}: {key!r} is {value!r}, not a number of bytes. Give the output of "
                "`memfit estimate --json` or `memfit profile --json`."
            )
    return data


#: What only CUDA has: the cuBLAS/cuDNN workspaces (allocated through the caching allocator),
#: the allocator's cache and the CUDA context. A CPU measurement has none of them.
CUDA_ONLY_CATEGORIES = ("workspaces", "allocator_cache", "cuda_context")


def _measured_on_cpu(report: dict[str, Any]) -> bool:
    return report.get("source") == "measured" and str(report.get("device", "")).startswith("cpu")


def compare(a: dict[str, Any], b: dict[str, Any], *, labels: tuple[str, str] = ("a", "b")
            ) -> Comparison:  # fmt: skip
    """Totals and per-category bytes of two reports, side by side.

    Like is compared with like: when one report was measured on a CPU and the other was not
    (an estimate of a CUDA run), what only CUDA has is left out of the other report (its
    workspaces from the allocated peak; reserved memory and the device total, which a CPU run
    does not have, are not compared), and the notes say so."""
    a, b = dict(a), dict(b)
    notes: list[str] = []
    if _measured_on_cpu(a) != _measured_on_cpu(b):
        cuda_side = a if _measured_on_cpu(b) else b
        label = labels[0] if cuda_side is a else labels[1]
        breakdown = dict(cuda_side.get("breakdown") or {})
        workspaces = breakdown.pop("workspaces", 0) or 0
        for key in CUDA_ONLY_CATEGORIES:
            breakdown.pop(key, None)
        cuda_side["breakdown"] = breakdown
        if cuda_side.get("peak_allocated_bytes") is not None:
            cuda_side["peak_allocated_bytes"] -= workspaces
        cuda_side["peak_reserved_bytes"] = cuda_side["device_total_bytes"] = None
        notes.append(
            f"one report was measured on a CPU: {label}'s CUDA-only memory is left out "
            f"(its cuBLAS workspaces, {format_bytes(workspaces)}, from the allocated peak); "
            "reserved memory and the device total exist only on a GPU and are not compared"
        )
    ba, bb = a.get("breakdown") or {}, b.get("breakdown") or {}
    return Comparison(
        a_label=labels[0],
        b_label=labels[1],
        totals=[Row(k, a.get(k), b.get(k)) for k in TOTALS],
        categories=[Row(k, ba.get(k), bb.get(k)) for k in CATEGORY_KEYS if ba.get(k) or bb.get(k)],
        where=[
            (k, str(a.get(f"peak_{k}")), str(b.get(f"peak_{k}"))) for k in ("phase", "op", "module")
        ],
        notes=tuple(notes),
    )


@dataclass(frozen=True)
class LimitCheck:
    """The outcome of `check_limits`: the rows over their limit (with the limit, in percent),
    and the rows that could not be checked because a report lacks the value."""

    over: list[tuple[Row, float]]
    unchecked: list[Row]

    @property
    def passed(self) -> bool:
        return not self.over


def check_limits(
    c: Comparison,
    *,
    total_pct: float | None = None,
    category_pct: float | None = None,
    per_category: dict[str, float] | None = None,
) -> LimitCheck:
    """Which rows of `c` differ by more than their limit, in percent of the first report.

    `total_pct` limits the three totals; `category_pct` every category; `per_category` the
    named ones (over `category_pct`). A row whose first value is 0 and second is not is over any
    limit; a row with a value missing is listed as unchecked, never passed silently.
    """
    per_category = per_category or {}
    unknown = sorted(set(per_category) - set(CATEGORY_KEYS))
    if unknown:
        raise BadInputError(
            f"Unknown category {unknown[0]!r}.{closest(unknown[0], list(CATEGORY_KEYS))} "
            f"Categories: {', '.join(CATEGORY_KEYS)}."
        )
    for name, pct in [("total_pct", total_pct), ("category_pct", category_pct),
                      *per_category.items()]:  # fmt: skip
        ok = isinstance(pct, (int, float)) and not isinstance(pct, bool) and pct >= 0
        if pct is not None and not ok:
            raise BadInputError(f"The limit for {name} must be a percentage >= 0, got {pct!r}.")
    limits = [(r, total_pct) for r in c.totals]
    limits += [(r, per_category.get(r.name, category_pct)) for r in c.categories]
    over: list[tuple[Row, float]] = []
    unchecked: list[Row] = []
    for row, pct in limits:
        if pct is None:
            continue
        if row.diff is None:
            unchecked.append(row)
        elif row.diff != 0 and (not row.a or abs(row.diff) * 100 > pct * row.a):
            over.append((row, pct))
    return LimitCheck(over=over, unchecked=unchecked)


def render_limit_check(check: LimitCheck, labels: tuple[str, str]) -> str:
    """One line per row over its limit or not checked, and the verdict."""
    out = []
    for row, pct in check.over:
        rel = f"{100 * row.relative:+.2f} %" if row.relative is not None else "from 0 B"
        out.append(
            f"  over the limit: {row.name} {rel} ({format_bytes(row.a)} -> "
            f"{format_bytes(row.b)}; limit {pct:g} %)"
        )
    for row in check.unchecked:
        missing = labels[0] if row.a is None else labels[1]
        out.append(f"  not checked: {row.name} (no value in {missing})")
    verdict = "FAIL" if check.over else "PASS"
    out.append(f"{verdict}: {len(check.over)} difference(s) over the limit")
    return "\n".join(out)


def render_comparison(c: Comparison) -> str:
    """Plain-text table of a Comparison (binary units)."""

    def line(r: Row) -> str:
        rel = f"{100 * r.relative:+7.1f} %" if r.relative is not None else "        -"
        diff = r.diff
        d = "-" if diff is None else ("+" if diff >= 0 else "-") + format_bytes(abs(diff))
        return f"  {r.name:<22}{format_bytes(r.a):>14}{format_bytes(r.b):>14}{d:>16} {rel}"

    head = f"  {'':<22}{c.a_label[:13]:>14}{c.b_label[:13]:>14}{'difference':>16}"
    out = [head, *map(line, c.totals), "", "at the peak, by category:", head]
    out += [line(r) for r in c.categories]
    out.append("")
    for what, x, y in c.where:
        same = "same" if x == y else "differs"
        out.append(f"  peak {what:<8} {x}  |  {y}  ({same})")
    out += [f"note: {n}" for n in c.notes]
    return "\n".join(out)
