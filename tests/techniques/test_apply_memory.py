"""Each technique applied by `apply_` lowers real memory by what the estimate predicted.

The real run is measured on CPU with memfit's tracker over real tensors (`memfit.measure`);
the estimate is the fake trace of the same workload. Both round storages to 512 B blocks as the
CUDA caching allocator does. The model is a 4-layer GPT-2 shape in fp32 with eager attention,
so the CPU and the emulated CUDA run the same kernels.
"""

from __future__ import annotations

import pytest

import memfit
from tests.conftest import (
    MEASURED_BASE,
    MEASURED_BATCH,
    MEASURED_SEQ,
    MEASURED_VOCAB,
    measured_gpt2,
    run_measured,
)

VOCAB, SEQ, BATCH = MEASURED_VOCAB, MEASURED_SEQ, MEASURED_BATCH
BASE = MEASURED_BASE


def measured_peak(w: memfit.Workload) -> int:
    m, _ = run_measured(w)
    assert m.profile is not None
    return m.profile.peak_allocated_bytes


def estimated_peak(w: memfit.Workload) -> int:
    return memfit.estimate(measured_gpt2(), w).profile.peak_allocated_bytes


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
