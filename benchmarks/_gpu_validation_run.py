"""The GPU run of benchmarks/gpu_validation.py: workers measuring groups of configurations, the
estimates (stored, or made here in parallel processes), the budget, and the report."""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from _gpu_validation_configs import CONFIGS, Config, by_value
from _gpu_validation_device import _clear_cuda, device_info, measure, nvml_used
from _gpu_validation_estimates import estimate_entry
from _gpu_validation_plan import (
    ALONE,
    WORKER_START_S,
    group_workers,
    load_estimates,
    plan_seconds,
    stored_estimate,
)
from _gpu_validation_report import (
    TARGETS,
    _gib,
    _git_commit,
    _pct,
    compare,
    render_markdown,
    summarize,
)

FORMAT = "memfit-gpu-validation/1"
SCRIPT = Path(__file__).resolve().parent / "gpu_validation.py"
#: Share of the device parallel workers may plan to use together (their estimated totals).
PARALLEL_SHARE = 0.9
#: Seconds between two reads of the workers' result files.
POLL_S = 0.5


def _worker_main(batch_file: str) -> int:
    """Measure the batch's configurations in this process, one JSON line each."""
    batch = json.loads(Path(batch_file).read_text())
    baseline = nvml_used()  # before CUDA is initialised in this process
    out = Path(batch["result"])

    def emit(d: dict[str, Any]) -> None:
        with out.open("a") as f:
            f.write(json.dumps(d) + "\n")

    try:
        emit({"device": device_info()})
    except BaseException as e:
        emit({"device_error": f"{type(e).__name__}: {e}"})
        return 0
    first = True
    for item in batch["items"]:
        cfg = next(c for c in CONFIGS if c.name == item["name"])
        if time.time() + item["planned_seconds"] > batch["deadline"]:
            emit({"name": cfg.name, "skipped": "budget"})
            continue
        trace_path = Path(item["trace_path"]) if item.get("trace_path") else None
        try:
            res: dict[str, Any] = {
                "measured": measure(
                    cfg,
                    baseline=baseline,
                    record_trace=trace_path is not None,
                    trace_path=trace_path,
                    trace_meta=batch.get("trace_meta"),
                    first_in_worker=first,
                )
            }
        except BaseException as e:  # report everything, including OOM and KeyboardInterrupt
            res = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
            with contextlib.suppress(Exception):
                _clear_cuda()
        first = False
        emit({"name": cfg.name, **res})
    return 0


class Worker:
    """One worker process measuring a group of configurations; its results as they come."""

    def __init__(
        self,
        group: list[Config],
        planned: dict[str, float],
        deadline: float,
        workdir: Path,
        index: int,
        trace_of: Any,
        trace_meta: dict[str, Any],
    ) -> None:
        self.group, self.index = group, index
        self.results: dict[str, dict[str, Any]] = {}
        self.result = workdir / f"worker-{index}.jsonl"
        batch = {
            "result": str(self.result),
            "deadline": deadline,
            "trace_meta": trace_meta,
            "items": [
                {"name": c.name, "planned_seconds": planned[c.name], "trace_path": trace_of(c)}
                for c in group
            ],
        }
        batch_file = workdir / f"worker-{index}.json"
        batch_file.write_text(json.dumps(batch))
        cmd = [sys.executable, str(SCRIPT), "--worker-batch", str(batch_file)]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.device: dict[str, Any] | None = None
        self.since = time.time()
        self.read = 0

    def poll(self) -> list[dict[str, Any]]:
        """New result lines since the last poll (complete lines only)."""
        text = self.result.read_text() if self.result.is_file() else ""
        lines = text.split("\n")[:-1]  # the last is "" or a line still being written
        new = [json.loads(x) for x in lines[self.read :]]
        self.read = len(lines)
        out = []
        for d in new:
            if "device" in d or "device_error" in d:
                self.device = d
            else:
                self.results[d["name"]] = d
                out.append(d)
                self.since = time.time()
        return out

    def pending(self) -> list[Config]:
        return [c for c in self.group if c.name not in self.results]

    def finish(self, why: str) -> dict[str, Any]:
        """Stop the process (it ended or timed out); the configuration it was on failed."""
        if self.proc.poll() is None:
            self.proc.kill()
        output = self.proc.communicate()[0] or ""
        rest = self.pending()
        failed = {}
        if self.device and "device_error" in self.device:
            why += f" (no device: {self.device['device_error']})"
        if rest:
            failed = {"name": rest[0].name, "error": f"{why}\n{output[-3000:]}"}
            self.results[rest[0].name] = failed
        return failed


def _device_name() -> str | None:
    """The GPU's name from NVML / nvidia-smi, without creating a CUDA context here."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        text = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
        return text.splitlines()[0].strip() if text else None
    return None


def _catalog_gpu(display_name: str | None, fallback: str) -> tuple[str, str | None]:
    """(catalog name, note): the catalog GPU matching the device's name, else `fallback`."""
    from memfit.cuda.target import get_gpu
    from memfit.errors import BadInputError

    if display_name:
        try:
            return get_gpu(display_name).name, None
        except BadInputError:
            return get_gpu(fallback).name, (
                f"{display_name!r} is not in memfit's GPU catalog; estimates use {fallback!r}"
            )
    return get_gpu(fallback).name, None


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # a broken driver install reads as "no GPU": estimates only
        return False


def run(args: Any, configs: list[Config], store: Path, alloc_conf: str, vers: dict) -> int:
    """Estimate and (on a GPU) measure `configs`; write the report after every result."""
    gpu_present = _cuda_available()
    fallback = (args.gpu or "h100-sxm").split(",")[0]
    date = datetime.date.today().isoformat()
    notes: list[str] = []
    if gpu_present:
        gpu, note = _catalog_gpu(_device_name(), fallback)
        notes += [note] if note else []
        stem = gpu
        mode = (
            "in-process"
            if args.in_process
            else (
                "one worker process per configuration"
                if args.fresh
                else f"workers of several configurations, {args.parallel} at once"
            )
        )
    else:
        gpu, _ = _catalog_gpu(None, fallback)
        stem, mode = "cpu-estimate-only", "estimate only"
    suffix = ("-quick" if args.quick else "") + ("-only" if args.only else "")
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{stem}-{date}{suffix}.json"
    md_path = json_path.with_suffix(".md")
    data = {} if args.fresh_estimates else load_estimates(store)
    meta: dict[str, Any] = {
        "format": FORMAT,
        "title": f"{stem}-{date}{suffix}",
        "date": date,
        "gpu": gpu,
        "gpu_present": gpu_present,
        "device": None,
        "mode": mode,
        "alloc_conf": alloc_conf,
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        **vers,
        "memfit_commit": _git_commit(),
        "estimates_file": str(store) if data else None,
        "estimates_commit": data.get("memfit_commit"),
        "budget_s": args.budget,
        "argv": sys.argv[1:],
        "targets": TARGETS,
        "notes": notes,
    }
    done: dict[str, dict[str, Any]] = {}
    if args.resume and json_path.is_file():
        with contextlib.suppress(json.JSONDecodeError, KeyError):
            previous = json.loads(json_path.read_text())
            done = {r["name"]: r for r in previous["rows"] if not r.get("failed")}
    todo = [c for c in by_value(configs) if c.name not in done]
    print(f"memfit GPU validation: {len(configs)} configurations; {mode}; estimates for {gpu}")
    t_all = time.time()
    deadline = t_all + args.budget if args.budget else math.inf
    est: dict[str, dict[str, Any]] = {}  # name -> {"estimate", "error", "source"}
    meas: dict[str, dict[str, Any]] = {}  # name -> worker result line
    for c in todo:
        entry = stored_estimate(data, gpu, c) if data else None
        if entry is not None:
            est[c.name] = {**entry, "source": f"stored ({data.get('memfit_commit')})"}
    order = [c.name for c in configs]

    def write() -> None:
        rows = [done[n] for n in order if n in done]
        for c in configs:
            if c.name in done or (c.name not in est and c.name not in meas):
                continue
            e, m = est.get(c.name, {}), meas.get(c.name, {})
            row = {
                "name": c.name,
                "label": c.label(),
                "config": asdict(c),
                "estimate": e.get("estimate"),
                "measured": m.get("measured"),
                "estimate_error": e.get("error"),
                "measure_error": m.get("error"),
                "estimate_source": e.get("source"),
                "skipped": m.get("skipped"),
                "planned_seconds": planned.get(c.name),
            }
            row["errors"] = compare(row["estimate"], row["measured"])
            row["failed"] = bool(row["estimate_error"] or row["measure_error"])
            rows.append(row)
        rows.sort(key=lambda r: order.index(r["name"]))
        meta["seconds"] = round(time.time() - t_all, 1)
        report = {"meta": meta, "summary": summarize(rows), "rows": rows}
        json_path.write_text(json.dumps(report, indent=1) + "\n")
        md_path.write_text(render_markdown(report))

    def line(name: str) -> None:
        e, m = est.get(name, {}).get("estimate") or {}, meas.get(name, {})
        err = compare(e, m.get("measured"))
        status = (
            "FAILED"
            if (est.get(name, {}).get("error") or m.get("error"))
            else ("skipped" if m.get("skipped") else "ok")
        )
        print(
            f"{name:48s} {status:7s} est alloc {_gib(e.get('peak_allocated_bytes'))} GiB"
            + (
                f" | alloc err {_pct(err['allocated_rel'])}, reserved err "
                f"{_pct(err['reserved_rel'])}"
                if m.get("measured")
                else ""
            ),
            flush=True,
        )

    planned = {
        c.name: plan_seconds(c, (est.get(c.name) or {}).get("estimate"), first=False) for c in todo
    }
    if not gpu_present:
        for c in todo:
            if c.name not in est:
                est[c.name] = {**estimate_entry(c.name, gpu, alloc_conf), "source": "made here"}
            line(c.name)
            write()
        write()
        print(f"wrote {json_path} and {md_path}\nestimate only: no GPU")
        return 1 if all(r["failed"] for r in json.loads(json_path.read_text())["rows"]) else 0
    pending = [c for c in todo if c.name not in est]
    pool = (
        ProcessPoolExecutor(max(1, min(len(pending), (os.cpu_count() or 2) - 2)))
        if pending
        else None
    )
    futures: dict[str, Future] = (
        {c.name: pool.submit(estimate_entry, c.name, gpu, alloc_conf) for c in pending}
        if pool
        else {}
    )
    if args.in_process:
        _measure_here(todo, meas, planned, deadline, write, line)
    else:
        _measure_in_workers(args, todo, est, meas, planned, deadline, meta, write, line, gpu)
    for name, fut in futures.items():
        est[name] = {**fut.result(), "source": "made here"}
    if pool is not None:
        pool.shutdown()
    write()
    print(f"wrote {json_path} and {md_path}")
    return 1 if all(r["failed"] for r in json.loads(json_path.read_text())["rows"]) else 0


def _measure_here(
    todo: list[Config], meas: dict, planned: dict, deadline: float, write: Any, line: Any
) -> None:
    baseline = nvml_used()
    for i, c in enumerate(todo):
        if time.time() + planned[c.name] > deadline:
            meas[c.name] = {"skipped": "budget"}
            continue
        try:
            meas[c.name] = {"measured": measure(c, baseline=baseline, first_in_worker=i == 0)}
        except Exception as e:  # recorded in the row; the run goes on
            meas[c.name] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
            with contextlib.suppress(Exception):
                _clear_cuda()
        line(c.name)
        write()


def _measure_in_workers(
    args: Any,
    todo: list[Config],
    est: dict,
    meas: dict,
    planned: dict,
    deadline: float,
    meta: dict,
    write: Any,
    line: Any,
    gpu: str,
) -> None:
    from memfit.cuda.target import get_gpu

    capacity = get_gpu(gpu).total_memory_bytes
    groups = deque([[c] for c in todo] if args.fresh else group_workers(todo))
    workdir = Path(tempfile.mkdtemp(prefix="memfit-gv-"))
    trace_dir = args.out / "traces"
    trace_meta = {"torch": meta["torch"], "alloc_conf": meta["alloc_conf"]}

    def trace_of(c: Config) -> str | None:
        if args.record_traces and c.trace:
            return str(trace_dir / f"{c.name}-{gpu}-{meta['date']}.json")
        return None

    def need(group: list[Config]) -> int:
        return max(
            ((est.get(c.name) or {}).get("estimate") or {}).get("device_total_bytes") or capacity
            for c in group
        )

    active: list[Worker] = []
    started = 0
    while groups or active:
        while groups and len(active) < max(1, args.parallel):
            group = groups[0]
            if active and (
                group[0].loop in ALONE
                or any(w.group[0].loop in ALONE for w in active)
                or sum(need(w.group) for w in active) + need(group) > PARALLEL_SHARE * capacity
            ):
                break
            groups.popleft()
            first = plan_seconds(
                group[0], (est.get(group[0].name) or {}).get("estimate"), first=True
            )
            if time.time() + WORKER_START_S + first > deadline:
                for c in [*group, *(c for g in groups for c in g)]:
                    meas[c.name] = {"skipped": "budget"}
                groups.clear()
                write()
                break
            active.append(Worker(group, planned, deadline, workdir, started, trace_of, trace_meta))
            started += 1
        time.sleep(POLL_S)
        for w in list(active):
            for d in w.poll():
                meas[d["name"]] = d
                line(d["name"])
                write()
            if w.device and "device" in w.device and meta["device"] is None:
                meta["device"] = w.device["device"]
            ended = w.proc.poll() is not None
            if ended or time.time() - w.since > args.timeout:
                for d in w.poll():
                    meas[d["name"]] = d
                why = (
                    f"worker exited with status {w.proc.returncode}"
                    if ended
                    else f"worker timed out after {args.timeout:.0f} s"
                )
                failed = w.finish(why)
                if failed:
                    meas[failed["name"]] = failed
                    line(failed["name"])
                rest = w.pending()
                if rest:
                    groups.appendleft(rest)
                active.remove(w)
                write()
    shutil.rmtree(workdir, ignore_errors=True)
