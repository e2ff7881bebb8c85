"""FLOPs counted by the tracer (PyTorch's own formulas), exact by hand, and under replay."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import memfit
from memfit.estimator.estimation import steady_flops, trace_spec
from memfit.estimator.trace.step_runner import run_trace
from memfit.models.sources import ModelSpec


def test_mlp_flops_by_hand():
    # Linear(64 -> 32, no bias) then Linear(32 -> 16, no bias), batch 8, loss = sum.
    # Forward: 2*8*64*32 + 2*8*32*16 = 32768 + 8192 = 40960.
    # Backward: grad of the weights of both layers (same as forward: 40960) plus the grad of
    # the second layer's input (8192); the first layer's input needs no grad.
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 32, bias=False), torch.nn.ReLU(), torch.nn.Linear(32, 16, bias=False)
    )
    spec = memfit.models.sources.resolve_model(model)
    spec.make_batch = lambda b: torch.randn(b, 64)
    spec.input_kind = "custom"
    w = memfit.Workload(batch_size=8, optimizer="sgd")
    tr = run_trace(spec, w, (8, 0))
    flops = steady_flops(tr.flops)
    assert flops["forward"] == 40960
    assert flops["backward"] == 40960 + 8192


def _spec(n: int) -> ModelSpec:
    def build(k, attention="sdpa"):
        cfg = LlamaConfig(
            hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=4, vocab_size=1000, num_hidden_layers=k or n,
        )  # fmt: skip
        return LlamaForCausalLM(cfg)

    return ModelSpec(
        name="tiny", build=build, owns_model=True, input_kind="tokens", task="causal-lm",
        max_positions=128, num_layers=n, can_shorten=True,
    )  # fmt: skip


def test_replayed_flops_equal_full_trace():
    spec = _spec(6)
    w = memfit.Workload(batch_size=2, seq_len=16, precision="bf16-mixed", checkpointing="blocks")
    replayed, _, was_replayed = trace_spec(spec, w, (8, 0))
    assert was_replayed
    full = run_trace(spec, w, (8, 0))
    assert steady_flops(replayed.flops) == steady_flops(full.flops)
    assert steady_flops(full.flops)["recompute"] > 0
