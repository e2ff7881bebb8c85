"""memfit's fake run of a published training loop against the peaks published for it.

The transformers docs give training peaks for facebook/opt-350m with eager and SDPA attention
(docs/source/en/model_doc/opt.md, from PR #33298: an NVIDIA L40S, PyTorch 2.4.0, float16).
They were measured with fxmarty's `benchmark_sdpa_training` script (copies of it in
contributors' PRs): the model loaded in float16 with `attn_implementation`, random ids in
[0, vocab - 1) with no attention mask and no labels, `model.train()`, and per step
`model.zero_grad(); out = model(**inputs); loss = out.logits.sum(); loss.backward()` with no
optimizer; 10 warm-up steps, then `reset_peak_memory_stats()` and the timed steps;
`torch.cuda.max_memory_allocated() * 1e-6` (MB = 10^6 B).

The same loop runs here under `memfit.simulate(gpu, fake=True)` (fake tensors, CUDA's kernel
choices and allocator), one warm-up step, the peak reset, two steps. The loop is not memfit's
own (`memfit estimate` traces a cross-entropy loss): a trial like this one is how a user's
loop is simulated (`memfit find-batch FILE.py:trial`).

The model is the one the installed transformers builds. The published run predates
transformers 4.46: its eager OPT attention clamped the masked scores with
`torch.max(scores, finfo.min)`, which saves one more fp16 scores-sized tensor per layer than
today's code (transformers 5 has no clamp). To compare the eager rows with the code of that
run, put transformers 4.45 first on the path (it imports on torch 2.13):

    pip install --target /tmp/tf445 --no-deps transformers==4.45.2 "huggingface_hub<1.0" \\
        "tokenizers<0.21" requests urllib3 idna charset_normalizer certifi
    PYTHONPATH=/tmp/tf445:src python benchmarks/published_sdpa_training.py --attention eager

transformers 4.45 has no SDPA path for OPT (the table's SDPA column came with 4.46), so the SDPA
rows run on the installed transformers 5.

    PYTHONPATH=src python benchmarks/published_sdpa_training.py            # ~5 min on 2 cores
    PYTHONPATH=src python benchmarks/published_sdpa_training.py --quick    # 6 rows a column
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

#: (batch, seq) -> (eager MB, sdpa MB) as published (None: out of memory). The SDPA column
#: repeats values by batch x seq and has 4750.55 at both 2 x 2048 and 4 x 2048 with equal
#: times: read its larger rows with care.
OPT_350M_L40S: dict[tuple[int, int], tuple[float | None, float]] = {
    (1, 128): (1474.611, 1474.32), (1, 256): (1498.541, 1499.49),
    (1, 512): (1973.544, 1551.35), (1, 1024): (4867.113, 1698.35),
    (1, 2048): (15662.224, 2715.75), (2, 128): (1498.164, 1499.49),
    (2, 256): (1569.367, 1551.35), (2, 512): (3257.074, 1698.35),
    (2, 1024): (9054.405, 2715.75), (2, 2048): (30572.058, 4750.55),
    (4, 128): (1549.448, 1551.35), (4, 256): (2451.768, 1698.35),
    (4, 512): (5833.180, 2715.75), (4, 1024): (17427.842, 4750.55),
    (4, 2048): (None, 4750.55), (8, 128): (2049.115, 1697.78),
    (8, 256): (4222.567, 2715.75), (8, 512): (10985.391, 4750.55),
    (8, 1024): (34175.763, 8821.18), (8, 2048): (None, 8821.18),
}  # fmt: skip
QUICK = [(1, 128), (1, 512), (1, 1024), (2, 512), (4, 256), (8, 128)]


def opt_350m(attention: str) -> torch.nn.Module:
    """facebook/opt-350m's config (memfit's catalog, checked against the hub's config.json) in
    float16, built on the meta device and given empty CPU storage (a fake run never reads it)."""
    import transformers

    from memfit.models.catalog import get_model

    entry = get_model("opt-350m")
    config = transformers.OPTConfig(**dict(entry.config))
    with torch.device("meta"):
        model = transformers.OPTForCausalLM._from_config(config, attn_implementation=attention)
    model = model.to(torch.float16).to_empty(device="cpu")
    model.tie_weights()
    return model.train()


def simulated_peak(model: torch.nn.Module, batch: int, seq: int, gpu: str) -> int:
    from memfit.simulation.simulated_gpu import simulate

    with simulate(gpu, model=model, fake=True) as sim:
        ids = torch.randint(model.config.vocab_size - 1, (batch, seq))
        for step in range(3):
            if step == 1:  # reset_peak_memory_stats() after warm-up
                sim.allocator._peak_allocated = sim.allocator.allocated
            model.zero_grad()
            out = model(input_ids=ids)
            out.logits.sum().backward()
            del out
        return sim.peak_allocated_bytes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attention", default="eager,sdpa", help="eager, sdpa or both")
    ap.add_argument("--quick", action="store_true", help=f"only {len(QUICK)} rows")
    args = ap.parse_args(argv)
    import transformers

    print(f"transformers {transformers.__version__}, torch {torch.__version__}; "
          "facebook/opt-350m fp16 on a simulated l40s")  # fmt: skip
    print("| attention | batch x seq | published MB | memfit MB | error |")
    print("|---|---|---:|---:|---:|")
    for attention in args.attention.split(","):
        if attention not in ("eager", "sdpa"):
            print(f"--attention: {attention!r} is not eager or sdpa", file=sys.stderr)
            return 2
        column = 0 if attention == "eager" else 1
        model = opt_350m(attention)
        for (b, s), published in OPT_350M_L40S.items():
            want = published[column]
            if want is None or (args.quick and (b, s) not in QUICK):
                continue
            t0 = time.perf_counter()
            got = simulated_peak(model, b, s, "l40s") / 1e6
            took = time.perf_counter() - t0
            print(f"| {attention} | {b} x {s} | {want:,.1f} | {got:,.1f} | "
                  f"{(got - want) / want:+.2%} | ({took:.0f} s)", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
