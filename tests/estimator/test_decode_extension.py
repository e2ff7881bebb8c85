"""Decode steps extended from a few traced model calls
(memfit.estimator.generation.decode_extension):
the rebuilt stream equals the trace of every call, event for event, on tiny models (greedy and
beam search, dynamic and static caches, with and without the block replay), and a stream that
does not extend falls back to tracing every call, saying why."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import memfit
from memfit._compat import generate_keeps_all_ones_mask
from memfit.estimator.generation import decode_extension as de
from memfit.estimator.generation.decode_extension import (
    EXTEND_ABOVE,
    TRACED_CALLS,
    VERIFY_EXTRA,
    extend_decode,
)
from memfit.estimator.generation.figures import (
    filled_tracer,
    trace_generation,
    trace_generation_once,
)
from memfit.models.sources import resolve_model
from memfit.profile import MemoryProfile
from tests.estimator.test_generation_real import gpt2_no_eos, tiny_llama

#: More calls than EXTEND_ABOVE, within the tiny models' 64 positions (P + N).
B, P, N = 2, 8, EXTEND_ABOVE + 11


def _workload(beams: int, cache: str) -> memfit.Workload:
    return memfit.Workload(
        mode="generate", batch_size=B, prompt_len=P, new_tokens=N, num_beams=beams,
        cache=cache, attention="eager",
    )  # fmt: skip


def _same(a, b) -> None:
    """Two traces of the same generation are one stream: event for event in storage-free form
    (de._cut), the same profile, the same FLOPs."""
    assert de._cut(a).canon == de._cut(b).canon
    pa = MemoryProfile.from_events(a.records, a.events)
    pb = MemoryProfile.from_events(b.records, b.events)
    assert pa.timeline == pb.timeline and pa.breakdown == pb.breakdown
    assert pa.by_module == pb.by_module
    assert a.flops == {k: f for k, f in b.flops.items() if f}


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("beams", [1, 3])
@pytest.mark.parametrize("make", [tiny_llama, gpt2_no_eos])
def test_extension_equals_every_call_traced(make, beams: int, cache: str) -> None:
    spec, w = resolve_model(make()), _workload(beams, cache)
    calls: list[int] = []

    def traced(n: int):
        calls.append(n)
        return trace_generation_once(spec, w, None, num_layers=None, new_tokens=n).trace

    filled: list[int] = []

    def traced_filled(n: int, wl: memfit.Workload):
        filled.append(n)
        return trace_generation_once(spec, wl, None, num_layers=None, new_tokens=n).trace

    # A static cache's last call fills it; on transformers < 5.18 that call makes no padded
    # copy of generate's mask (decode_extension Note): it is taken from two filled traces.
    ext = extend_decode(traced, N, trace_filled=filled_tracer(w, traced_filled))
    assert ext.extended and ext.why_not is None
    assert calls == [TRACED_CALLS, TRACED_CALLS + 1, TRACED_CALLS + VERIFY_EXTRA]
    with_filled = cache == "static" and generate_keeps_all_ones_mask()
    assert filled == ([TRACED_CALLS, TRACED_CALLS + 1] if with_filled else [])
    _same(ext.trace, traced(N))


def test_short_generation_is_traced_whole() -> None:
    spec, w = resolve_model(tiny_llama()), _workload(1, "dynamic").with_(new_tokens=EXTEND_ABOVE)
    calls: list[int] = []

    def traced(n: int):
        calls.append(n)
        return trace_generation_once(spec, w, None, num_layers=None, new_tokens=n).trace

    ext = extend_decode(traced, EXTEND_ABOVE)
    assert not ext.extended and ext.why_not is None and calls == [EXTEND_ABOVE]


def test_a_stream_that_does_not_extend_is_traced_whole() -> None:
    spec, w = resolve_model(tiny_llama()), _workload(1, "dynamic")
    calls: list[int] = []

    def traced(n: int):
        calls.append(n)
        tr = trace_generation_once(spec, w, None, num_layers=None, new_tokens=n).trace
        if n == TRACED_CALLS + VERIFY_EXTRA:  # a verification trace the template cannot predict
            first = tr.events[0]
            tr = replace(tr, events=[first._replace(module="elsewhere"), *tr.events[1:]])
        return tr

    ext = extend_decode(traced, N)
    assert not ext.extended and calls[-1] == N
    verify = TRACED_CALLS + VERIFY_EXTRA
    assert ext.why_not == f"the stream predicted for {verify} calls is not its trace"


def _six_layer_llama(tmp_path: Path) -> str:
    # As tiny_llama, with 6 layers: enough for the block replay (3 traced of N > 4).
    cfg = dict(
        model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=128, hidden_size=64,
        intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=None,
        eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_extension_with_block_replay_equals_the_whole_trace(tmp_path: Path) -> None:
    spec = resolve_model(_six_layer_llama(tmp_path))
    w = _workload(1, "dynamic")
    tr, blocks, replayed = trace_generation(spec, w, None)
    assert replayed and blocks == 6
    full = trace_generation_once(spec, w, None, num_layers=None, new_tokens=N).trace
    from memfit.estimator.generation.figures import name_phases

    name_phases(full)
    pa = MemoryProfile.from_events(tr.records, tr.events)
    pb = MemoryProfile.from_events(full.records, full.events)
    assert pa.timeline == pb.timeline and pa.breakdown == pb.breakdown
    assert [ph.peak_bytes for ph in pa.phases] == [ph.peak_bytes for ph in pb.phases]


def test_estimate_says_the_decode_steps_were_extended() -> None:
    est = memfit.estimate(tiny_llama(), _workload(1, "dynamic"))
    assert est.generation.decode_extended
    short = memfit.estimate(tiny_llama(), _workload(1, "dynamic").with_(new_tokens=6))
    assert not short.generation.decode_extended
