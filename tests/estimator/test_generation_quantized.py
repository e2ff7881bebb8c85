"""cache="quantized": transformers' QuantizedCache (quanto backend, its defaults: 4 bits, groups
of 64, a full-precision residual of up to 128 positions) with quanto's layout emulated
(memfit.estimator.generation.kv_cache_quantized).

The KV figure by hand (packed bytes + scale and shift bytes + residual bytes); the emulated
layout against optimum-quanto's own tensors, byte for byte; the whole trace against a real
`generate` measured on CPU by memfit.measure, event for event, with the one difference the
docs list (quanto's `unpack`: one output on CUDA, masked and shifted copies on CPU). The
comparisons with quanto skip when optimum-quanto is not installed (pyproject's dev extra
installs it).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import memfit
from memfit.errors import BadInputError
from memfit.estimator.generation import kv_cache_quantized as kq
from memfit.estimator.generation.figures import CALL_END_OP, trace_generation, trace_generation_once
from memfit.models.sources import resolve_model
from memfit.profile import MemoryProfile
from tests.estimator.test_generation_real import tiny_llama as real_llama

# find_spec of a submodule imports its parent: ask for "optimum" first.
HAS_QUANTO = (
    importlib.util.find_spec("optimum") is not None
    and importlib.util.find_spec("optimum.quanto") is not None
)
needs_quanto = pytest.mark.skipif(not HAS_QUANTO, reason="optimum-quanto is not installed")

B, P = 2, 8


def tiny_llama() -> torch.nn.Module:
    """test_generation_real's GQA llama (2 layers, 2 KV heads of 16, fp32) with 256 positions,
    for generations long enough to flush the residual."""
    return real_llama(max_positions=256)


def _workload(n: int, beams: int = 1, **kw) -> memfit.Workload:
    return memfit.Workload(
        mode="generate", batch_size=B, prompt_len=P, new_tokens=n, num_beams=beams,
        cache="quantized", attention="eager", **kw,
    )  # fmt: skip


def _kv_tensor_bytes(quantized: int, residual: int, beams: int = 1) -> int:
    """One layer's keys (or values) of the tiny llama (2 KV heads, head_dim 16, fp32)."""
    rows = B * beams
    numel = rows * 2 * quantized * 16
    groups = numel // 64
    packed = (groups + 1) // 2 * 64  # two 4-bit values a byte, rows of 64 bytes
    return packed + 2 * groups * 4 + rows * 2 * residual * 16 * 4  # + scale, shift + residual


def test_kv_figure_by_hand_without_a_flush() -> None:
    # 6 new tokens: the prompt quantized (8 positions), 5 decode steps in the residual.
    est = memfit.estimate(tiny_llama(), _workload(6))
    # Keys: 2 x 2 x 8 x 16 = 512 values, 8 groups: 4 x 64 = 256 packed bytes, 8 x 4 = 32
    # bytes of scale and of shift; residual 2 x 2 x 5 x 16 x 4 = 1,280 bytes. Values the same.
    assert _kv_tensor_bytes(8, 5) == 256 + 32 + 32 + 1280
    assert est.generation.kv_bytes_by_layer == [2 * 1600, 2 * 1600]
    assert est.generation.kv_cache_bytes == 6400
    assert est.generation.kv_host_bytes == 0
    assert est.generation.decode_extended is False  # 6 calls: traced whole


def test_kv_figure_by_hand_after_a_flush() -> None:
    # 131 new tokens, 130 decode steps: at the 128th the residual (127 positions) and the new
    # token are quantized with the rest (8 + 128 = 136 positions); 2 positions are left after.
    assert kq.quantized_split(P + 131 - 1, P) == (136, 2)
    w = _workload(131)
    tr, _, _ = trace_generation(resolve_model(tiny_llama()), w, None)
    assert "re-quantizes every 128 decode steps" in " ".join(tr.notes)
    est = memfit.estimate(tiny_llama(), w)
    per = _kv_tensor_bytes(136, 2)
    # Keys: 2 x 2 x 136 x 16 = 8,704 values, 136 groups: 68 x 64 = 4,352 packed bytes, 544 of
    # scale and of shift; residual 2 x 2 x 2 x 16 x 4 = 512 bytes.
    assert per == 4352 + 544 + 544 + 512
    assert est.generation.kv_bytes_by_layer == [2 * per, 2 * per]
    assert est.generation.decode_extended is False


def test_decode_steps_extend_before_the_first_flush() -> None:
    # 30 new tokens (29 decode steps, no flush): extended from 5 traced calls, as exact as
    # tracing every call.
    spec, w = resolve_model(tiny_llama()), _workload(30)
    tr, _, _ = trace_generation(spec, w, None)
    whole = trace_generation_once(spec, w, None, num_layers=None, new_tokens=30).trace
    a = MemoryProfile.from_events(tr.records, tr.events)
    b = MemoryProfile.from_events(whole.records, whole.events)
    assert tr._memfit_decode_extended is True  # type: ignore[attr-defined]
    assert a.timeline == b.timeline and a.breakdown == b.breakdown


def test_a_quantized_cache_is_smaller_than_a_dynamic_one() -> None:
    q = memfit.estimate(tiny_llama(), _workload(6)).generation
    d = memfit.estimate(tiny_llama(), _workload(6).with_(cache="dynamic")).generation
    assert d.kv_cache_bytes == 2 * 2 * 2 * 16 * (P + 5) * B * 4  # the plain formula
    assert q.kv_cache_bytes < d.kv_cache_bytes


@pytest.mark.parametrize("nbits", [2, 4])
@pytest.mark.parametrize("shape", [(1, 2, 200, 16), (2, 8, 37, 128), (3, 4, 8, 64)])
def test_layout_packed_scale_shift_by_hand(shape: tuple[int, ...], nbits: int) -> None:
    t = torch.randn(shape, dtype=torch.bfloat16)
    q = kq.quantize(t, 0, nbits, 64)
    numel = t.numel()
    packed, scale = kq.quantized_bytes(numel, dtype_bytes=2, nbits=nbits)
    per_byte = 8 // nbits
    assert packed == -(-(numel // 64) // per_byte) * 64
    assert q.data.nbytes == packed and q.data.dtype == torch.uint8
    assert q.scale.nbytes == q.shift.nbytes == scale == numel // 64 * 2
    out = kq.dequantize(q)
    assert out.shape == t.shape and out.dtype == t.dtype


#: (shape, axis): transformers' default axis 0, and -1 where the other axes hold whole groups.
LAYOUTS = [((1, 2, 200, 16), 0), ((2, 8, 37, 128), 0), ((3, 4, 8, 64), 0),
           ((3, 4, 16, 64), -1), ((2, 8, 32, 16), -1)]  # fmt: skip


@needs_quanto
@pytest.mark.parametrize("nbits", [2, 4])
@pytest.mark.parametrize(("shape", "axis"), LAYOUTS)
def test_layout_equals_quanto(shape: tuple[int, ...], axis: int, nbits: int) -> None:
    from optimum.quanto import MaxOptimizer, qint2, qint4, quantize_weight

    t = torch.randn(shape, dtype=torch.bfloat16)
    qtype = qint4 if nbits == 4 else qint2
    scale, shift = MaxOptimizer()(t, qtype, axis, 64)  # QuantoQuantizedLayer._quantize
    real = quantize_weight(t, qtype, axis, scale, shift, 64)
    mine = kq.quantize(t, axis, nbits, 64)
    # The same bytes, bit for bit: quanto's arithmetic run as plain tensor ops.
    assert torch.equal(mine.data, real._data._data)
    assert torch.equal(mine.scale, real._scale) and torch.equal(mine.shift, real._shift)
    assert mine.rows == real._data.shape[0]


def _cpu_unpack(t: torch.Tensor, bits: int) -> torch.Tensor:
    """quanto's CPU kernel (library/extensions/cpp/unpack.cpp): `torch::cat({t & m0, (t & m1)
    >> bits, ...}, 0)`, its C++ temporaries alive until the statement ends."""
    masks = [0x0F, 0xF0] if bits == 4 else [0x03, 0x0C, 0x30, 0xC0]
    masked = [t & m for m in masks]
    shifted = [masked[0]] + [m >> (bits * i) for i, m in enumerate(masked) if i]
    out = torch.cat(shifted, 0)
    del masked, shifted
    return out


@needs_quanto
@pytest.mark.parametrize(("new_tokens", "beams"), [(6, 1), (6, 3), (131, 1)])
def test_trace_equals_a_real_quantized_generate(
    monkeypatch: pytest.MonkeyPatch, new_tokens: int, beams: int
) -> None:
    model = tiny_llama()
    monkeypatch.setattr(kq, "unpack", _cpu_unpack)  # as the CPU measured here runs it
    w = _workload(new_tokens, beams)
    traced = trace_generation_once(resolve_model(model), w, None, num_layers=None,
                                   new_tokens=new_tokens)  # fmt: skip
    est = MemoryProfile.from_events(traced.trace.records, traced.trace.events)
    ids = torch.randint(0, model.config.vocab_size, (B, P))
    with memfit.measure(model) as m, torch.no_grad():
        out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, num_beams=beams,
                             cache_implementation="quantized")  # fmt: skip
    assert out.shape == (B, P + new_tokens)
    real = m.profile
    assert real is not None
    prompt_ids = 512  # the (B, P) int64 ids made before the measured block, as for "dynamic"
    assert est.breakdown == dict(
        real.breakdown,
        inputs=real.breakdown["inputs"] + prompt_ids,
        temporaries=real.breakdown["temporaries"] - prompt_ids,
    )
    assert est.peak_allocated_bytes == real.peak_allocated_bytes
    timeline = [b for b, ev in zip(est.timeline, est.events, strict=True) if ev.op != CALL_END_OP]
    seen = next(i for i, ev in enumerate(real.events) if ev.phase == "forward")
    assert timeline[seen:] == real.timeline[seen:]


def test_sliding_window_model_is_refused() -> None:
    import transformers

    cfg = transformers.Qwen2Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        use_sliding_window=True, sliding_window=16, max_window_layers=1,
    )  # fmt: skip
    model = transformers.Qwen2ForCausalLM._from_config(cfg, attn_implementation="eager")
    with pytest.raises(BadInputError, match=r"sliding-window layers.*cache='dynamic'"):
        memfit.estimate(model, _workload(6))


def test_groups_that_do_not_divide_are_refused() -> None:
    # 2 KV heads x head_dim 16 x 7 positions = 224 values a row, not a multiple of 64.
    with pytest.raises(BadInputError, match=r"224 is not a multiple of 64.*prompt_len"):
        memfit.estimate(tiny_llama(), _workload(6).with_(prompt_len=7))
