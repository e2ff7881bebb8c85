"""Time `memfit plan` and `memfit estimate` as a user runs them (a new process each), against
the previous planner, measured in the same run on the same machine.

    python benchmarks/bench_plan.py                   # all three commands (~4 min, 2 cores)
    python benchmarks/bench_plan.py --only estimate   # one of them (plan-1b, plan-7b, estimate)
    python benchmarks/bench_plan.py --baseline REF    # another git ref as "previous"
    python benchmarks/bench_plan.py --jobs 2          # also cold with MEMFIT_JOBS=2

The previous planner is a git ref of this repository (BASELINE_REF by default: memfit before
the trace cache) exported with `git archive` into a temporary folder and run from there with
the same Python and packages. Each command runs:
- previous, cold: the baseline's code (it has no cache);
- cold: this tree, with an empty cache folder (MEMFIT_CACHE_DIR) and no MEMFIT_JOBS;
- warm: this tree again, with the cache the cold run filled (a repeated command);
- warm traces: this tree with only the trace cache filled (the plan files removed): a plan
  that was not asked before, of traces that were (plans only);
- with `--jobs N`, cold with MEMFIT_JOBS=N too (memfit.estimator.parallel), its own empty
  cache (not a target: a figure for machines whose cores run side by side).
It prints each wall time (imports and interpreter exit included, as a user waits), the ratios
against the previous planner, the issue 17 targets (plans cold <= 0.3 x previous, warm <= 2 s;
the estimate cold <= 3 s) as PASS/FAIL, and whether every run printed the same plan or
estimate as the previous planner (the JSON without the fields that measure the search, its
timings and counts, on the fields both versions print).

It also prints the floor under every cold figure: a new process that only imports what these
commands import before their first trace (memfit's CLI, the model's transformers code, the
FakeTensor machinery with the `torch._dynamo` it pulls in) and exits as memfit does, the best
of three. No cold command can take less.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: memfit before the trace cache and the parallel traces (issue 17).
BASELINE_REF = "5a1b1d0"

COMMANDS = {
    "plan-1b": ["plan", "llama-3.2-1b", "--gpu", "rtx-4090", "--global-batch", "16",
                "--seq", "2048"],
    "plan-7b": ["plan", "llama-2-7b", "--gpu", "rtx-4090", "--global-batch", "32",
                "--seq", "2048", "--host-memory", "64GiB"],
    "estimate": ["estimate", "llama-2-7b", "--seq", "2048"],
}  # fmt: skip
COLD_RATIO, WARM_SECONDS, ESTIMATE_COLD_SECONDS = 0.3, 2.0, 3.0
#: JSON fields that measure the search (its timings, and how many configurations it estimated
#: from how many traces), not its result: a faster search changes them.
TIMINGS = {"seconds", "trace_seconds", "search_seconds", "from_cache", "evaluated", "traces"}


def _run(src: Path, args: list[str], cache: Path | None, jobs: int | None = None
         ) -> tuple[float, dict]:  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("MEMFIT_JOBS", "MEMFIT_NO_CACHE")}
    if jobs is not None:
        env["MEMFIT_JOBS"] = str(jobs)
    env["PYTHONPATH"] = str(src)
    if cache is None:
        env["MEMFIT_NO_CACHE"] = "1"
    else:
        env["MEMFIT_CACHE_DIR"] = str(cache)
    code = "import sys; from memfit.cli.app import main; sys.argv[0] = 'memfit'; main()"
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *args, "--json"], env=env,
                          capture_output=True, text=True)  # fmt: skip
    seconds = time.perf_counter() - t0
    if done.returncode not in (0, 1):
        raise SystemExit(f"memfit {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return seconds, json.loads(done.stdout)


#: What every command here imports before its first trace: all three trace a Llama model.
FLOOR_IMPORTS = (
    "import os, memfit.cli.app, memfit.estimator.trace.step_runner, torch._dynamo;"
    "from torch._subclasses.fake_tensor import FakeTensorMode;"
    "from transformers import LlamaForCausalLM;"
    "os._exit(0)"
)


def _floor(src: Path) -> float:
    """The least wall time of three new processes that only import (see FLOOR_IMPORTS)."""
    env = dict(os.environ, PYTHONPATH=str(src))
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", FLOOR_IMPORTS], env=env, check=True,
                       capture_output=True)  # fmt: skip
        times.append(time.perf_counter() - t0)
    return min(times)


def _results(doc: object) -> object:
    if isinstance(doc, dict):
        return {k: _results(v) for k, v in doc.items() if k not in TIMINGS}
    if isinstance(doc, list):
        return [_results(v) for v in doc]
    return doc


def _same(previous: object, now: object) -> bool:
    """The same results, on the fields both versions print (a field the newer one added, such
    as a plan's distillation fields, is not a change of result)."""
    if isinstance(previous, dict) and isinstance(now, dict):
        common = (set(previous) & set(now)) - TIMINGS
        return all(_same(previous[k], now[k]) for k in common)
    if isinstance(previous, list) and isinstance(now, list):
        return len(previous) == len(now) and all(map(_same, previous, now))
    return previous == now


def _export(ref: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "src"],
                             capture_output=True, check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE_REF, help="git ref of the previous planner")
    parser.add_argument("--only", choices=sorted(COMMANDS), action="append")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--jobs", type=int, metavar="N",
                        help="also run cold with MEMFIT_JOBS=N (traces side by side)")  # fmt: skip
    args = parser.parse_args()
    names = args.only or list(COMMANDS)
    rows = []
    with tempfile.TemporaryDirectory(prefix="memfit-bench-") as tmp:
        previous = _export(args.baseline, Path(tmp))
        for name in names:
            argv = COMMANDS[name]
            cache = Path(tmp) / f"cache-{name}"
            base_s, base = _run(previous, argv, None)
            cold_s, cold = _run(ROOT / "src", argv, cache)
            warm_s, warm = _run(ROOT / "src", argv, cache)
            row = {"name": name, "previous": base_s, "cold": cold_s, "warm": warm_s,
                   "same": _same(base, cold) and _results(cold) == _results(warm)}  # fmt: skip
            if args.jobs is not None:
                jobs_s, with_jobs = _run(ROOT / "src", argv, Path(tmp) / f"jobs-{name}", args.jobs)
                row["cold_jobs"], row["jobs"] = jobs_s, args.jobs
                row["same"] = row["same"] and _results(with_jobs) == _results(cold)
            if name.startswith("plan"):
                shutil.rmtree(cache / "plans")
                traces_s, traced = _run(ROOT / "src", argv, cache)
                row["warm_traces"] = traces_s
                row["same"] = row["same"] and _results(traced) == _results(cold)
            rows.append(row)
            print(_line(row, argv), flush=True)
        floor = _floor(ROOT / "src")
    print(f"\nfloor: a new process that only imports what they import takes {floor:.2f} s")
    print()
    for row in rows:
        for verdict in _verdicts(row):
            print(verdict)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"floor": floor, "rows": rows}, indent=2))


def _line(row: dict, argv: list[str]) -> str:
    extra = f", warm traces {row['warm_traces']:.1f} s" if "warm_traces" in row else ""
    if "cold_jobs" in row:
        extra += (f", cold with MEMFIT_JOBS={row['jobs']} {row['cold_jobs']:.1f} s "
                  f"({row['cold_jobs'] / row['previous']:.2f} x)")  # fmt: skip
    return (
        f"memfit {' '.join(argv)}\n  previous {row['previous']:.1f} s, cold {row['cold']:.1f} s "
        f"({row['cold'] / row['previous']:.2f} x), warm {row['warm']:.1f} s{extra}; "
        f"same results as previous: {'yes' if row['same'] else 'NO'}"
    )


def _verdicts(row: dict) -> list[str]:
    def mark(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    name, cold, warm = row["name"], row["cold"], row["warm"]
    if name == "estimate":
        return [f"{mark(cold <= ESTIMATE_COLD_SECONDS)}  {name} cold <= "
                f"{ESTIMATE_COLD_SECONDS:.0f} s: {cold:.2f} s"]  # fmt: skip
    ratio = cold / row["previous"]
    return [
        f"{mark(ratio <= COLD_RATIO)}  {name} cold <= {COLD_RATIO} x previous: {ratio:.2f} x",
        f"{mark(warm <= WARM_SECONDS)}  {name} warm <= {WARM_SECONDS:.0f} s: {warm:.2f} s",
    ]


if __name__ == "__main__":
    main()
