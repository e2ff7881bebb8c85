"""memfit's estimates of the configurations: made here, stored beside them (--estimate-only) and
the planned GPU time printed from them."""

from __future__ import annotations

import datetime
import json
import platform
import time
import traceback
from pathlib import Path
from typing import Any

from _gpu_validation_configs import CONFIGS, Config, by_value
from _gpu_validation_plan import (
    ESTIMATES_FORMAT,
    SUITE_BUDGET_S,
    fingerprint,
    load_estimates,
    plan,
    stored_estimate,
)
from _gpu_validation_report import _git_commit, _version


def run_estimate(cfg: Config, gpu: str, alloc_conf: str | None) -> dict[str, Any]:
    """memfit's estimate of `cfg`'s run on `gpu`, as plain JSON-able numbers."""
    from _gpu_validation_loops import estimate_loop

    t0 = time.perf_counter()
    est = estimate_loop(cfg, gpu, alloc_conf)
    seconds = time.perf_counter() - t0
    p = est.profile
    return {
        "peak_allocated_bytes": p.peak_allocated_bytes,
        "peak_reserved_bytes": p.peak_reserved_bytes,
        "device_total_bytes": p.device_total_bytes,
        "device_total_range_bytes": list(est.device_total_range)
        if est.device_total_range
        else None,
        "breakdown": dict(p.breakdown),
        "device_breakdown": dict(p.device_breakdown),
        "peak_step": p.peak_step,
        "peak_phase": p.peak_phase,
        "peak_op": p.peak_op,
        "peak_module": p.peak_module,
        "parameter_count": est.parameter_count,
        "trainable_parameter_count": est.trainable_parameter_count,
        "num_blocks": est.num_blocks,
        "replayed": est.replayed,
        "attention_backend": est.attention_backend,
        "fits": est.fits,
        "flops_per_step": sum(est.flops.values()) if est.flops else None,
        "seconds": round(seconds, 3),
    }


def estimate_entry(name: str, gpu: str, alloc_conf: str | None) -> dict[str, Any]:
    """{"estimate": ..., "error": ...} of the configuration `name` (a process pool's job)."""
    cfg = next(c for c in CONFIGS if c.name == name)
    try:
        return {"estimate": run_estimate(cfg, gpu, alloc_conf), "error": None}
    except Exception as e:  # recorded in the row; the run goes on
        return {"estimate": None, "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}


def versions() -> dict[str, Any]:
    import torch

    return {
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "peft": _version("peft"),
        "bitsandbytes": _version("bitsandbytes"),
        "python": platform.python_version(),
    }


def estimate_only(configs: list[Config], gpus: list[str], path: Path, alloc_conf: str) -> dict:
    """Estimate `configs` for each of `gpus` here and merge them into the stored file `path`."""
    data = load_estimates(path)
    data.update(format=ESTIMATES_FORMAT, memfit_commit=_git_commit(), **versions())
    data["created"] = datetime.date.today().isoformat()
    data["alloc_conf"] = alloc_conf
    for gpu in gpus:
        stored = data["gpus"].setdefault(gpu, {})
        for i, cfg in enumerate(by_value(configs)):  # new loops first: their errors show early
            t0 = time.perf_counter()
            entry = estimate_entry(cfg.name, gpu, alloc_conf)
            stored[cfg.name] = {"fingerprint": fingerprint(cfg), **entry}
            path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
            status = "ok" if entry["error"] is None else "ERROR " + entry["error"].splitlines()[0]
            print(
                f"[{gpu} {i + 1}/{len(configs)}] {cfg.name} {status} "
                f"({time.perf_counter() - t0:.1f} s)",
                flush=True,
            )
    return data


def print_plan(configs: list[Config], data: dict[str, Any], gpu: str) -> float:
    """Print the planned GPU seconds per configuration (value order) and in total."""
    ests = {}
    for c in configs:
        entry = stored_estimate(data, gpu, c)
        ests[c.name] = entry.get("estimate") if entry else None
    rows, total = plan(by_value(configs), ests)
    print(f"planned GPU time on {gpu} (benchmarks/_gpu_validation_plan.py):")
    for cfg, s, w in rows:
        mark = "" if ests.get(cfg.name) else " (no stored estimate)"
        print(f"  worker {w:2d}  {s:6.1f} s  {cfg.name}{mark}")
    workers = len({w for _, _, w in rows})
    print(
        f"total: {total:.1f} s for {len(rows)} configurations in {workers} workers "
        f"(limit {SUITE_BUDGET_S:.0f} s)"
    )
    return total
