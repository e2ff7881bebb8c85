"""`serving_capacity`: vLLM's KV cache arithmetic over memfit's profiling run, by hand on a tiny
llama (2 layers, 2 KV heads of 16, bf16), and its refusals."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import memfit
from memfit.cuda.target import get_gpu
from memfit.errors import BadInputError
from memfit.planner.plan_text import render_serving, serving_to_json
from memfit.planner.serving import scheduler_defaults, serving_capacity
from tests.conftest import tiny_llama_config

GPU = "rtx-2060"


def _config(tmp: Path, **over: object) -> str:
    return tiny_llama_config(tmp, **over)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _config(tmp_path_factory.mktemp("tiny"))


def test_blocks_tokens_and_concurrency_by_hand(tiny: str) -> None:
    cap = serving_capacity(tiny, GPU, context_len=50)
    # rtx-2060 is under 70 GiB: vllm serve's 2048 batched tokens and 256 sequences, so the
    # profiling run is 256 requests of 8 tokens.
    assert (cap.max_num_batched_tokens, cap.max_num_seqs) == (2048, 256)
    assert (cap.profile_batch, cap.profile_prompt_len) == (256, 8)
    total = get_gpu(GPU).total_memory_bytes
    assert cap.requested_bytes == math.ceil(total * 0.9)
    # Weights in bf16, each tensor rounded up to 512 B: embedding 128x64 (16,384), per layer
    # q 8,192 + k 4,096 + v 4,096 + o 8,192 + gate/up/down 3 x 16,384 + 2 norms x 512
    # (74,752), the final norm 512, lm_head 16,384, two rotary buffers of 8 (512 each).
    assert cap.weights_bytes == 16_384 + 2 * 74_752 + 512 + 16_384 + 2 * 512
    # One position of one layer: 2 (K, V) x 2 KV heads x 16 x 2 bytes = 128 B; a block of 16
    # positions 2,048 B per layer (vLLM's page_size_bytes), 4,096 B over the 2 layers.
    assert cap.kv_bytes_per_token == 256 and cap.block_bytes == 4096 and cap.num_layers == 2
    assert cap.available_kv_bytes == cap.requested_bytes - cap.profile_peak_bytes
    assert cap.num_blocks == cap.available_kv_bytes // 2048 // 2
    assert cap.kv_tokens == cap.num_blocks * 16
    # 50 tokens take ceil(50 / 16) = 4 blocks.
    assert cap.blocks_per_sequence == 4
    assert cap.concurrent_sequences == cap.num_blocks // 4
    assert cap.max_concurrency == cap.num_blocks / 4
    assert cap.max_model_len == 64  # the model's positions, far below the KV tokens


def test_profile_peak_is_the_profiling_run_without_its_kv_cache(tiny: str) -> None:
    cap = serving_capacity(tiny, GPU)
    w = memfit.Workload(
        mode="generate", batch_size=256, prompt_len=8, new_tokens=1, precision="bf16-true"
    )
    est = memfit.estimate(tiny, w, gpu=GPU)
    # 256 x 8 positions of 128 B in each of 2 layers.
    assert est.generation.kv_cache_bytes == 256 * 8 * 128 * 2
    peak = est.profile.peak_allocated_bytes
    assert peak - est.generation.kv_cache_bytes <= cap.profile_peak_bytes < peak
    assert cap.profile_peak_bytes > cap.weights_bytes
    assert cap.context_len == 64  # the model's positions by default


def test_a_context_longer_than_the_kv_cache_does_not_fit(tmp_path: Path) -> None:
    # hidden 4096, 32 KV heads of 128: 16 KiB per position and layer in bf16.
    wide = _config(
        tmp_path, hidden_size=4096, intermediate_size=256, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=131072,
    )  # fmt: skip
    cap = serving_capacity(wide, GPU, gpu_memory_utilization=0.2)
    assert cap.block_bytes == 16 * 16_384 * 2
    assert cap.num_blocks == cap.available_kv_bytes // (16 * 16_384) // 2 > 0
    assert cap.context_len == 131072 and cap.concurrent_sequences == 0
    assert cap.max_model_len == cap.kv_tokens < 131072
    text = render_serving(cap)
    assert f"DOES NOT FIT: one sequence of 131072 tokens needs {131072 // 16:,} blocks" in text
    assert f"Use --context-len {cap.max_model_len} or less" in text


def test_json_has_every_figure(tiny: str) -> None:
    cap = serving_capacity(tiny, GPU, block_size=32, context_len=64)
    doc = serving_to_json(cap)
    assert doc["gpu"] == "rtx-2060" and doc["block_size"] == 32
    assert doc["num_blocks"] == cap.num_blocks == cap.available_kv_bytes // (32 * 128) // 2
    assert doc["kv_tokens"] == cap.num_blocks * 32
    assert doc["concurrent_sequences"] == cap.num_blocks // 2


def test_scheduler_defaults_follow_vllm_serve() -> None:
    assert scheduler_defaults(get_gpu("h100")) == (8192, 1024)
    assert scheduler_defaults(get_gpu("a100-80gb")) == (2048, 256)  # A100s keep the small ones
    assert scheduler_defaults(get_gpu("l4")) == (2048, 256)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"gpu_memory_utilization": 0.0}, r"gpu_memory_utilization=0.0 is not a fraction"),
        ({"gpu_memory_utilization": 1.5}, r"gpu_memory_utilization=1.5 is not a fraction"),
        ({"gpu_memory_utilization": 1.0}, r"the CUDA context holds .* Use gpu_memory_util"),
        ({"block_size": 10}, r"block_size=10 is not one vLLM accepts. Use one of \[1, 8, 16"),
        ({"max_num_batched_tokens": 3000}, r"max_num_batched_tokens=3000 over 256 requests"),
        ({"context_len": 65}, r"context_len=65 is longer than .* \(64 positions"),
        ({"max_num_seqs": 0}, r"max_num_seqs=0 must be at least 1"),
    ],
)
def test_bad_input_names_the_value_and_the_fix(tiny: str, kwargs: dict, needle: str) -> None:
    with pytest.raises(BadInputError, match=needle):
        serving_capacity(tiny, GPU, **kwargs)


def test_sliding_window_models_are_refused(tmp_path: Path) -> None:
    mixed = _config(
        tmp_path, model_type="qwen2", architectures=["Qwen2ForCausalLM"], sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    with pytest.raises(BadInputError, match=r"full_attention, sliding_attention.*separate KV"):
        serving_capacity(mixed, GPU)


def test_a_model_with_a_pad_token(tmp_path: Path) -> None:
    # generate checks a batch of prompts for right padding (`sum(ids[:, -1] == pad) > 0`);
    # the trace answers for memfit's prompt, which has none.
    cap = serving_capacity(_config(tmp_path, pad_token_id=0), GPU)
    assert cap.profile_batch == 256 and cap.num_blocks > 0
