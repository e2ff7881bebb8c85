"""Beam search on models with an end-of-sequence token (issue 29).

transformers' `_beam_search` fills its output buffers with `pad_token_id or eos_token_id[0]`,
reading the values of the special token tensors `_prepare_special_tokens` made from the
generation config; memfit's oracle answers them with the config's ids
(generation_oracle.Oracle.token_value). With several eos ids it also keeps
`max(2, 1 + n_eos) * num_beams` candidates per step, so the eos count changes the allocations.

The real runs use eos ids the model never emits (>= vocab_size): a real `generate` then makes
exactly N tokens, as the estimate assumes (the ids' values decide no allocation).
"""

from __future__ import annotations

import pytest
import torch

import memfit
from memfit.estimator.generation.figures import trace_generation_once
from memfit.models.sources import resolve_model
from memfit.profile import MemoryProfile
from tests.conftest import tiny_gpt2
from tests.estimator.test_generation_real import assert_generation_matches, tiny_llama

P, N, K = 8, 6, 2


def llama_three_eos() -> torch.nn.Module:
    """tiny_llama (vocab 128) with three eos ids, as llama-3's configs have, and no pad id:
    generate pads with eos[0] (a view of the eos tensor)."""
    model = tiny_llama()
    eos = [128, 129, 130]
    model.config.eos_token_id = model.generation_config.eos_token_id = eos
    return model


def gpt2_pad_zero() -> torch.nn.Module:
    """tiny_gpt2 (vocab 100) with one eos id and generation pad id 0: `pad or eos[0]` reads
    both. (The model config keeps no pad id: with one, and no attention mask, the model's
    forward checks the prompt for it, `warn_if_padding_and_no_attention_mask`, which
    transformers skips on fake tensors.)"""
    model = tiny_gpt2(n_positions=64).eval()
    model.config.bos_token_id = model.generation_config.bos_token_id = None
    model.config.eos_token_id = model.generation_config.eos_token_id = 100
    model.generation_config.pad_token_id = 0
    return model


MODELS = {"llama-3-eos": llama_three_eos, "gpt2-pad-0": gpt2_pad_zero}


def _measured(model: torch.nn.Module, batch: int) -> MemoryProfile:
    # Ids from 1: no pad id (0) in the prompt, as memfit's synthetic prompt has none.
    ids = torch.randint(1, model.config.vocab_size, (batch, P))
    with memfit.measure(model) as m, torch.no_grad():
        out = model.generate(ids, max_new_tokens=N, do_sample=False, num_beams=K)
    assert out.shape == (batch, P + N)  # no early stop
    assert m.profile is not None
    return m.profile


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("name", list(MODELS))
def test_beam_search_with_eos_equals_real_generate(name: str, batch: int) -> None:
    model = MODELS[name]()
    w = memfit.Workload(
        mode="generate", batch_size=batch, prompt_len=P, new_tokens=N, num_beams=K,
        attention="eager",
    )  # fmt: skip
    traced = trace_generation_once(resolve_model(model), w, None, num_layers=None, new_tokens=N)
    assert traced.calls == N
    est = MemoryProfile.from_events(traced.trace.records, traced.trace.events)
    real = _measured(model, batch)
    assert_generation_matches(est, real, batch, P)


#: (catalog name, precision, layers, KV heads, head_dim, bytes per element), from the catalog's
#: configs: gpt2 (12 x 12 heads of 64, eos 50256, no pad), llama-3.2-1b (16 layers, 8 KV heads
#: of 64, three eos ids), mistral-7b (32 layers, 8 KV heads of 128, eos 2).
CATALOG = [
    ("gpt2", "fp32", 12, 12, 64, 4),
    ("llama-3.2-1b", "bf16-true", 16, 8, 64, 2),
    ("mistral-7b", "bf16-true", 32, 8, 128, 2),
]
CP, CN = 8, 3


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize(("name", "precision", "layers", "heads", "head_dim", "size"), CATALOG)
def test_catalog_beam_search_with_eos_kv_is_the_hand_formula(
    name: str, precision: str, layers: int, heads: int, head_dim: int, size: int, batch: int
) -> None:
    w = memfit.Workload(
        mode="generate", batch_size=batch, prompt_len=CP, new_tokens=CN, num_beams=K,
        precision=precision,
    )  # fmt: skip
    est = memfit.estimate(name, w, gpu="h100-sxm")
    gen = est.generation
    # K and V x KV heads x head_dim x (P + N - 1) cached positions (the last token is never
    # fed back) x batch x beams x bytes, per layer.
    per_layer = 2 * heads * head_dim * (CP + CN - 1) * batch * K * size
    assert gen.kv_bytes_by_layer == [per_layer] * layers
    assert gen.kv_cache_bytes == layers * per_layer
    assert est.num_blocks == layers
    assert gen.prefill_peak_bytes > 0 and gen.decode_peak_bytes > 0
