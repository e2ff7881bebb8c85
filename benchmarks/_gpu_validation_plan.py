"""What a GPU run will cost, the estimates stored beside the configurations, and the workers.

Time model (seconds of GPU machine time, sequential workers), from the first run
(benchmarks/results/h200-2026-11-27.json, one fresh worker per configuration, 29 rows):

* WORKER_START_S: a worker's start to its first configuration: Python, torch, CUDA context,
  NVML. The median of wall_seconds - measured.seconds there is 5.49 s.
* FIRST_CONFIG_S: the first configuration of a worker pays the imports of transformers'
  modeling code, cuBLAS/cuDNN initialisation and the kernels' lazy loading: the median of
  measured.seconds (build + 2 steps in a fresh worker) is 8.24 s, for steps of < 0.5 s.
* WARM_CONFIG_S: a later configuration in the same worker (build on meta, storage, init,
  kernels not yet loaded, the gc + empty_cache between configurations); not measured yet,
  taken as 2 s.
* compute: the estimate's FLOPs of a step (Estimate.flops) x 2 steps at COMPUTE_FLOPS for its
  dtype (16-bit: 110 TFLOP/s, a ninth of an H100 SXM's 989 TFLOP/s dense peak, as small
  batches reach; fp32 without TF32: 22 TFLOP/s, a third of its 67 TFLOP/s); 6 (training) or 2
  x parameters x tokens per step when the estimate has no FLOPs.
* LOOP_EXTRA_S: what a loop adds: the Trainer and accelerate's set-up and MemfitCallback's own
  estimate at on_train_begin (24 s on this project's 2 shared CPU cores, taken as 10 s on the
  GPU machine's 16); a QLoRA random checkpoint (1 GB) written and loaded quantized; the 7B
  model's 13.5 GB of storage and initialisation; generate's per-token Python overhead
  (GENERATE_TOKEN_S per new token and beam group).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from _gpu_validation_configs import Config

WORKER_START_S = 5.5
FIRST_CONFIG_S = 8.2
WARM_CONFIG_S = 2.0
COMPUTE_FLOPS = {"16-bit": 110e12, "fp32": 22e12}
LOOP_EXTRA_S = {"trainer": 14.0, "qlora": 15.0, "generate": 1.0, "full-7b": 6.0}
GENERATE_TOKEN_S = 0.03
#: Planned seconds a worker may take before the next configuration goes to a new one.
WORKER_PLAN_S = 60.0
#: The whole run must plan within this (issue 31: "a suite that fits four GPU minutes").
SUITE_BUDGET_S = 240.0
#: Loops that run alone in a fresh worker (the 7B step: 67 GiB device total).
ALONE = ("full-7b",)

ESTIMATES_FORMAT = "memfit-gpu-validation-estimates/1"
ESTIMATES_DIR = Path(__file__).resolve().parent


def stack_key(torch_version: str, transformers_version: str) -> str:
    """'torch2.11-tf5.17': the versions stored estimates are valid for (major.minor)."""

    def mm(v: str) -> str:
        m = re.match(r"(\d+)\.(\d+)", v)
        return f"{m.group(1)}.{m.group(2)}" if m else v

    return f"torch{mm(torch_version)}-tf{mm(transformers_version)}"


def estimates_path(key: str, folder: Path = ESTIMATES_DIR) -> Path:
    return folder / f"gpu_validation_estimates-{key}.json"


def fingerprint(cfg: Config) -> str:
    """A short hash of everything a configuration sets (a changed config is re-estimated)."""
    fields = {k: v for k, v in asdict(cfg).items() if k not in ("quick", "trace")}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def load_estimates(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {"format": ESTIMATES_FORMAT, "gpus": {}}
    data = json.loads(path.read_text())
    if data.get("format") != ESTIMATES_FORMAT:
        raise ValueError(f"{path}: format {data.get('format')!r}, expected {ESTIMATES_FORMAT!r}")
    return data


def stored_estimate(data: dict[str, Any], gpu: str, cfg: Config) -> dict[str, Any] | None:
    """The stored entry of `cfg` on `gpu` ({"estimate": ..., "error": ...}) when its
    fingerprint matches, else None."""
    entry = data.get("gpus", {}).get(gpu, {}).get(cfg.name)
    if entry is None or entry.get("fingerprint") != fingerprint(cfg):
        return None
    return entry


# ---------------------------------------------------------------------------- time


def _catalog_parameters(model: str) -> int:
    """The catalog's parameter count of `model`; the Trainer loop's Llama is not in it."""
    from memfit.errors import BadInputError
    from memfit.models.catalog import get_model

    try:
        return get_model(model).parameter_count or 0
    except BadInputError:
        return TRAINER_LLAMA_PARAMETERS


#: Parameters of _gpu_validation_loops.TRAINER_LLAMA (the Trainer loop's model).
TRAINER_LLAMA_PARAMETERS = 200_827_904


def compute_seconds(cfg: Config, estimate: dict[str, Any] | None) -> float:
    e = estimate or {}
    flops = e.get("flops_per_step")
    params = e.get("parameter_count") or _catalog_parameters(cfg.model)
    if not flops:
        tokens = cfg.batch_size * (cfg.seq_len or cfg.prompt_len or 1)
        flops = (6 if cfg.mode == "train" else 2) * params * tokens
    rate = COMPUTE_FLOPS["fp32" if cfg.precision == "fp32" else "16-bit"]
    return 2 * flops / rate


def plan_seconds(cfg: Config, estimate: dict[str, Any] | None, *, first: bool) -> float:
    """Planned GPU-machine seconds of `cfg` in a worker (not counting the worker's start)."""
    t = FIRST_CONFIG_S if first else WARM_CONFIG_S
    t += compute_seconds(cfg, estimate) + LOOP_EXTRA_S.get(cfg.loop, 0.0)
    if cfg.mode == "generate":
        t += GENERATE_TOKEN_S * cfg.new_tokens * max(1, cfg.num_beams // 2)
    return t


def group_workers(configs: list[Config]) -> list[list[Config]]:
    """Consecutive configurations share a worker until it plans WORKER_PLAN_S; ALONE loops get
    their own."""
    groups: list[list[Config]] = []
    planned = 0.0
    for cfg in configs:
        alone = cfg.loop in ALONE
        if not groups or alone or planned >= WORKER_PLAN_S or groups[-1][0].loop in ALONE:
            groups.append([cfg])
            planned = plan_seconds(cfg, None, first=True)
        else:
            groups[-1].append(cfg)
            planned += plan_seconds(cfg, None, first=False)
    return groups


def plan(
    configs: list[Config], estimates: dict[str, dict[str, Any] | None]
) -> tuple[list[tuple[Config, float, int]], float]:
    """[(config, planned seconds, worker index)] in run order, and the total with the workers'
    starts."""
    rows = []
    total = 0.0
    for w, group in enumerate(group_workers(configs)):
        total += WORKER_START_S
        for i, cfg in enumerate(group):
            s = plan_seconds(cfg, estimates.get(cfg.name), first=i == 0)
            rows.append((cfg, s, w))
            total += s
    return rows, total
