"""A dtype the named card does not run natively is said beside the verdict, never silently
(memfit.cuda.gpus.card_notes)."""

from __future__ import annotations

import pytest

import memfit
from memfit.cuda.gpus import card_notes
from memfit.cuda.target import get_gpu
from tests.conftest import tiny_llama_config


def test_bf16_on_a_card_without_native_bf16_is_said_with_the_fix():
    (note,) = card_notes(get_gpu("t4"), "bf16-true", None)
    assert "Tesla T4 (sm75) has no native bfloat16" in note
    assert "is_bf16_supported() is False" in note and "fp16-mixed" in note
    assert card_notes(get_gpu("t4"), "fp16-mixed", None) == []
    assert card_notes(get_gpu("a100-80gb"), "bf16-true", None) == []


def test_fp8_weight_only_before_sm89_says_what_runs():
    notes = card_notes(get_gpu("v100-16gb"), "fp16-true", "fp8")
    assert len(notes) == 1 and "weight-only" in notes[0] and "sm89" in notes[0]
    assert card_notes(get_gpu("h100-sxm"), "bf16-true", "fp8") == []
    assert card_notes(get_gpu("l4"), "bf16-true", "fp8") == []  # Ada, sm89


@pytest.mark.parametrize(
    ("gpu", "workload", "needle"),
    [
        ("t4", {"precision": "bf16-true"}, "no native bfloat16"),
        ("v100-16gb", {"precision": "fp16-true", "quantize": "fp8"}, "no float8 matmul"),
    ],
)
def test_the_estimate_carries_the_note(tmp_path, gpu, workload, needle):
    pytest.importorskip("torchao")
    w = memfit.Workload(batch_size=1, seq_len=16, mode="inference", **workload)
    est = memfit.estimate(tiny_llama_config(tmp_path), w, gpu=gpu)
    assert est.fits is True
    assert sum(needle in n for n in est.notes) == 1
