"""memfit's estimates against GPU measurements that others published.

No GPU has been lent to memfit's development so far, so this is the only comparison with real
CUDA (and ROCm) allocator figures we can make. Each point below is a run whose configuration
is fully stated by its source: model, shapes, dtype, optimizer, what was measured and in
which unit. Figures are copied exactly as published (optimum-benchmark reports MB = 1e6 bytes,
from `torch.cuda.max_memory_allocated() / 1e6` after `torch.cuda.reset_peak_memory_stats()`,
with the model already on the device).

The transformers docs' SDPA training table for opt-350m is compared in
benchmarks/published_sdpa_training.py: its loop (a `logits.sum()` loss, no optimizer) is not
memfit's own, so it runs there as a user's trial under `memfit.simulate(fake=True)`.

Considered and left out: the same docs' table for pythia-410m (transformers 4.42's GPT-NeoX
kernels differ from today's), and the "Model training anatomy" V100 figures (torch ~1.10,
whose zero_grad kept gradients, and NVML totals with CUDA 11.2 eager kernel loading).

    python benchmarks/published_measurements.py            # ~15 s on 2 cores
    python benchmarks/published_measurements.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

import memfit


@dataclass(frozen=True)
class Published:
    name: str
    source: str
    setup: str
    model: str
    workload: dict[str, Any]
    gpu: str  # memfit catalog GPU used for the estimate
    allocated: int  # bytes, torch.cuda.max_memory_allocated
    reserved: int  # bytes, torch.cuda.max_memory_reserved
    caveat: str = ""


POINTS = (
    Published(
        name="bert-base-uncased forward, fp32, batch 1 x 128 (A10G)",
        source=(
            "https://huggingface.co/datasets/optimum-benchmark/cuda/blob/main/"
            "cuda_pytorch_bert/benchmark_report.json (forward / first_forward memory); "
            "config: .../cuda_pytorch_bert/benchmark_config.json"
        ),
        setup=(
            "NVIDIA A10G, torch 2.5.1+cu124 .. 2.8.0 (the same allocated figure in every "
            "snapshot), BertForMaskedLM with random weights, eval, torch.inference_mode(), "
            "SDPA, no labels"
        ),
        model="bert-base-uncased",
        workload={"mode": "inference", "batch_size": 1, "seq_len": 128},
        gpu="a10g",
        allocated=465_184_256,  # 465.184256 MB
        reserved=513_802_240,  # 513.80224 MB (first_forward, newest snapshot)
        caveat=(
            "older snapshots report max_reserved 591.396864 MB with an older library "
            "stack; the allocated figure is the same in all"
        ),
    ),
    Published(
        name="bert-base-uncased MLM training, fp32, AdamW, batch 2 x 16 (ROCm)",
        source=(
            "https://huggingface.co/datasets/optimum-benchmark/rocm (cuda_training_transformers_"
            "fill-mask_google-bert/bert-base-uncased/benchmark.json; e.g. commit 1017b5a8afd2)"
        ),
        setup=(
            "AMD 64 GiB GPU, torch 2.2.2/2.3.1+rocm5.7, HF Trainer, default optimizer "
            "(torch.optim.AdamW, foreach), fp32, 5 steps, random weights, dropout on"
        ),
        model="bert-base-uncased",
        workload={"batch_size": 2, "seq_len": 16, "optimizer": "adamw"},
        gpu="a100-80gb",
        allocated=2_195_345_408,  # 2195.345408 MB, identical in 11 runs
        reserved=2_497_708_032,  # 2497.708032 MB (2403.336192 in one run)
        caveat=(
            "an AMD GPU: the caching allocator is PyTorch's (hipified), but the BLAS "
            "workspace is hipBLAS's, not the cuBLAS one memfit adds (2 x 8.1 MiB here); "
            "the Trainer also clips gradients (a few KiB)"
        ),
    ),
)


def _pct(est: int, real: int) -> float:
    return 100.0 * (est - real) / real


def run() -> list[dict[str, Any]]:
    rows = []
    for p in POINTS:
        t0 = time.perf_counter()
        est = memfit.estimate(p.model, memfit.Workload(**p.workload), gpu=p.gpu)
        prof = est.profile
        rows.append(
            {
                "name": p.name,
                "source": p.source,
                "setup": p.setup,
                "caveat": p.caveat,
                "measured_allocated_bytes": p.allocated,
                "estimated_allocated_bytes": prof.peak_allocated_bytes,
                "allocated_error_pct": round(_pct(prof.peak_allocated_bytes, p.allocated), 3),
                "measured_reserved_bytes": p.reserved,
                "estimated_reserved_bytes": prof.peak_reserved_bytes,
                "reserved_error_pct": round(_pct(prof.peak_reserved_bytes, p.reserved), 3),
                "estimate_workspaces_bytes": prof.breakdown.get("workspaces", 0),
                "seconds": round(time.perf_counter() - t0, 2),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args(argv)
    rows = run()
    print("| run | quantity | published (B) | memfit (B) | error |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        for q in ("allocated", "reserved"):
            print(
                f"| {r['name']} | max_memory_{q} | {r[f'measured_{q}_bytes']:,} | "
                f"{r[f'estimated_{q}_bytes']:,} | {r[f'{q}_error_pct']:+.2f} % |"
            )
    print()
    for r in rows:
        print(f"- {r['name']}: {r['setup']}. Source: {r['source']}.")
        if r["caveat"]:
            print(f"  Caveat: {r['caveat']}.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
