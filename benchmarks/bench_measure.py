"""Estimate against measurement on this machine's CPU, technique by technique.

For a 4-layer GPT-2 shape (fp32, eager attention: the CPU runs the kernels CUDA would), each
workload is (1) estimated by memfit on fake tensors and (2) applied with `memfit.apply_` to a
real model and measured with `memfit.measure` (memfit's tracker over real tensors, 512-byte
blocks as the CUDA allocator rounds). Printed: both peaks, the relative error, and for each
technique the drop from the baseline, measured and estimated. The estimate's cuBLAS workspace
(an allocation CUDA makes and a CPU does not) is left out of its peak.

    python benchmarks/bench_measure.py
"""

from __future__ import annotations

import time

import torch
import transformers

import memfit

VOCAB, SEQ, BATCH = 128, 64, 8


def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=4, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation="eager")


def measured(w: memfit.Workload) -> tuple[int, float]:
    model = gpt2()
    setup = memfit.apply_(model, w)
    ids = torch.randint(0, VOCAB, (w.batch_size * w.grad_accum, SEQ))
    t0 = time.perf_counter()
    with memfit.measure(model, setup.optimizer) as m:
        for _ in range(2):
            setup.step({"input_ids": ids, "labels": ids.clone()})
    assert m.profile is not None
    return m.profile.peak_allocated_bytes, time.perf_counter() - t0


def estimated(w: memfit.Workload) -> tuple[int, float]:
    t0 = time.perf_counter()
    p = memfit.estimate(gpt2(), w).profile
    return p.peak_allocated_bytes - p.breakdown["workspaces"], time.perf_counter() - t0


def main() -> None:
    base = memfit.Workload(batch_size=BATCH, seq_len=SEQ, attention="eager", optimizer="adamw")
    cases = {
        "baseline (adamw)": base,
        "checkpointing": base.with_(checkpointing="blocks"),
        "checkpointing first 2": base.with_(checkpointing="blocks", checkpoint_first=2),
        "grad-accum x4": base.with_(batch_size=BATCH // 4, grad_accum=4),
        "sgd": base.with_(optimizer="sgd"),
        "adafactor": base.with_(optimizer="adafactor"),
        "lora r4": base.with_(lora=memfit.LoraConfig(rank=4)),
        "tied embeddings (already)": base.with_(tie_embeddings=True),
    }
    rows = []
    for name, w in cases.items():
        m, tm = measured(w)
        e, te = estimated(w)
        rows.append((name, m, e, tm, te))
    b_m, b_e = rows[0][1], rows[0][2]
    print(f"{'workload':<28}{'measured B':>14}{'estimated B':>14}{'error':>9}"
          f"{'drop meas.':>13}{'drop est.':>13}")  # fmt: skip
    for name, m, e, _tm, _te in rows:
        err = (e - m) / m
        drop = "" if m == b_m else f"{b_m - m:>13,}{b_e - e:>13,}"
        print(f"{name:<28}{m:>14,}{e:>14,}{100 * err:>8.2f}%{drop}")
    worst = max(abs(r[2] - r[1]) / r[1] for r in rows)
    print(f"\nworst |estimate - measured| / measured: {100 * worst:.2f} %")


if __name__ == "__main__":
    main()
