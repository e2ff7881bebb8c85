"""Rows, errors, the summary against the targets and the markdown report of
benchmarks/gpu_validation.py."""

from __future__ import annotations

import statistics
import subprocess
from pathlib import Path
from typing import Any

MiB = 1 << 20
GiB = 1 << 30

#: Accuracy targets (issue "CUDA fidelity"). Relative errors are (estimate - measured) / measured.
TARGETS = {
    "allocated_median": 0.02,
    "allocated_worst": 0.05,
    "reserved_median": 0.03,
    "reserved_worst": 0.08,
    "reserved_max_under": 0.03,  # never under-predict reserved memory by more than this
    "device_total_mib": 300.0,  # |estimate - NVML| in MiB
}


def rel_error(est: Any, meas: Any) -> float | None:
    if not isinstance(est, int) or not isinstance(meas, int) or meas <= 0:
        return None
    return (est - meas) / meas


def compare(estimate: dict[str, Any] | None, measured: dict[str, Any] | None) -> dict[str, Any]:
    """Relative errors of the estimate against the step's peak after the build (the figure
    that, like memfit's, starts with the weights in place; rows of the first run have only the
    peak from the start), and the device-total difference when the worker's device figure is
    comparable (its first configuration)."""
    e = estimate or {}
    m = measured or {}
    dev_e, dev_m = e.get("device_total_bytes"), m.get("device_total_bytes")
    if m.get("first_in_worker") is False:
        dev_m = None
    alloc = m.get("step_max_memory_allocated", m.get("max_memory_allocated"))
    res = m.get("step_max_memory_reserved", m.get("max_memory_reserved"))
    return {
        "allocated_rel": rel_error(e.get("peak_allocated_bytes"), alloc),
        "reserved_rel": rel_error(e.get("peak_reserved_bytes"), res),
        "device_total_mib": (
            (dev_e - dev_m) / MiB if isinstance(dev_e, int) and isinstance(dev_m, int) else None
        ),
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median / worst errors over the rows that have both sides, against TARGETS."""

    def vals(key: str) -> list[float]:
        return [r["errors"][key] for r in rows if r["errors"].get(key) is not None]

    alloc, res, dev = vals("allocated_rel"), vals("reserved_rel"), vals("device_total_mib")
    out: dict[str, Any] = {"measured_rows": len(alloc)}

    def stat(values: list[float]) -> tuple[float | None, float | None]:
        if not values:
            return None, None
        absolute = [abs(v) for v in values]
        return statistics.median(absolute), max(absolute)

    out["allocated_median_abs"], out["allocated_worst_abs"] = stat(alloc)
    out["reserved_median_abs"], out["reserved_worst_abs"] = stat(res)
    out["reserved_most_under"] = min(res) if res else None
    out["device_total_worst_abs_mib"] = max((abs(v) for v in dev), default=None)
    checks = {
        "allocated_median": (out["allocated_median_abs"], TARGETS["allocated_median"]),
        "allocated_worst": (out["allocated_worst_abs"], TARGETS["allocated_worst"]),
        "reserved_median": (out["reserved_median_abs"], TARGETS["reserved_median"]),
        "reserved_worst": (out["reserved_worst_abs"], TARGETS["reserved_worst"]),
        "reserved_max_under": (
            -out["reserved_most_under"] if out["reserved_most_under"] is not None else None,
            TARGETS["reserved_max_under"],
        ),
        "device_total_mib": (out["device_total_worst_abs_mib"], TARGETS["device_total_mib"]),
    }
    out["pass"] = {
        k: (None if v is None else bool(v <= target)) for k, (v, target) in checks.items()
    }
    return out


def _gib(n: Any) -> str:
    return f"{n / GiB:.3f}" if isinstance(n, int) else "-"


def _pct(x: Any) -> str:
    return f"{100 * x:+.2f} %" if isinstance(x, float) else "-"


def render_markdown(report: dict[str, Any]) -> str:
    meta, rows, summ = report["meta"], report["rows"], report["summary"]
    lines = [f"# memfit GPU validation: {meta['title']}", ""]
    if not meta["gpu_present"]:
        lines += [
            "**estimate only: no GPU.** No configuration was measured; this file is not GPU "
            "evidence. Run `python benchmarks/gpu_validation.py` on a CUDA machine for that.",
            "",
        ]
    lines += [
        f"- date: {meta['date']}; memfit {meta.get('memfit_commit') or '?'}; "
        f"torch {meta['torch']}; transformers {meta['transformers']}; python {meta['python']}",
        f"- estimates for GPU `{meta['gpu']}`"
        + (f"; measured on {meta['device']['name']}" if meta.get("device") else ""),
        f"- mode: {meta['mode']}; PYTORCH_CUDA_ALLOC_CONF={meta['alloc_conf'] or '(unset)'}",
        f"- configurations: {len(rows)}, failed: {sum(1 for r in rows if r['failed'])}",
    ]
    for note in meta.get("notes", []):
        lines.append(f"- note: {note}")
    lines += ["", "## Summary against the targets", ""]
    if summ["measured_rows"] == 0:
        lines += ["estimate only: no GPU, so no errors to summarise.", ""]
    else:

        def mark(key: str) -> str:
            v = summ["pass"].get(key)
            return "n/a" if v is None else ("PASS" if v else "FAIL")

        def p(x: Any) -> str:
            return f"{100 * x:.2f} %" if isinstance(x, (int, float)) else "-"

        worst_dev = summ["device_total_worst_abs_mib"]
        under = summ["reserved_most_under"]
        lines += [
            "| metric | value | target | result |",
            "|---|---|---|---|",
            f"| allocated, median abs error | {p(summ['allocated_median_abs'])} | <= 2 % | "
            f"{mark('allocated_median')} |",
            f"| allocated, worst abs error | {p(summ['allocated_worst_abs'])} | <= 5 % | "
            f"{mark('allocated_worst')} |",
            f"| reserved, median abs error | {p(summ['reserved_median_abs'])} | <= 3 % | "
            f"{mark('reserved_median')} |",
            f"| reserved, worst abs error | {p(summ['reserved_worst_abs'])} | <= 8 % | "
            f"{mark('reserved_worst')} |",
            f"| reserved, most negative error (under-prediction) | {_pct(under)} | >= -3 % | "
            f"{mark('reserved_max_under')} |",
            "| device total, worst abs difference | "
            + (f"{worst_dev:.0f} MiB" if worst_dev is not None else "-")
            + f" | <= 300 MiB | {mark('device_total_mib')} |",
            "",
            f"({summ['measured_rows']} measured configurations.)",
            "",
        ]
    lines += [
        "## Configurations",
        "",
        "GiB = 2^30 bytes. meas = the step's peak from the moment the model is on the device "
        "(weights included, as in memfit's estimate). err = (estimate - measured) / measured; "
        "device diff in MiB.",
        "",
        "| config | est alloc | meas alloc | err | est reserved | meas reserved | err "
        "| est device | meas device | diff MiB | est s | notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        e, m, err = r["estimate"] or {}, r["measured"] or {}, r["errors"]
        notes = []
        if r.get("estimate_error"):
            notes.append("estimate failed: " + r["estimate_error"].splitlines()[-1][:120])
        if r.get("measure_error"):
            notes.append("run failed: " + r["measure_error"].splitlines()[-1][:120])
        if r.get("skipped"):
            notes.append(f"not run: {r['skipped']}")
        if r.get("estimate_source"):
            notes.append(f"estimate {r['estimate_source']}")
        if m.get("first_in_worker") is False:
            notes.append("device figure shares a worker")
        if m.get("num_alloc_retries"):
            notes.append(f"{m['num_alloc_retries']} alloc retries")
        if m.get("parameter_count") not in (None, e.get("parameter_count")):
            notes.append(
                f"parameters: run {m['parameter_count']}, estimate {e.get('parameter_count')}"
            )
        if m.get("fp16_skipped_steps"):
            notes.append(f"GradScaler skipped {m['fp16_skipped_steps']} step(s)")
        if e.get("attention_backend"):
            notes.append(f"attn {e['attention_backend']}")
        dev = err.get("device_total_mib")
        step_alloc = m.get("step_max_memory_allocated", m.get("max_memory_allocated"))
        step_res = m.get("step_max_memory_reserved", m.get("max_memory_reserved"))
        lines.append(
            f"| {r['name']} | {_gib(e.get('peak_allocated_bytes'))} "
            f"| {_gib(step_alloc)} | {_pct(err.get('allocated_rel'))} "
            f"| {_gib(e.get('peak_reserved_bytes'))} | {_gib(step_res)} "
            f"| {_pct(err.get('reserved_rel'))} | {_gib(e.get('device_total_bytes'))} "
            f"| {_gib(m.get('device_total_bytes'))} "
            f"| {f'{dev:+.0f}' if isinstance(dev, float) else '-'} "
            f"| {e.get('seconds', '-')} | {'; '.join(notes)} |"
        )
    lines.append("")
    return "\n".join(lines)


def _version(pkg: str) -> str | None:
    try:
        import importlib.metadata

        return importlib.metadata.version(pkg)
    except Exception:
        return None


def _git_commit() -> str | None:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                cwd=Path(__file__).resolve().parent,
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout.strip()
            or None
        )
    except Exception:
        return None
