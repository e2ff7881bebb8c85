"""Re-estimate the measured rows of a GPU validation report and print a before/after table.

For every measured row of a ``benchmarks/gpu_validation.py`` JSON report (default: the
committed H200 run, benchmarks/results/h200-2026-11-27.json), memfit estimates the same
configuration again with the code of this checkout (``run_estimate``, the call the report's
estimates came from, same GPU) and the table puts, for allocated, reserved and device total
memory, the committed estimate ("before"), the new one ("after") and the measurement side by
side, with the relative errors (estimate - measured) / measured, and the device difference in
MiB. The summary lines give the worst figures before and after against the report's targets.

Run it under the stack the report was measured on (the report's torch and transformers
versions; docs/accuracy.md names the command). Each estimate takes seconds on a CPU:

    nice python benchmarks/accuracy_table.py [--report PATH] [--only SUBSTRING] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gpu_validation import CONFIGS, TARGETS, run_estimate  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20
DEFAULT_REPORT = HERE / "results" / "h200-2026-11-27.json"
METRICS = (
    ("allocated", "peak_allocated_bytes", "max_memory_allocated"),
    ("reserved", "peak_reserved_bytes", "max_memory_reserved"),
    ("device", "device_total_bytes", "device_total_bytes"),
)


def _rel(est: int, meas: int) -> float:
    return (est - meas) / meas


def rows_after(report: dict[str, Any], only: str | None) -> list[dict[str, Any]]:
    """The report's measured rows, each with ``after``: this checkout's estimate."""
    by_name = {c.name: c for c in CONFIGS}
    out = []
    for row in report["rows"]:
        if row.get("failed") or not row.get("measured") or not row.get("estimate"):
            continue
        if only and only.lower() not in row["name"].lower():
            continue
        cfg = by_name.get(row["name"])
        if cfg is None:
            raise SystemExit(
                f"row {row['name']!r} is not a configuration of gpu_validation.py: "
                "re-estimate with the script version the report was made with."
            )
        after = run_estimate(cfg, report["meta"]["gpu"], None)
        out.append({**row, "after": after})
        print(f"estimated {row['name']} in {after['seconds']} s", file=sys.stderr)
    return out


def _cell(v: int, unit: int) -> str:
    return f"{v / unit:.3f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| config | alloc before | alloc after | alloc meas | err before | err after "
        "| res before | res after | res meas | err before | err after "
        "| dev before | dev after | dev meas | diff before MiB | diff after MiB |"
    )
    lines = [head, "|" + "---|" * 16]
    for r in rows:
        cells = [r["name"]]
        for metric, est_key, meas_key in METRICS:
            b, a, m = r["estimate"][est_key], r["after"][est_key], r["measured"][meas_key]
            cells += [_cell(b, GIB), _cell(a, GIB), _cell(m, GIB)]
            if metric == "device":
                cells += [f"{(b - m) / MIB:+.0f}", f"{(a - m) / MIB:+.0f}"]
            else:
                cells += [f"{_rel(b, m):+.2%}", f"{_rel(a, m):+.2%}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> str:
    def worst(which: str) -> dict[str, float]:
        alloc = [_rel(r[which]["peak_allocated_bytes"], r["measured"]["max_memory_allocated"])
                 for r in rows]  # fmt: skip
        res = [_rel(r[which]["peak_reserved_bytes"], r["measured"]["max_memory_reserved"])
               for r in rows]  # fmt: skip
        dev = [(r[which]["device_total_bytes"] - r["measured"]["device_total_bytes"]) / MIB
               for r in rows]  # fmt: skip
        return {
            "allocated worst abs": max(abs(x) for x in alloc),
            "reserved worst abs": max(abs(x) for x in res),
            "reserved most negative": min(res),
            "device worst abs MiB": max(abs(x) for x in dev),
        }

    before, after = worst("estimate"), worst("after")
    target = {
        "allocated worst abs": f"<= {TARGETS['allocated_worst']:.0%}",
        "reserved worst abs": f"<= {TARGETS['reserved_worst']:.0%}",
        "reserved most negative": f">= -{TARGETS['reserved_max_under']:.0%}",
        "device worst abs MiB": f"<= {TARGETS['device_total_mib']:.0f}",
    }
    lines = ["| metric | before | after | target |", "|---|---|---|---|"]
    for k in before:
        fmt = "{:.0f}" if "MiB" in k else "{:+.2%}"
        lines.append(f"| {k} | {fmt.format(before[k])} | {fmt.format(after[k])} | {target[k]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", type=Path, default=DEFAULT_REPORT)
    ap.add_argument("--only", help="rows whose name contains this")
    ap.add_argument("--json", type=Path, help="also write the rows with their new estimates")
    args = ap.parse_args(argv)
    report = json.loads(args.report.read_text())
    rows = rows_after(report, args.only)
    if not rows:
        raise SystemExit(f"no measured row in {args.report} matches --only {args.only!r}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(f"{len(rows)} rows of {args.report.name}; GiB = 2^30 bytes; err = (est - meas) / meas\n")
    print(summary(rows) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
