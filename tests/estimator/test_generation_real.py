"""mode="generate": the estimate (transformers' generate on fake tensors) against a real
`generate` on CPU under memfit.measure, category by category, and the KV cache by hand.

What may differ, and only that (docs/generation.md): the prompt ids, made before the measured
block, are first seen by `measure` when generate slices them, and filed as temporaries; the
estimate files them as inputs. One 512-byte-rounded (B, P) int64 tensor moves between the two
categories; the totals are equal. The phases are named
"prefill"/"decode" by the estimate and "setup"/"forward" by the measurement. Both models use
eager attention, the kernel CPU and the emulated CUDA share.
"""

from __future__ import annotations

import pytest
import torch

import memfit
from memfit.cuda.allocator_config import cuda_block_size
from memfit.errors import BadInputError
from memfit.estimator.generation.figures import CALL_END_OP, prompt_len, trace_generation_once
from memfit.estimator.generation.kv_cache import kv_bytes, kv_geometry
from memfit.models.sources import resolve_model
from memfit.profile import MemoryProfile
from tests.conftest import tiny_gpt2

B, P, N = 2, 8, 6


def tiny_llama(max_positions: int = 64) -> torch.nn.Module:
    """2 layers, 4 query heads sharing 2 KV heads (grouped-query attention), head_dim 16."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="eager").eval()


def gpt2_no_eos() -> torch.nn.Module:
    # No end-of-sequence token: the real run generates exactly N tokens, as the estimate does.
    model = tiny_gpt2(n_positions=64).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    return model


MODELS = {"llama-gqa": tiny_llama, "gpt2": gpt2_no_eos}


def _workload(beams: int, cache: str) -> memfit.Workload:
    return memfit.Workload(
        mode="generate", batch_size=B, prompt_len=P, new_tokens=N, num_beams=beams,
        cache=cache, attention="eager",
    )  # fmt: skip


def _measured(model: torch.nn.Module, beams: int, cache: str) -> MemoryProfile:
    ids = torch.randint(0, model.config.vocab_size, (B, P))
    kwargs = {"max_new_tokens": N, "do_sample": False, "num_beams": beams}
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    with memfit.measure(model) as m, torch.no_grad():
        out = model.generate(ids, **kwargs)
    assert out.shape == (B, P + N)
    assert m.profile is not None
    return m.profile


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("beams", [1, 3])
@pytest.mark.parametrize("name", list(MODELS))
def test_estimate_equals_real_generate(name: str, beams: int, cache: str) -> None:
    model = MODELS[name]()
    w = _workload(beams, cache)
    traced = trace_generation_once(resolve_model(model), w, None, num_layers=None, new_tokens=N)
    est = MemoryProfile.from_events(traced.trace.records, traced.trace.events)
    real = _measured(model, beams, cache)
    assert_generation_matches(est, real, B, P)
    assert est.peak_index == real.peak_index


def assert_generation_matches(
    est: MemoryProfile, real: MemoryProfile, batch: int, prompt: int
) -> None:
    """An estimated generation equals the measured one: breakdown, peak, its op and module,
    and the timeline event for event. The prompt ids, made before the measured block, are
    temporaries to the measurement and inputs to the estimate; nothing else differs."""
    prompt_ids = cuda_block_size(batch * prompt * 8)  # int64 ids
    expected = dict(
        real.breakdown,
        inputs=real.breakdown["inputs"] + prompt_ids,
        temporaries=real.breakdown["temporaries"] - prompt_ids,
    )
    assert est.breakdown == expected
    assert est.peak_allocated_bytes == real.peak_allocated_bytes
    assert est.peak_op == real.peak_op and est.peak_module == real.peak_module
    # The timelines agree event for event (the estimate's markers at each model call's end
    # hold no bytes) from the first model call, when the measurement has seen the prompt ids.
    est_timeline = [
        b for b, ev in zip(est.timeline, est.events, strict=True) if ev.op != CALL_END_OP
    ]
    seen = next(i for i, ev in enumerate(real.events) if ev.phase == "forward")
    assert len(est_timeline) == len(real.timeline)
    assert est_timeline[seen:] == real.timeline[seen:]


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("beams", [1, 3])
def test_kv_cache_figure_is_the_hand_formula(beams: int, cache: str) -> None:
    model = tiny_llama()
    est = memfit.estimate(model, _workload(beams, cache))
    gen = est.generation
    # 2 (K and V) x 2 layers x 2 KV heads x head_dim 16 x (P + N - 1) positions x batch 2 x
    # beams x 4 bytes: the last token is never fed back, and a static cache is allocated at
    # generate's max_length - 1.
    per_layer = 2 * 2 * 16 * (P + N - 1) * B * beams * 4
    assert gen.kv_bytes_by_layer == [per_layer, per_layer]
    assert gen.kv_cache_bytes == 2 * per_layer
    assert gen.kv_bytes_per_token == 2 * 2 * 2 * 16 * B * beams * 4
    assert gen.kv_cache_bytes == sum(
        kv_bytes(kv_geometry(model.config), tokens=P + N - 1, batch=B, beams=beams, dtype_bytes=4)
    )
    assert gen.prefill_peak_bytes > 0 and gen.decode_peak_bytes > 0
    assert gen.limiting_phase in ("prefill", "decode")
    assert {ph.phase for ph in est.profile.phases} >= {"prefill", "decode"}


def test_catalog_model_kv_matches_formula_with_gqa_and_replay() -> None:
    # llama-3.1-8b: 32 layers, 8 KV heads of 128 (GQA, 32 query heads), bf16: 2 bytes.
    w = memfit.Workload(mode="generate", prompt_len=64, new_tokens=4, precision="bf16-true")
    est = memfit.estimate("llama-3.1-8b", w, gpu="rtx-4090")
    assert est.replayed and est.num_blocks == 32
    assert est.generation.kv_cache_bytes == 2 * 32 * 8 * 128 * (64 + 4 - 1) * 1 * 1 * 2
    assert est.generation.max_kv_tokens is not None


def test_json_contract_has_generation_keys() -> None:
    from memfit.report.json import estimate_json

    est = memfit.estimate(tiny_llama(), _workload(1, "dynamic"), gpu="rtx-4090")
    doc = estimate_json(est)
    g = est.generation
    assert doc["kv_cache_bytes"] == g.kv_cache_bytes
    assert doc["prefill_peak_bytes"] == g.prefill_peak_bytes
    assert doc["decode_peak_bytes"] == g.decode_peak_bytes
    assert doc["max_kv_tokens"] == g.max_kv_tokens
    assert doc["breakdown"]["kv_cache"] == est.profile.breakdown["kv_cache"]


def test_bad_inputs_name_the_value_and_the_fix() -> None:
    with pytest.raises(BadInputError, match=r"prompt_len=131070 \+ new_tokens=4 = 131074"):
        memfit.estimate(
            "llama-3.1-8b", memfit.Workload(mode="generate", prompt_len=131070, new_tokens=4)
        )
    with pytest.raises(BadInputError, match=r"tp=3 does not divide the model's 8 KV heads"):
        memfit.estimate("llama-3.1-8b", memfit.Workload(mode="generate", prompt_len=8, tp=3))
    with pytest.raises(BadInputError, match=r"cache='offloaded' with num_beams=3"):
        memfit.estimate(tiny_llama(), _workload(3, "offloaded"))


def test_default_prompt_len() -> None:
    assert prompt_len(memfit.Workload(mode="generate")) == 512
