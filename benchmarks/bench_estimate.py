"""Benchmark memfit's estimate against its speed/memory targets and against PyTorch's MemTracker.

Workload: one training step of a causal LM, batch 1, sequence 2048, bf16-true (parameters,
gradients and AdamW state in bfloat16), AdamW with foreach=True, two steps traced (the first
creates the optimizer state, the second is the steady state), target GPU h100-sxm.

What it measures:

1. memfit.estimate wall time for llama-2-7b and llama-2-70b, after `import memfit` (timed
   separately). The first estimate in a process also pays for memfit's lazy imports
   (transformers and the model code), so every model is timed twice: "first" (the first
   estimate of that model in this process) and "warm" (best of the later repeats). The peak
   RSS of the process (resource.getrusage ru_maxrss) is read right after the memfit runs, before
   anything else runs. Targets: 7B <= 2 s, 70B <= 4 s, peak RSS <= 1 GiB; each is reported as
   PASS or FAIL, nothing is asserted.
2. (not with --quick) torch.distributed._tools.mem_tracker.MemTracker tracing the same two
   steps of llama-2-7b on FakeTensorMode tensors: time, peak snapshot, and the speed ratio
   MemTracker / memfit.
3. (not with --quick) the per-category bytes of both at their peak, side by side.

Usage:
    python benchmarks/bench_estimate.py                 # everything (about 1 min on 2 cores)
    python benchmarks/bench_estimate.py --quick         # memfit timings only (CI smoke)
    python benchmarks/bench_estimate.py --json out.json # also write all figures to out.json
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import platform
import resource
import sys
import time
import traceback
from typing import Any

T_START = time.perf_counter()

GIB = 2**30
MODELS = ("llama-2-7b", "llama-2-70b")
TARGET_SECONDS = {"llama-2-7b": 2.0, "llama-2-70b": 4.0}
TARGET_RSS_BYTES = 1 * GIB
BATCH, SEQ, PRECISION, OPTIMIZER, GPU = 1, 2048, "bf16-true", "adamw", "h100-sxm"
STEPS = 2  # memfit's Workload default; MemTracker traces the same number of steps

# memfit category -> MemTracker category (torch 2.13's _MemRefType). MemTracker has no INP
# category: inputs made inside the tracker are counted as ACT, tensors registered with
# track_external that are not parameters/buffers/optimizer state as OTH. Its OPT mixes
# optimizer state and the optimizer step's temporaries; the comparison splits them by summing
# the tensors found in optimizer.state after the run.
CATEGORY_MAP = (
    ("parameters", "PARAM"),
    ("buffers", "BUFFER"),
    ("gradients", "GRAD"),
    ("optimizer_state", "OPT (state: exp_avg, exp_avg_sq)"),
    ("-", "OPT (state: step counters)"),
    ("temporaries", "TEMP + OPT (step temporaries)"),
    ("activations", "ACT"),
    ("inputs", "(in ACT)"),
    ("-", "OTH"),
    ("workspaces", "-"),
)


# Why the two differ (llama-2-7b, bf16-true, AdamW foreach; observed with memfit 0.1.0, torch 2.13):
NOTES = """\
  notes on the differences (memfit - MemTracker):
  * memfit emulates CUDA: every block is rounded up to 512 B (the caching allocator's
    kMinBlockSize) and the cuBLAS workspace is counted (workspaces). MemTracker rounds only on
    cuda devices; on fake CPU tensors it counts exact nbytes. Here: the two 256 B fp32 rotary
    buffers (inv_freq, original_inv_freq) are 2 x 256 B for MemTracker, 2 x 512 B for memfit.
  * AdamW's `step` counters: with foreach and capturable=False they stay on the host on CUDA,
    so memfit does not count them; MemTracker counts them (291 x 4 B) in OPT.
  * MemTracker puts the optimizer step's temporaries (the _foreach_sqrt of exp_avg_sq alive at
    the peak) in OPT; the table moves them next to memfit's temporaries (OPT - state).
  * Parameters, gradients and the AdamW state agree exactly; the peak is in step 0's
    optimizer step for both (memfit: _foreach_sqrt)."""


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    return f"{n:,} B ({n / GIB:.3f} GiB)"


def rel(a: int | None, b: int | None) -> str:
    """Relative difference of memfit (a) to MemTracker (b)."""
    if a is None or b is None:
        return "n/a"
    if b == 0:
        return "equal" if a == 0 else f"{a - b:+,} B (MemTracker 0)"
    return f"{a - b:+,} B ({(a - b) / b:+.4%})"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# ---------------------------------------------------------------------------------------------
# 1. memfit
# ---------------------------------------------------------------------------------------------


def bench_memfit(repeat: int) -> dict[str, Any]:
    rss_before_import = peak_rss_bytes()
    t0 = time.perf_counter()
    import memfit

    t1 = time.perf_counter()
    estimate = memfit.estimate  # resolved lazily: imports memfit.estimator.estimation

    t2 = time.perf_counter()
    out: dict[str, Any] = {
        "import_memfit_s": t1 - t0,
        "import_memfit_estimate_s": t2 - t1,
        "import_total_s": t2 - t0,
        "rss_before_import_bytes": rss_before_import,
        "rss_after_import_bytes": peak_rss_bytes(),
        "models": {},
    }
    print(
        f"import memfit: {t1 - t0:.3f} s, + memfit.estimate module: {t2 - t1:.3f} s "
        f"(total {t2 - t0:.3f} s); peak RSS after import {fmt_bytes(out['rss_after_import_bytes'])}"
    )

    workload = memfit.Workload(
        batch_size=BATCH, seq_len=SEQ, precision=PRECISION, optimizer=OPTIMIZER
    )
    times: dict[str, list[float]] = {m: [] for m in MODELS}
    results: dict[str, Any] = {}
    # Round-robin so that the first round is each model's first estimate in this process.
    for _round in range(max(1, repeat)):
        for name in MODELS:
            gc.collect()
            t = time.perf_counter()
            est = estimate(name, workload, gpu=GPU)
            times[name].append(time.perf_counter() - t)
            results[name] = est
    out["rss_after_memfit_bytes"] = peak_rss_bytes()

    for name in MODELS:
        est = results[name]
        p = est.profile
        first = times[name][0]
        warm = min(times[name][1:]) if len(times[name]) > 1 else None
        out["models"][name] = {
            "first_s": first,
            "warm_s": warm,
            "all_s": times[name],
            "trace_seconds_last": est.trace_seconds,
            "replayed": est.replayed,
            "parameter_count": est.parameter_count,
            "peak_allocated_bytes": p.peak_allocated_bytes,
            "peak_step": p.peak_step,
            "peak_phase": p.peak_phase,
            "peak_op": p.peak_op,
            "breakdown": dict(p.breakdown),
            "fits": est.fits,
        }
        warm_txt = f"{warm:.3f} s" if warm is not None else "n/a"
        print(
            f"memfit {name}: first {first:.3f} s, warm {warm_txt} "
            f"(runs: {', '.join(f'{x:.3f}' for x in times[name])} s; trace_seconds "
            f"{est.trace_seconds:.3f} s), replayed={est.replayed}, "
            f"params={est.parameter_count:,}, peak allocated {fmt_bytes(p.peak_allocated_bytes)} "
            f"at step {p.peak_step} {p.peak_phase} / {p.peak_op}, fits={est.fits}"
        )
    print(
        f"peak RSS of the process after the memfit runs: {fmt_bytes(out['rss_after_memfit_bytes'])}"
    )

    targets = []
    for name in MODELS:
        m = out["models"][name]
        limit = TARGET_SECONDS[name]
        targets.append((f"{name} first estimate <= {limit:g} s", m["first_s"], limit))
        if m["warm_s"] is not None:
            targets.append((f"{name} warm estimate <= {limit:g} s", m["warm_s"], limit))
    rss = out["rss_after_memfit_bytes"]
    out["targets"] = {}
    print("targets:")
    for label, value, limit in targets:
        ok = value <= limit
        out["targets"][label] = {"value": value, "limit": limit, "pass": ok}
        print(f"  {verdict(ok)}  {label}: {value:.3f} s")
    ok = rss <= TARGET_RSS_BYTES
    out["targets"]["peak RSS <= 1 GiB"] = {"value": rss, "limit": TARGET_RSS_BYTES, "pass": ok}
    print(f"  {verdict(ok)}  peak RSS <= 1 GiB: {rss / GIB:.3f} GiB")
    return out


# ---------------------------------------------------------------------------------------------
# 2. MemTracker
# ---------------------------------------------------------------------------------------------


def bench_memtracker(model_name: str) -> dict[str, Any]:
    """Trace STEPS training steps of `model_name` with MemTracker on fake CPU tensors."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from memfit.models.catalog import build_model, get_model

    t0 = time.perf_counter()
    model = build_model(get_model(model_name), dtype=torch.bfloat16)  # meta device
    t1 = time.perf_counter()
    # Materialise the meta model as fake CPU tensors. to_empty calls empty_like on the meta
    # parameters, which FakeTensorMode refuses unless non-fake inputs are allowed; allow them
    # only for this step, so that every later op runs strictly on fake tensors.
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with fake_mode:
        model.to_empty(device="cpu")
    fake_mode.allow_non_fake_inputs = False
    model.train()
    if hasattr(model, "config"):
        model.config.use_cache = False
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    vocab = int(model.config.vocab_size)
    t2 = time.perf_counter()

    mt = MemTracker()
    mt.track_external(model, optimizer)  # the docs ask for this before entering the tracker
    step_s: list[float] = []
    with fake_mode, mt:
        for step in range(STEPS):
            ts = time.perf_counter()
            if step:
                # MemTracker refuses a second call of the root module ("does not support memory
                # tracking for multiple iterative calls") unless the module stats are reset; the
                # device-level current/peak snapshots are kept.
                mt.reset_mod_stats()
            input_ids = torch.randint(0, vocab, (BATCH, SEQ))
            labels = torch.randint(0, vocab, (BATCH, SEQ))
            loss = model(input_ids=input_ids, labels=labels).loss
            loss.backward()
            # memfit's step drops the loss and the batch before optimizer.step()
            # (memfit/estimator/trace/step_runner.py _one_step); do the same so the two trace the
            # same
            # program.
            del loss, input_ids, labels
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step_s.append(time.perf_counter() - ts)
    t3 = time.perf_counter()

    peak = mt.get_tracker_snapshot("peak")
    peak_by_dev = {
        str(dev): {getattr(k, "name", str(k)): int(v) for k, v in snap.items()}
        for dev, snap in peak.items()
    }
    # Split OPT into the state found in optimizer.state (exp_avg, exp_avg_sq, step) and the
    # rest (the foreach step's temporaries alive at the peak).
    opt_state = 0
    opt_steps = 0
    for st in optimizer.state.values():
        for key, v in st.items():
            if isinstance(v, torch.Tensor):
                nbytes = v.untyped_storage().nbytes()
                if key == "step":
                    opt_steps += nbytes
                else:
                    opt_state += nbytes
    return {
        "build_s": t1 - t0,
        "materialise_s": t2 - t1,
        "trace_s": t3 - t2,
        "step_s": step_s,
        "total_s": t3 - t0,
        "peak": peak_by_dev,
        "optimizer_state_bytes": opt_state,
        "optimizer_step_counter_bytes": opt_steps,
        "rss_after_memtracker_bytes": peak_rss_bytes(),
    }


def compare(memfit_res: dict[str, Any], mt: dict[str, Any], model_name: str) -> dict[str, Any]:
    m = memfit_res["models"][model_name]
    bd: dict[str, int] = m["breakdown"]
    dev_snaps = mt["peak"]
    dev = "cpu" if "cpu" in dev_snaps else next(iter(dev_snaps), None)
    snap = dev_snaps.get(dev, {}) if dev is not None else {}
    mt_total = snap.get("Total")
    opt = snap.get("OPT", 0)
    opt_state = mt["optimizer_state_bytes"]
    opt_steps = mt["optimizer_step_counter_bytes"]
    opt_tmp = opt - opt_state - opt_steps
    mt_vals = {
        "PARAM": snap.get("PARAM", 0),
        "BUFFER": snap.get("BUFFER", 0),
        "GRAD": snap.get("GRAD", 0),
        "OPT (state: exp_avg, exp_avg_sq)": opt_state,
        "OPT (state: step counters)": opt_steps,
        "TEMP + OPT (step temporaries)": snap.get("TEMP", 0) + opt_tmp,
        "ACT": snap.get("ACT", 0),
        "(in ACT)": None,
        "OTH": snap.get("OTH", 0),
        "-": None,
    }
    rows = []
    print(f"\nper-category bytes at the peak, {model_name} (memfit vs MemTracker on device {dev}):")
    print(f"  {'memfit':<16} {'MemTracker':<34} {'memfit bytes':>18} {'MemTracker bytes':>18}  rel")
    for mf_cat, mt_cat in CATEGORY_MAP:
        a = bd.get(mf_cat) if mf_cat != "-" else None
        b = mt_vals.get(mt_cat) if mt_cat != "-" else None
        rows.append({"memfit": mf_cat, "memtracker": mt_cat, "memfit_bytes": a, "mt_bytes": b})
        a_txt = f"{a:,}" if a is not None else "-"
        b_txt = f"{b:,}" if b is not None else "-"
        print(f"  {mf_cat:<16} {mt_cat:<34} {a_txt:>18} {b_txt:>18}  {rel(a, b)}")
    peak = m["peak_allocated_bytes"]
    no_ws = peak - bd.get("workspaces", 0)
    print(f"  {'TOTAL':<16} {'Total':<34} {peak:>18,} {mt_total or 0:>18,}  {rel(peak, mt_total)}")
    print(
        f"  {'TOTAL - ws':<16} {'Total':<34} {no_ws:>18,} {mt_total or 0:>18,}  "
        f"{rel(no_ws, mt_total)}"
    )
    print("  MemTracker raw peak snapshot:", json.dumps(dev_snaps))
    print(NOTES)
    return {
        "device": dev,
        "rows": rows,
        "memfit_peak_bytes": peak,
        "memfit_peak_minus_workspaces_bytes": no_ws,
        "memtracker_total_bytes": mt_total,
        "memtracker_opt_step_temporaries_bytes": opt_tmp,
    }


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="memfit timings only (no MemTracker)")
    ap.add_argument("--json", metavar="PATH", help="write all figures to this JSON file")
    ap.add_argument(
        "--repeat",
        type=int,
        default=2,
        help="estimates per model (the first is 'first', the best of the rest 'warm'; default 2)",
    )
    args = ap.parse_args(argv)

    # Versions from the package metadata: importing torch or transformers here would move their
    # import time out of the memfit timings below.
    versions = {}
    for pkg in ("torch", "transformers"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = "unavailable"
    print(
        f"python {platform.python_version()}, torch {versions['torch']}, transformers "
        f"{versions['transformers']}, {os.cpu_count()} CPU cores, {platform.machine()}"
    )
    print(
        f"workload: batch {BATCH}, seq {SEQ}, {PRECISION}, {OPTIMIZER} (foreach), "
        f"{STEPS} steps, gpu {GPU}\n"
    )
    results: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": versions["torch"],
        "transformers": versions["transformers"],
        "cpu_count": os.cpu_count(),
        "workload": {
            "batch_size": BATCH,
            "seq_len": SEQ,
            "precision": PRECISION,
            "optimizer": OPTIMIZER,
            "steps": STEPS,
            "gpu": GPU,
        },
    }

    results["memfit"] = bench_memfit(args.repeat)

    if args.quick:
        results["memtracker"] = None
    else:
        name = "llama-2-7b"
        print(f"\nMemTracker, {name}, {STEPS} steps on FakeTensorMode CPU tensors:")
        try:
            mt = bench_memtracker(name)
        except Exception as e:
            reason = f"{type(e).__name__}: {e}"
            traceback.print_exc()
            print(f"MemTracker could not run: {reason}")
            print("speed ratio MemTracker / memfit: unavailable")
            results["memtracker"] = {"error": reason}
        else:
            results["memtracker"] = mt
            m = results["memfit"]["models"][name]
            memfit_s = m["warm_s"] if m["warm_s"] is not None else m["first_s"]
            print(
                f"MemTracker {name}: build {mt['build_s']:.3f} s, materialise "
                f"{mt['materialise_s']:.3f} s, trace {mt['trace_s']:.3f} s (steps: "
                f"{', '.join(f'{s:.3f}' for s in mt['step_s'])} s), total {mt['total_s']:.3f} s"
            )
            for dev, snap in mt["peak"].items():
                print(f"MemTracker peak on {dev}: {fmt_bytes(snap.get('Total'))}")
            print(
                f"memfit {name} peak allocated: {fmt_bytes(m['peak_allocated_bytes'])} "
                f"(estimate {memfit_s:.3f} s warm, {m['first_s']:.3f} s first)"
            )
            ratio_warm = mt["total_s"] / memfit_s
            ratio_first = mt["total_s"] / m["first_s"]
            ratio_trace = mt["trace_s"] / memfit_s
            print(
                f"speed ratio MemTracker / memfit: {ratio_warm:.1f}x (MemTracker total vs memfit "
                f"warm), {ratio_first:.1f}x (vs memfit first), {ratio_trace:.1f}x (MemTracker "
                f"trace only vs memfit warm)"
            )
            print(
                "peak RSS of the process after MemTracker (max of both tools): "
                f"{fmt_bytes(mt['rss_after_memtracker_bytes'])}"
            )
            results["speed_ratio"] = {
                "memtracker_total_over_memfit_warm": ratio_warm,
                "memtracker_total_over_memfit_first": ratio_first,
                "memtracker_trace_over_memfit_warm": ratio_trace,
            }
            results["comparison"] = compare(results["memfit"], mt, name)

    results["wall_s"] = time.perf_counter() - T_START
    print(f"\nbenchmark wall time: {results['wall_s']:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
