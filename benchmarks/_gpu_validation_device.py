"""Reading the device: NVML (whole device and per process), the allocator's snapshot and history
(allocator traces), and `measure`, which runs one configuration's loop and reads its memory.

Figures of one configuration (see gpu_validation.py's docstring):

* ``step_max_memory_allocated`` / ``step_max_memory_reserved``: the peak from the moment the
  model is on the device (``reset_peak_memory_stats()`` after the build, with the build's
  cached free blocks returned by ``empty_cache()``): the figure memfit's estimate (which counts
  the weights from the start of its trace) is compared with;
* ``max_memory_allocated`` / ``max_memory_reserved``: the peak over build and steps (the first
  run's figure, kept for comparison with it);
* ``process_used_bytes``: this process's device memory from NVML at the end of the steps
  (``nvmlDeviceGetComputeRunningProcesses``, else ``nvidia-smi --query-compute-apps``), and
  ``device_total_bytes``: that, or the device's used memory less the worker's baseline when no
  per-process figure is readable. It includes the kernels every earlier configuration of the
  same worker loaded, so ``first_in_worker`` says when it is comparable with memfit's
  ``device_total_bytes``.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from _gpu_validation_configs import Config

MiB = 1 << 20
TRACE_FORMAT = "memfit-allocator-trace/1"
#: Ring-buffer size for _record_memory_history; a trace that fills it is incomplete.
TRACE_MAX_ENTRIES = 2_000_000


def _norm_uuid(u: Any) -> str:
    s = u.decode() if isinstance(u, bytes) else str(u)
    s = s.strip().lower()
    return s[4:] if s.startswith("gpu-") else s


def nvml_used() -> tuple[dict[str, int], str] | None:
    """Device memory in use per GPU ({uuid: bytes}, source), or None when NVML is unreachable."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            out = {}
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                out[_norm_uuid(pynvml.nvmlDeviceGetUUID(h))] = int(
                    pynvml.nvmlDeviceGetMemoryInfo(h).used
                )
            return out, "pynvml"
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no pynvml, no driver: fall back to nvidia-smi
        pass
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        text = subprocess.run(
            [exe, "--query-gpu=uuid,memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except Exception:
        return None
    out = {}
    for line in text.strip().splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[1].isdigit():
            out[_norm_uuid(parts[0])] = int(parts[1]) * MiB
    return (out, "nvidia-smi") if out else None


def _pick(reading: tuple[dict[str, int], str] | None, uuid: str | None) -> int | None:
    if reading is None:
        return None
    values = reading[0]
    if uuid is not None and _norm_uuid(uuid) in values:
        return values[_norm_uuid(uuid)]
    if len(values) == 1:
        return next(iter(values.values()))
    return None


def nvml_process_used(pid: int) -> tuple[int, str] | None:
    """Device memory NVML counts for process `pid` (bytes, source), or None when unreadable
    (no NVML, or a PID namespace that hides the process's host PID and more than one process
    is on the device)."""
    rows: list[tuple[int, int]] = []
    source = "pynvml"
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                    rows.append((int(p.pid), int(p.usedGpuMemory or 0)))
        finally:
            pynvml.nvmlShutdown()
    except ImportError:
        source = "nvidia-smi"
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return None
        try:
            text = subprocess.run(
                [exe, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=30, check=True,
            ).stdout  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return None
        for line in text.strip().splitlines():
            parts = [x.strip() for x in line.split(",")]
            if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                rows.append((int(parts[0]), int(parts[1]) * MiB))
    except Exception:  # pynvml's NVMLError: no driver, no permission
        return None
    mine = [used for p, used in rows if p == pid]
    if mine:
        return sum(mine), source
    if len(rows) == 1:  # the PID is namespaced; the only compute process is this one
        return rows[0][1], source + " (only process)"
    return None


def summarize_segments(segments: list[dict[str, Any]]) -> dict[str, Any]:
    """Count and bytes of the snapshot's segments per pool, and the large segments' sizes."""
    out: dict[str, Any] = {}
    for seg in segments:
        pool = seg.get("segment_type", "?")
        d = out.setdefault(pool, {"count": 0, "total_size": 0, "allocated_size": 0, "sizes": []})
        d["count"] += 1
        d["total_size"] += int(seg["total_size"])
        d["allocated_size"] += int(seg.get("allocated_size", 0))
        d["sizes"].append(int(seg["total_size"]))
    for d in out.values():
        d["sizes"].sort(reverse=True)
        if len(d["sizes"]) > 64:
            d["sizes"] = d["sizes"][:64]
            d["sizes_truncated"] = True
    return out


def snapshot_segments(segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A snapshot's segments in the trace format: pool, total size, blocks in address order."""
    out = []
    for seg in sorted(segments, key=lambda s: s.get("address", 0)):
        blocks = [
            [int(b["size"]), "free" if b.get("state") == "inactive" else "allocated"]
            for b in sorted(seg.get("blocks", []), key=lambda b: b.get("address", 0))
        ]
        out.append(
            {
                "pool": seg.get("segment_type"),
                "total_size": int(seg["total_size"]),
                "blocks": blocks,
            }
        )
    return out


def trace_from_snapshot(
    snapshot: dict[str, Any], *, device_index: int = 0, name: str = "", meta: Any = None
) -> dict[str, Any]:
    """Turn a ``torch.cuda.memory._snapshot()`` taken with history on into a trace file.

    events: ``["alloc", id, requested_size]`` for each "alloc" entry and ``["free", id, size]``
    for each "free_completed" one (the moment the block returns to the cache); ids number the
    allocations in order. checkpoints: after every event that changed reserved memory
    ("segment_alloc"/"segment_map" entries precede the "alloc" that needed them), the reserved
    bytes; after the last event, the full segment layout of the snapshot and the allocated
    bytes. The trace is marked incomplete when the ring buffer may have dropped entries, when
    the allocator held blocks before the history started, or when an OOM happened.
    """
    traces = snapshot.get("device_traces") or []
    entries = traces[device_index] if device_index < len(traces) else []
    events: list[list[Any]] = []
    checkpoints: list[dict[str, Any]] = []
    ids: dict[int, int] = {}
    next_id = 0
    reserved = 0
    last_reserved = 0
    complete = len(entries) < TRACE_MAX_ENTRIES
    notes: list[str] = []
    for e in entries:
        action = e.get("action")
        if action == "alloc":
            ids[e["addr"]] = next_id
            events.append(["alloc", next_id, int(e["size"])])
            next_id += 1
        elif action == "free_completed":
            if e["addr"] not in ids:
                complete = False
                notes.append("a free of a block allocated before the history started")
                continue
            events.append(["free", ids.pop(e["addr"]), int(e["size"])])
        elif action in ("segment_alloc", "segment_map"):
            reserved += int(e["size"])
            continue
        elif action in ("segment_free", "segment_unmap"):
            reserved -= int(e["size"])
            continue
        elif action == "oom":
            complete = False
            notes.append("an OOM")
            continue
        else:  # free_requested, snapshot
            continue
        if reserved != last_reserved:
            checkpoints.append({"after_event": len(events) - 1, "reserved_bytes": reserved})
            last_reserved = reserved
    segments = snapshot_segments(
        [s for s in snapshot.get("segments", []) if s.get("device", device_index) == device_index]
    )
    final_reserved = sum(s["total_size"] for s in segments)
    if final_reserved != reserved:
        complete = False
        notes.append(f"segments hold {final_reserved} B, the trace's segment entries {reserved} B")
    allocated = sum(b[0] for s in segments for b in s["blocks"] if b[1] == "allocated")
    if events:
        final = {"after_event": len(events) - 1, "reserved_bytes": final_reserved}
        final["allocated_bytes"] = allocated
        final["segments"] = segments
        if checkpoints and checkpoints[-1]["after_event"] == final["after_event"]:
            checkpoints[-1] = final
        else:
            checkpoints.append(final)
    return {
        "format": TRACE_FORMAT,
        "name": name,
        "source": "recorded",
        "description": "Recorded with torch.cuda.memory._record_memory_history on a GPU by "
        "benchmarks/gpu_validation.py --record-traces.",
        "derivation": "Expected reserved bytes from the trace's segment_alloc/segment_free "
        "entries; the final segment layout and allocated bytes from the same "
        "torch.cuda.memory._snapshot().",
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "capacity_bytes": None,
        "complete": complete and not notes,
        "notes": notes,
        "recorded_with": meta or {},
        "events": events,
        "checkpoints": checkpoints,
    }


def _clear_cuda() -> None:
    import torch

    gc.collect()
    torch.cuda.synchronize()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()  # the cuBLAS workspace is allocator memory kept per (handle, stream)
    torch.cuda.empty_cache()


def measure(
    cfg: Config,
    *,
    baseline: tuple[dict[str, int], str] | None,
    record_trace: bool = False,
    trace_path: Path | None = None,
    trace_meta: dict[str, Any] | None = None,
    first_in_worker: bool = True,
) -> dict[str, Any]:
    """Run `cfg` on the current CUDA device and read its memory; see the module docstring."""
    import torch
    from _gpu_validation_loops import RUNNERS
    from _gpu_validation_steps import run_real_steps

    dev = torch.device("cuda", torch.cuda.current_device())
    _clear_cuda()
    leftover = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    torch.cuda.reset_accumulated_memory_stats(dev)
    props = torch.cuda.get_device_properties(dev)
    uuid = str(getattr(props, "uuid", "")) or None
    if record_trace:
        record = torch.cuda.memory._record_memory_history
        try:
            record(enabled="all", context=None, max_entries=TRACE_MAX_ENTRIES, clear_history=True)
        except TypeError:  # a torch without clear_history
            record(enabled="all", context=None, max_entries=TRACE_MAX_ENTRIES)

    build: dict[str, int] = {}

    def on_built() -> dict[str, Any]:
        build["allocated"] = torch.cuda.max_memory_allocated(dev)
        build["reserved"] = torch.cuda.max_memory_reserved(dev)
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()  # the build's cached free blocks: not the step's
        torch.cuda.reset_peak_memory_stats(dev)
        return {
            "build_max_memory_allocated": build["allocated"],
            "build_max_memory_reserved": build["reserved"],
            "built_memory_allocated": torch.cuda.memory_allocated(dev),
        }

    def on_done() -> dict[str, Any]:
        torch.cuda.synchronize(dev)
        stats = torch.cuda.memory_stats(dev)
        snap = torch.cuda.memory._snapshot()
        reading = nvml_used()
        own = nvml_process_used(os.getpid())
        used = _pick(reading, uuid)
        base = _pick(baseline, uuid)
        step_alloc = torch.cuda.max_memory_allocated(dev)
        step_res = torch.cuda.max_memory_reserved(dev)
        if own is not None:
            device_total: int | None = own[0]
        else:
            device_total = used - base if used is not None and base is not None else None
        out: dict[str, Any] = {
            "step_max_memory_allocated": step_alloc,
            "step_max_memory_reserved": step_res,
            "max_memory_allocated": max(step_alloc, build.get("allocated", 0)),
            "max_memory_reserved": max(step_res, build.get("reserved", 0)),
            "memory_allocated_end": torch.cuda.memory_allocated(dev),
            "memory_reserved_end": torch.cuda.memory_reserved(dev),
            "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
            "num_ooms": int(stats.get("num_ooms", 0)),
            "nvml_source": reading[1] if reading else None,
            "nvml_used_bytes": used,
            "nvml_baseline_bytes": base,
            "process_used_bytes": own[0] if own else None,
            "process_used_source": own[1] if own else None,
            "device_total_bytes": device_total,
            "first_in_worker": first_in_worker,
            "segments": summarize_segments(snap.get("segments", [])),
            "leftover_allocated_bytes": leftover,
        }
        if record_trace and trace_path is not None:
            trace = trace_from_snapshot(
                snap, device_index=dev.index or 0, name=cfg.name, meta=trace_meta
            )
            if leftover:
                trace["complete"] = False
                trace["notes"].append(f"{leftover} B were allocated before the history started")
            trace_path.parent.mkdir(parents=True, exist_ok=True)
            trace_path.write_text(json.dumps(trace, separators=(",", ":")) + "\n")
            out["trace_file"] = str(trace_path)
            out["trace_events"] = len(trace["events"])
            out["trace_complete"] = trace["complete"]
        return out

    runner = RUNNERS.get(cfg.loop, run_real_steps)
    try:
        return runner(cfg, dev, on_built=on_built, on_done=on_done)
    finally:
        if record_trace:
            torch.cuda.memory._record_memory_history(enabled=None)
        _clear_cuda()


def device_info() -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "name": torch.cuda.get_device_name(),
        "total_memory": int(props.total_memory),
        "capability": [props.major, props.minor],
        "multi_processor_count": props.multi_processor_count,
        "uuid": str(getattr(props, "uuid", "")),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }
