"""cache="offloaded": transformers' DynamicCache(offloading=True), its copies to the host and back
emulated on fake tensors (memfit.estimator.generation.kv_cache_offload).

By hand, on a 3-layer GQA llama (2 KV heads of 16, fp32, batch 2): one layer's keys or values
hold 2 x 2 x 16 x 4 = 256 bytes per position. At the end of model call s (8 + s positions) the
device holds layer 0 only (prefetched by the last layer for the next step) and the host the two
others; the whole cache is the plain formula, wherever it lives.
"""

from __future__ import annotations

import pytest
import torch

import memfit
from memfit.errors import BadInputError
from memfit.estimator.generation.decode_extension import EXTEND_ABOVE, extend_decode
from memfit.estimator.generation.figures import CALL_END_OP, trace_generation, trace_generation_once
from memfit.estimator.generation.kv_cache_offload import OP_TO_DEVICE, OP_TO_HOST
from memfit.estimator.host_memory import power_of_two_ceil
from memfit.events import ALLOC
from memfit.models.sources import resolve_model
from tests.estimator.test_decode_extension import _same

B, P, N = 2, 8, 6
#: Bytes of one layer's keys (or values) per cached position.
PER_POSITION = 2 * 16 * B * 4


def tiny_llama(layers: int = 3) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="eager").eval()


def _workload(n: int = N, **kw) -> memfit.Workload:
    return memfit.Workload(
        mode="generate", batch_size=B, prompt_len=P, new_tokens=n, cache="offloaded",
        attention="eager", **kw,
    )  # fmt: skip


def test_kv_figure_and_host_share_by_hand() -> None:
    est = memfit.estimate(tiny_llama(), _workload())
    gen = est.generation
    layer = 2 * PER_POSITION * (P + N - 1)  # keys and values of 13 positions: 6,656 B
    assert layer == 6656
    assert gen.kv_bytes_by_layer == [layer, layer, layer]
    assert gen.kv_cache_bytes == 3 * layer  # 2 x 3 x 2 x 16 x 13 x 2 x 4, the plain formula
    assert gen.kv_host_bytes == 2 * layer  # layers 1 and 2; layer 0 is on the device
    # Pinned host memory (`.to("cpu", non_blocking=True)`), power-of-two blocks cached by the
    # host allocator: the prefill's copies of 8 positions (2,048 B blocks: keys and values of
    # layers 0 and 1, alive together before the last layer prefetches layer 0), then four
    # 4,096 B blocks for the decode steps' copies (2,304..3,328 B), reused step after step.
    assert power_of_two_ceil(PER_POSITION * P) == 2048
    assert est.host.pinned_bytes == 4 * 2048 + 4 * 4096
    assert est.host.by_category == {"kv_cache": 4 * 4096}


def test_device_holds_the_current_and_the_prefetched_layer() -> None:
    tr = trace_generation_once(resolve_model(tiny_llama()), _workload(), None, num_layers=None,
                               new_tokens=N).trace  # fmt: skip
    device = host = 0
    at_call_end = []
    for ev in tr.events:
        r = tr.records[ev.sid]
        if ev.op == CALL_END_OP:
            at_call_end.append((device, host))
        if r.category != "kv_cache":
            continue
        sign = 1 if ev.kind == ALLOC else -1
        if r.host:
            assert r.op == OP_TO_HOST and r.phase == "forward"  # pinned: made in a forward
            host += sign * r.nbytes
        else:
            assert r.op == OP_TO_DEVICE
            device += sign * r.nbytes
    # After call s the cache holds 8 + s positions: layer 0 on the device, 1 and 2 on the host.
    assert at_call_end == [
        (2 * PER_POSITION * (P + s), 4 * PER_POSITION * (P + s)) for s in range(N)
    ]


def test_offloading_lowers_the_device_peak() -> None:
    off = memfit.estimate(tiny_llama(), _workload())
    dyn = memfit.estimate(tiny_llama(), _workload().with_(cache="dynamic"))
    assert off.generation.kv_cache_bytes == dyn.generation.kv_cache_bytes
    assert off.profile.peak_allocated_bytes < dyn.profile.peak_allocated_bytes
    assert dyn.generation.kv_host_bytes == 0


def test_decode_steps_extend_exactly() -> None:
    spec, w = resolve_model(tiny_llama()), _workload(EXTEND_ABOVE + 11)

    def traced(n: int):
        return trace_generation_once(spec, w, None, num_layers=None, new_tokens=n).trace

    ext = extend_decode(traced, EXTEND_ABOVE + 11)
    assert ext.extended
    _same(ext.trace, traced(EXTEND_ABOVE + 11))


def test_six_layer_model_is_traced_whole() -> None:
    # In the prefill only the last block prefetches (layer 0, for the next step: the others'
    # next layers are not filled yet), so the traced blocks differ and the block replay does
    # not apply (memfit.estimator.trace.block_replay refuses it); the whole model is traced.
    spec, w = resolve_model(tiny_llama(6)), _workload()
    _, blocks, replayed = trace_generation(spec, w, None)
    assert not replayed and blocks == 6
    est = memfit.estimate(tiny_llama(6), w)
    layer = 2 * PER_POSITION * (P + N - 1)
    assert est.generation.kv_bytes_by_layer == [layer] * 6
    assert est.generation.kv_host_bytes == 5 * layer


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_beams": 3}, r"num_beams=3 is not modelled.*Use num_beams=1"),
        ({"tp": 2, "precision": "bf16-true"}, r"tp=2 is not modelled.*Use tp=1"),
    ],
)
def test_what_is_not_modelled_is_refused(change: dict, message: str) -> None:
    with pytest.raises(BadInputError, match=message):
        memfit.estimate("llama-3.1-8b", _workload().with_(**change))
