"""Techniques that move storages to the CPU or share them, with exact byte changes."""

from __future__ import annotations

import pytest

import memfit
from memfit.workload import Workload


def _est(name: str, **kw):
    return memfit.estimate(name, Workload(batch_size=1, seq_len=64, **kw))


def test_offload_optimizer_removes_state_from_the_device():
    base = _est("gpt2", precision="fp32", optimizer="adamw")
    off = _est("gpt2", precision="fp32", optimizer="adamw", offload_optimizer=True)
    assert base.profile.breakdown["optimizer_state"] > 0
    assert off.profile.breakdown["optimizer_state"] == 0
    # The update's foreach temporaries (fp32, one per parameter) leave the device too: the peak
    # drops by at least the 2 moments (8 B/param) of 124,439,808 parameters.
    assert base.profile.peak_allocated_bytes - off.profile.peak_allocated_bytes >= 8 * 124_439_808


def test_embedding_on_cpu_moves_table_grads_and_state():
    # pythia-70m has an untied input embedding, embed_in: 50304 x 512 fp32 = 103,022,592 B.
    base = _est("pythia-70m", precision="fp32", optimizer="adamw")
    cpu = _est("pythia-70m", precision="fp32", optimizer="adamw", embedding_on_cpu=True)
    table = 50304 * 512 * 4
    # Both peak in the warm-up optimizer step, where the table's weights, gradient and both
    # Adam moments are all alive: on the CPU they are missing from the device.
    assert base.profile.peak_phase == cpu.profile.peak_phase == "optimizer"
    b, c = base.profile.breakdown, cpu.profile.breakdown
    assert b["parameters"] - c["parameters"] == table
    assert b["gradients"] - c["gradients"] == table
    assert b["optimizer_state"] - c["optimizer_state"] == 2 * table


def test_tie_embeddings_removes_the_output_matrix():
    # pythia-70m's embed_out is a separate 50304 x 512 matrix: tying removes it.
    base = _est("pythia-70m", optimizer="sgd")
    tied = _est("pythia-70m", optimizer="sgd", tie_embeddings=True)
    assert base.parameter_count - tied.parameter_count == 50304 * 512


def test_conflicting_placements_are_rejected():
    with pytest.raises(memfit.BadInputError, match="conflict"):
        Workload(embedding_on_cpu=True, tie_embeddings=True)
    with pytest.raises(memfit.BadInputError, match="output embedding"):
        memfit.estimate("bert-base-uncased", Workload(seq_len=16, tie_embeddings=True,
                                                      optimizer="sgd"), task="base")  # fmt: skip


def test_default_lora_targets_cover_gpt2_conv1d():
    # GPT-2's projections are transformers Conv1D, not nn.Linear: LoRA must still find them.
    est = memfit.estimate(
        "gpt2", Workload(batch_size=1, seq_len=32, lora=memfit.LoraConfig(rank=8), optimizer="sgd")
    )
    # Per block, rank-8 adapters on c_attn (768 -> 2304), attn c_proj (768 -> 768), c_fc
    # (768 -> 3072) and mlp c_proj (3072 -> 768): 8 * (in + out) each.
    per_block = 8 * ((768 + 2304) + (768 + 768) + (768 + 3072) + (3072 + 768))
    assert est.trainable_parameter_count == 12 * per_block
