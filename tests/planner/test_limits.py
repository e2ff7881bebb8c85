"""`max_seq` and `max_batch` of a generation (mode="generate"): the answer fits and one more
does not, by the estimator itself; `max_seq` searches the prompt and reports the context."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import memfit
from memfit.errors import BadInputError
from memfit.planner.limits import (
    SEQ_EXACT_BELOW,
    SEQ_RESOLUTION_DIVISOR,
    _longest,
    max_batch,
    max_seq,
)
from memfit.planner.plan_text import limit_to_json, render_limit
from tests.conftest import tiny_llama_config

#: A small GPU (5.78 GiB), so that a tiny model's KV cache reaches it.
GPU = "rtx-2060"


@pytest.fixture(scope="module")
def wide_llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    """2 layers of hidden 4096 (32 KV heads of 128): 64 KiB of fp32 KV cache per position, so
    a prompt of some ten thousand tokens fills the GPU."""
    cfg = dict(
        model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=128,
        hidden_size=4096, intermediate_size=256, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=131072, bos_token_id=None,
        eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    path: Path = tmp_path_factory.mktemp("wide") / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _fits(model: str, w: memfit.Workload) -> bool:
    return bool(memfit.estimate(model, w, gpu=GPU).fits)


def test_max_seq_of_a_generation_is_the_longest_prompt(wide_llama: str) -> None:
    w = memfit.Workload(mode="generate", new_tokens=4)
    limit = max_seq(wide_llama, w, gpu=GPU)
    assert limit.what == "prompt_len" and limit.new_tokens == 4 and not limit.capped
    assert limit.largest is not None and 1024 < limit.largest < 131072 - 4
    # Answered to within 1/128 of the answer: it fits, and `resolution` tokens more do not.
    assert 1 <= limit.resolution <= limit.largest // SEQ_RESOLUTION_DIVISOR
    assert _fits(wide_llama, w.with_(prompt_len=limit.largest))
    assert not _fits(wide_llama, w.with_(prompt_len=limit.largest + limit.resolution))
    assert len(limit.curve) <= 12  # the crossing predicted, not halved down to single tokens
    doc = limit_to_json(limit)
    assert doc["largest_context"] == limit.largest + 4 and doc["new_tokens"] == 4
    head = render_limit(limit).splitlines()[0]
    assert head == (
        f"largest prompt of {limit.model} that fits NVIDIA GeForce RTX 2060 in fp32: "
        f"{limit.largest} (to within {limit.resolution} tokens: "
        f"{limit.largest + limit.resolution} does not fit) tokens, with 4 new tokens: a context "
        f"of {limit.largest + 4} tokens (prompt + new tokens)"
    )


def test_max_batch_of_a_generation(wide_llama: str) -> None:
    w = memfit.Workload(mode="generate", prompt_len=2048, new_tokens=4)
    limit = max_batch(wide_llama, w, gpu=GPU)
    assert limit.what == "batch_size" and limit.largest is not None and limit.largest > 1
    assert _fits(wide_llama, w.with_(batch_size=limit.largest))
    assert not _fits(wide_llama, w.with_(batch_size=limit.largest + 1))


def test_max_seq_of_a_generation_refuses_a_prompt_and_no_room(wide_llama: str) -> None:
    with pytest.raises(BadInputError, match=r"searches prompt_len itself .* prompt_len=512"):
        max_seq(wide_llama, memfit.Workload(mode="generate", prompt_len=512), gpu=GPU)
    no_room = r"new_tokens=131072 leaves no room .*Use new_tokens=131071"
    with pytest.raises(BadInputError, match=no_room):
        max_seq(wide_llama, memfit.Workload(mode="generate", new_tokens=131072), gpu=GPU)


@pytest.mark.parametrize(
    ("curve", "limit"),
    [
        (lambda v: 1_000_000 + 30_000 * v, 1_000_000_000),  # flash + KV cache: a line
        (lambda v: 5_000_000 + 4_000 * v + 3 * v * v, 2_000_000_000),  # an eager score matrix
        (lambda v: 1_000 * v, 100_000),  # crossing below SEQ_EXACT_BELOW: exact to the token
        (lambda v: 10 * v, 10**9),  # everything fits
    ],
)
def test_longest_brackets_the_crossing_in_few_traces(curve, limit) -> None:
    tried: list[int] = []

    def fits(v: int) -> bool:
        tried.append(v)
        return curve(v) <= limit

    good, resolution = _longest(fits, curve, limit, 131072)
    best = max(v for v in range(1, 131073) if curve(v) <= limit)
    if best == 131072:
        assert (good, resolution) == (131072, 1)
        return
    assert fits(good) and not fits(good + resolution)
    assert good <= best < good + resolution
    expected = max(1, good // SEQ_RESOLUTION_DIVISOR) if good >= SEQ_EXACT_BELOW else 1
    assert resolution <= expected
    assert len(set(tried)) <= 9, sorted(set(tried))


def test_a_curve_that_is_not_monotone_is_explained() -> None:
    # Issue 29: seq 512 took 12.55 GiB and seq 1024 12.53 GiB with no word of why.
    from memfit.cuda.target import get_gpu
    from memfit.planner.limits import Limit

    def limit(curve: list[tuple[int, int, bool]]) -> Limit:
        return Limit(model="m", gpu=get_gpu("t4"), what="seq_len", largest=1024, curve=curve)

    text = render_limit(limit([(512, 13_476, True), (1024, 13_400, True)]))
    assert "note: the device total is not monotone here: it counts the caching allocator's" in (
        text
    )
    assert "note:" not in render_limit(limit([(512, 13_400, True), (1024, 13_476, True)]))


def test_when_nothing_fits_it_says_what_holds_the_memory(tmp_path: Path) -> None:
    # Issue 29: when nothing fit, max-seq did not say that the optimizer step dominates (and a
    # peak in the optimizer step, equal at every length, was refused as a flat curve).
    path = tiny_llama_config(
        tmp_path, vocab_size=128000, hidden_size=4096, intermediate_size=256,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096,
    )  # fmt: skip
    limit = max_seq(str(path), memfit.Workload(precision="bf16-mixed"), gpu=GPU)
    assert limit.largest is None and limit.smallest_peak is not None
    value, peak = limit.smallest_peak
    assert value == 1 and peak.startswith("the optimizer step (optimizer_state ")
    assert (
        render_limit(limit)
        .splitlines()[0]
        .endswith(
            "what does not depend on the sequence length does not fit (memfit plan searches the "
            "techniques that shrink it)"
        )
    )
