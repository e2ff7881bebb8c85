"""ResNet-18 fp32 on the H200: is the reserved-memory gap the cuDNN workspace sizes alone?

memfit estimates `resnet18-fp32-sgd-b16` (benchmarks/gpu_validation.py) and keeps the allocator
stream it replays. Then the size of each cuDNN workspace in that stream is replaced by the size
the H200 requested for the same call (tests/data/allocator_traces/resnet18-fp32-sgd-b16-h200-
2026-11-27.json: a workspace is an allocation freed by the next event), and the stream is
replayed again. If the substituted stream reaches the measured `max_memory_reserved`, everything
but the sizes (the tensors, their order, the allocator) is right.

The calls are matched in order, per step. The H200 made 19 forward and 37 backward workspace
requests a step where memfit makes 20 and 39: cuDNN ran layer2's 1x1 downsample with no
workspace in forward, and each 1x1 downsample's backward (layers 2 and 3) with one request
instead of two; those memfit calls get 0 bytes (no allocation), and the single request stands
for the weight gradient's.

Run under the stack of the measurement (docs/accuracy.md): ``PYTHONPATH=src python
benchmarks/cudnn_workspace_substitution.py``.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gpu_validation import CONFIGS, run_estimate  # noqa: E402

NAME = "resnet18-fp32-sgd-b16"
TRACE = HERE.parent / "tests/data/allocator_traces" / f"{NAME}-h200-2026-11-27.json"
REPORT = HERE / "results" / "h200-2026-11-27.json"


def recorded_workspaces(events: list[list[Any]]) -> list[int]:
    """Sizes of the allocations freed by the very next event, in order."""
    return [a[2] for a, b in itertools.pairwise(events)
            if a[0] == "alloc" and b[0] == "free" and b[1] == a[1]]  # fmt: skip


def per_memfit_call(step: list[int]) -> list[int]:
    """One step's 56 recorded requests laid out on memfit's 59 calls (module docstring)."""
    fwd, bwd = step[:19], step[19:]
    fwd = [*fwd[:5], 0, *fwd[5:]]  # layer2.0.downsample: no workspace
    bwd = [*bwd[:18], 0, bwd[18], *bwd[19:27], 0, bwd[27], *bwd[28:]]
    return fwd + bwd


def main() -> int:
    import memfit.estimator.device_memory as dm
    import memfit.estimator.estimation as estimation
    from memfit.cuda.allocator_replay import simulate
    from memfit.estimator.trace import cache

    streams: list[list[tuple[int, int, int]]] = []
    replay = dm.simulate_shared

    def keep(stream: list[tuple[int, int, int]], **kw: Any) -> Any:
        streams.append(list(stream))
        return replay(stream, **kw)

    dm.simulate_shared = keep  # type: ignore[assignment]
    captured: dict[str, Any] = {}
    device_memory = estimation.device_memory

    def keep_records(records: Any, events: Any, w: Any, **kw: Any) -> Any:
        captured["records"] = records
        return device_memory(records, events, w, **kw)

    estimation.device_memory = keep_records  # type: ignore[assignment]
    with cache.caching(False):
        cfg = next(c for c in CONFIGS if c.name == NAME)
        estimate = run_estimate(cfg, "h200", None)
    stream, records = streams[0], captured["records"]
    calls = [i for i, (kind, sid, _) in enumerate(stream)
             if kind == 1 and sid in records and records[sid].category == "workspaces"
             and records[sid].op.startswith("convolution")]  # fmt: skip
    recorded = recorded_workspaces(json.loads(TRACE.read_text())["events"])
    sizes = per_memfit_call(recorded[:56]) + per_memfit_call(recorded[56:])
    if len(sizes) != len(calls):
        raise SystemExit(f"memfit makes {len(calls)} cuDNN calls, expected {len(sizes)}")
    new = dict(zip(calls, sizes, strict=True))
    substituted = [(k, s, new.get(i, n)) for i, (k, s, n) in enumerate(stream)]
    report = json.loads(REPORT.read_text())
    measured = next(r for r in report["rows"] if r["name"] == NAME)["measured"]
    meas = measured["max_memory_reserved"]
    print(f"measured max_memory_reserved       {meas:,}")
    for label, s in (("memfit", stream), ("memfit, H200 workspace sizes", substituted)):
        got = simulate(s).peak_reserved_bytes
        print(f"{label:34} {got:,} ({(got - meas) / meas:+.2%})")
    print(f"(estimate's peak_reserved_bytes: {estimate['peak_reserved_bytes']:,})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
