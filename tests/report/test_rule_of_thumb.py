"""The rule of thumb a report sets beside the trace: the training rule only where something is
trained (issue: inference and generation printed "16 B/param ..." with nothing trainable)."""

from __future__ import annotations

import memfit
from memfit.report.json import estimate_json
from memfit.report.text import render_text, rule_of_thumb_bytes
from tests.conftest import tiny_llama_config

#: The tiny llama's 90,432 bf16 parameters (2 B each) as the CUDA allocator holds them: the five
#: 64-element norms (128 B) take a 512-B block each.
WEIGHT_BYTES = 2 * 90_432 + 5 * (512 - 128)


def test_inference_uses_the_serving_rule(tmp_path):
    w = memfit.Workload(batch_size=1, seq_len=16, mode="inference", precision="bf16-true")
    est = memfit.estimate(tiny_llama_config(tmp_path), w)
    # 90,432 bf16 parameters: per layer q, o 64 x 64, k, v 64 x 32, gate, up, down 64 x 128,
    # two norms of 64; embedding and lm_head 128 x 64; the final norm 64.
    assert est.parameter_count == 2 * (2 * 4096 + 2 * 2048 + 3 * 8192 + 128) + 2 * 8192 + 64
    weights = est.profile.breakdown["parameters"]
    assert weights == WEIGHT_BYTES
    assert rule_of_thumb_bytes(est) == int(weights * 1.2)
    text = render_text(est)
    assert "rule of thumb (weights x 1.2)" in text and "16 B/param" not in text
    assert estimate_json(est)["rule_of_thumb_bytes"] == int(weights * 1.2)


def test_training_keeps_the_training_rule(tmp_path):
    w = memfit.Workload(batch_size=1, seq_len=16, optimizer="sgd")
    est = memfit.estimate(tiny_llama_config(tmp_path), w)
    expected = 16 * est.parameter_count + est.profile.max_activation_bytes + 2 * 10**9
    assert rule_of_thumb_bytes(est) == expected
    assert "rule of thumb (16 B/param + activations + 2 GB)" in render_text(est)
