"""The `memfit data` report: terminal text (rich tables, a histogram of bars) and JSON.

Renderers of a `DataReport` and what was computed from it (`LengthFit`, `VocabCoverage`,
`VocabSavings`); they compute nothing of their own.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from memfit.data.analyze import DataReport
from memfit.data.budget import LengthFit
from memfit.data.stats import LengthCounts, Longest
from memfit.data.vocab import VocabCoverage, VocabSavings
from memfit.units import format_bytes

#: The percentiles the report prints.
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
#: Width of the longest histogram bar, in characters.
BAR_WIDTH = 40


@dataclass
class Findings:
    """Everything `memfit data` prints: the pass, and what the model and GPU make of it."""

    report: DataReport
    fit: LengthFit | None = None
    coverage: VocabCoverage | None = None
    savings: list[VocabSavings] | None = None
    workload: str = ""


def _q(q: float) -> str:
    return f"p{q:g}"


def _num(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def _where(r: DataReport, item: Longest) -> str:
    return f"{r.unit} {item.where:,}"


def _percentiles(c: LengthCounts) -> str:
    parts = [f"{_q(q)} {_num(c.percentile(q))}" for q in PERCENTILES]
    return f"mean {c.mean():,.1f}   " + "   ".join(parts) + f"   max {c.max:,}"


def _histogram(c: LengthCounts) -> Any:
    from rich.table import Table

    rows = c.histogram()
    most = max(n for _, _, n in rows)
    t = Table(box=None, show_header=True, pad_edge=False, padding=(0, 1))
    t.add_column("tokens", justify="right")
    t.add_column("samples", justify="right")
    t.add_column("share", justify="right")
    t.add_column("")
    for lo, hi, n in rows:
        bar = "█" * (round(BAR_WIDTH * n / most) if n else 0) or ("▏" if n else "")
        t.add_row(f"{lo:,}-{hi:,}", f"{n:,}", f"{100 * n / c.n:.2f} %", bar)
    return t


def _head(r: DataReport) -> list[str]:
    field = f", field {r.field!r}" if r.field else ""
    blank = f" ({r.skipped_blank:,} blank lines skipped)" if r.skipped_blank else ""
    tok = f"tokenizer: {r.tokenizer}"
    if r.approximate:
        tok += ": estimates; --tokenizer DIR counts exactly"
    return [
        f"data: {r.path} ({r.format}{field}): {r.samples:,} samples{blank}, read in "
        f"{r.seconds:.1f} s",
        tok,
    ]


def _lengths(r: DataReport) -> list[str]:
    fence, beyond = r.outliers()
    lines = ["", "tokens per sample" + (" (approximate)" if r.approximate else ""),
             "  " + _percentiles(r.tokens), f"  total {r.tokens.total:,} tokens"]  # fmt: skip
    lines.append(
        f"  outliers: {beyond:,} sample(s) beyond {_num(fence)} tokens (Q3 + 3 IQR)"
        if beyond
        else f"  outliers: none beyond {_num(fence)} tokens (Q3 + 3 IQR)"
    )
    return lines


def _longest(r: DataReport, title: str, items: list[Longest], what: str) -> list[str]:
    if not items:
        return []
    lines = ["", title]
    for it in items:
        extra = f"  ({it.tokens:,} tokens)" if what != "tokens" else ""
        lines.append(f"  {_where(r, it):>14}  {it.value:>10,} {what}{extra}  {it.preview!r}")
    return lines


def _beyond(r: DataReport, title: str, counts: LengthCounts, items: list[Longest]) -> list[str]:
    """The top samples of a character statistic that are beyond its far-out fence."""
    fence = counts.far_out_fence()
    far = [x for x in items if x.value > fence]
    return _longest(
        r, f"{title} (longer than {_num(fence)}, the Q3 + 3 IQR fence)", far, "characters"
    )


def _characters(r: DataReport) -> list[str]:
    return [
        "",
        "characters per sample (what a tokenizer may split badly)",
        "  longest word (no whitespace):  " + _percentiles(r.words),
        "  longest whitespace run:        " + _percentiles(r.whitespace),
    ]


def _fit(f: Findings) -> list[str]:
    fit = f.fit
    if fit is None:
        return ["", "max length: name a GPU (--gpu) to find the longest sequence that fits"]
    lim = fit.limit
    head = f"fits {lim.gpu.display_name} ({lim.model}{f.workload})"
    if lim.largest is None:
        return ["", head, "  no sequence length fits: every sample would be cut (memfit plan)"]
    answer = f"{lim.largest:,}"
    bound = ""
    if lim.capped:
        answer, bound = f"at least {answer} (the search cap)", "at most "
    elif lim.largest == lim.upper:
        answer += " (every position the model has)"
    approx = " (approximate tokens)" if f.report.approximate else ""
    return [
        "",
        head,
        f"  max length: {answer} tokens",
        f"  truncated: {bound}{fit.truncated:,} of {fit.samples:,} samples "
        f"({100 * fit.share_truncated:.3f} %), {fit.tokens_cut:,} tokens cut "
        f"({100 * fit.share_cut:.3f} % of all){approx}",
    ]


def _vocab(f: Findings) -> list[str]:
    cov = f.coverage
    if cov is None:
        return ["", "vocabulary coverage: needs token ids; pass --tokenizer DIR"]
    lines = [
        "",
        f"vocabulary: {cov.ids_seen:,} of {cov.vocab_size:,} ids occur in "
        f"{cov.total_tokens:,} tokens",
    ]
    by_share = {s.kept: s for s in f.savings or []}
    for share, k in sorted(cov.needed.items()):
        line = f"  {100 * share:g} % of tokens: {k:,} ids"
        s = by_share.get(k)
        if s is not None:
            line += (
                f"; pruning the other {s.removed:,} rows saves {format_bytes(s.persistent)} "
                f"(weights, gradients, optimizer state) + {format_bytes(s.logits_per_copy)} "
                f"per logits tensor of {s.batch_size} x {s.seq_len}"
            )
        lines.append(line)
    return lines


def render_findings(f: Findings, *, width: int = 110) -> str:
    """The report as terminal text (plain, no color codes)."""
    from rich.console import Console

    r = f.report
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, highlight=False)
    for line in [*_head(r), *_lengths(r)]:
        console.print(line, markup=False, soft_wrap=True)
    console.print(_histogram(r.tokens))
    blocks = [
        _longest(r, "longest samples", r.longest, "tokens"),
        _characters(r),
        _beyond(r, "longest whitespace runs", r.whitespace, r.longest_runs),
        _beyond(r, "longest words", r.words, r.widest_words),
        _fit(f),
        _vocab(f),
    ]  # fmt: skip
    for block in blocks:
        for line in block:
            console.print(line, markup=False, soft_wrap=True)
    return out.getvalue().rstrip() + "\n"


def _counts_json(c: LengthCounts) -> dict[str, Any]:
    return {
        "mean": c.mean(), "max": c.max, "total": c.total,
        "percentiles": {_q(q): c.percentile(q) for q in PERCENTILES},
    }  # fmt: skip


def _items_json(r: DataReport, items: list[Longest]) -> list[dict[str, Any]]:
    return [{r.unit: i.where, "value": i.value, "tokens": i.tokens, "preview": i.preview}
            for i in items]  # fmt: skip


def findings_to_json(f: Findings) -> dict[str, Any]:
    """The report as JSON-ready data (lengths in tokens, characters; bytes as integers)."""
    r = f.report
    fence, beyond = r.outliers()
    out: dict[str, Any] = {
        "path": str(r.path), "format": r.format, "field": r.field, "unit": r.unit,
        "tokenizer": r.tokenizer, "approximate": r.approximate, "samples": r.samples,
        "seconds": round(r.seconds, 3),
        "skipped_blank": r.skipped_blank, "tokens": _counts_json(r.tokens),
        "histogram": [{"low": lo, "high": hi, "samples": n} for lo, hi, n in r.tokens.histogram()],
        "outliers": {"fence": fence, "samples": beyond},
        "longest": _items_json(r, r.longest),
        "longest_word": {**_counts_json(r.words), "top": _items_json(r, r.widest_words)},
        "longest_whitespace_run": {
            **_counts_json(r.whitespace), "top": _items_json(r, r.longest_runs)
        },
    }  # fmt: skip
    if f.fit is not None:
        lim = f.fit.limit
        out["fit"] = {
            "gpu": lim.gpu.name, "model": lim.model, "max_len": lim.largest,
            "capped": lim.capped, "truncated_samples": f.fit.truncated,
            "tokens_cut": f.fit.tokens_cut, "share_truncated": f.fit.share_truncated,
        }  # fmt: skip
    if f.coverage is not None:
        out["vocabulary"] = {
            "vocab_size": f.coverage.vocab_size, "ids_seen": f.coverage.ids_seen,
            "needed": {str(k): v for k, v in f.coverage.needed.items()},
            "savings": [
                {"kept": s.kept, "removed": s.removed, "parameters": s.parameters,
                 "gradients": s.gradients, "optimizer_state": s.optimizer_state,
                 "autocast_copy": s.autocast_copy, "logits_per_copy": s.logits_per_copy}
                for s in f.savings or []
            ],
        }  # fmt: skip
    return out
