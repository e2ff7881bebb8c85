"""Each technique applied by `apply_` lowers real memory by what the estimate predicted.

The real run is measured on CPU with memfit's tracker over real tensors (`memfit.measure`);
the estimate is the fake trace of the same workload. Both round storages to 512 B blocks as the
CUDA caching allocator does. The model is a 4-layer GPT-2 shape in fp32 with eager attention,
so the CPU and the emulated CUDA run the same kernels.
"""

from __future__ import annotations

import pytest
import torch
import transformers

import memfit
from memfit.apply import apply_
from memfit.measurement import measure

VOCAB, SEQ, BATCH = 128, 64, 8


def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=4, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation="eager")


def run_measured(w: memfit.Workload):
    """Two steps of `w` applied to `gpt2()` by apply_, under memfit.measure."""
    model = gpt2()
    setup = apply_(model, w)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (w.batch_size * w.grad_accum, SEQ), generator=g)
    with measure(model, setup.optimizer) as m:
        for _ in range(2):
            setup.step({"input_ids": ids, "labels": ids.clone()})
    return m, model


def measured_peak(w: memfit.Workload) -> int:
    m, _ = run_measured(w)
    assert m.profile is not None
    return m.profile.peak_allocated_bytes


def estimated_peak(w: memfit.Workload) -> int:
    return memfit.estimate(gpt2(), w).profile.peak_allocated_bytes


BASE = memfit.Workload(batch_size=BATCH, seq_len=SEQ, attention="eager", optimizer="adamw")

VARIANTS = {
    "checkpointing": BASE.with_(checkpointing="blocks"),
    "grad-accum": BASE.with_(batch_size=BATCH // 4, grad_accum=4),
    "sgd": BASE.with_(optimizer="sgd"),
    "lora": BASE.with_(lora=memfit.LoraConfig(rank=4)),
}


@pytest.fixture(scope="module")
def baseline() -> tuple[int, int]:
    return measured_peak(BASE), estimated_peak(BASE)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_measured_drop_matches_estimated_drop(name, baseline):
    if name == "lora":
        pytest.importorskip("peft")
    w = VARIANTS[name]
    measured_drop = baseline[0] - measured_peak(w)
    estimated_drop = baseline[1] - estimated_peak(w)
    assert estimated_drop > 0
    assert abs(measured_drop - estimated_drop) <= 0.05 * estimated_drop, (
        name, measured_drop, estimated_drop,
    )  # fmt: skip
