"""Quantized layers measured for real: `memfit.measure` over real bitsandbytes / torchao layers
on the CPU against the estimate's fake stand-ins (techniques/quantize_trace.py).

- Parameters: a tiny Llama quantized by `apply_` and measured in inference holds exactly the
  bytes the estimate reports as parameters (and the hand count).
- Temporaries: the real CPU kernels and the stand-ins allocate the same buffers, in the same
  order, for each matmul; where bitsandbytes' CPU path differs from its CUDA path (which the
  stand-ins follow), the difference is asserted to the byte (docs/technique-quantize.md,
  "Checked against real layers").
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch

import memfit
from memfit.techniques import QuantizeConfig
from memfit.techniques.quantize.trace import QuantizedLinear
from tests.conftest import module_spec

bnb = pytest.importorskip("bitsandbytes")
HAS_TORCHAO = importlib.util.find_spec("torchao") is not None
METHODS = ["nf4", "nf4-dq", "fp4", "int8"] + (["int8-wo", "fp8"] if HAS_TORCHAO else [])

N, K, M = 128, 256, 64  # one layer: 128 x 256 weight, 64 rows of input (past gemm_4bit's 4)
HIDDEN, INTER, VOCAB, SEQ = 128, 256, 256, 32


def _ceil512(n: int) -> int:
    return -(-n // 512) * 512


def _tiny_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, vocab_size=VOCAB,
                      max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def _cpu_path_as_cuda(model: torch.nn.Module) -> None:
    """bitsandbytes' `Linear4bit.forward` on a CPU with AVX512-BF16, in eval without grad,
    repacks the weight for its CPU gemv kernel (`_convert_weight_packed_for_cpu`: absmax to a
    bf16 (k/blocksize, n) table, nested absmax dequantized); CUDA never does. Turned off so the
    CPU run keeps the layout CUDA has."""
    for mod in model.modules():
        if hasattr(mod, "support_avx512bf16_for_cpu"):
            mod.support_avx512bf16_for_cpu = False


def _hand_parameters(method: str) -> int:
    """The 14 block linears in `method`'s layout plus bf16 embeddings, lm_head and 5 norms,
    each storage rounded to 512 B."""
    cfg = QuantizeConfig(method=method)
    shapes = [(HIDDEN, HIDDEN)] * 4 + [(INTER, HIDDEN), (INTER, HIDDEN), (HIDDEN, INTER)]
    quant = 2 * sum(
        _ceil512(s.nbytes) for n, k in shapes for s in cfg.storages(n, k, torch.bfloat16)
    )
    return quant + 2 * _ceil512(VOCAB * HIDDEN * 2) + 5 * _ceil512(HIDDEN * 2)


@pytest.mark.parametrize("method", METHODS)
def test_measured_parameters_equal_the_estimate(method: str) -> None:
    """A tiny Llama quantized by apply_ and run in inference: the storages memfit.measure finds
    (packed weights, QuantState tensors, Int8Params.SCB, torchao's inner tensors) are the
    estimate's parameters to the byte."""
    w = memfit.Workload(batch_size=1, mode="inference", precision="bf16-true", quantize=method)
    ids = torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(0))
    est = memfit.estimate(module_spec(_tiny_llama(), lambda b: {"input_ids": ids[:b]}), w)
    model = _tiny_llama()
    memfit.apply_(model, w, device="cpu")
    _cpu_path_as_cuda(model)
    model.eval()
    with torch.no_grad(), memfit.measure(model) as m:
        model(input_ids=ids)
    assert m.profile is not None
    measured = m.profile.breakdown["parameters"]
    assert measured == est.profile.breakdown["parameters"] == _hand_parameters(method)


def _one_layer() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(K, N, bias=False))


def _allocations(profile: Any, step: int | None = None) -> list[tuple[str, int]]:
    """(phase, bytes) of each storage made in forward or backward (of `step`), in order;
    bytes as requested (the profile's totals round them to 512 B)."""
    return [
        (r.phase, r.nbytes)
        for r in profile.records.values()
        if r.phase in ("forward", "backward") and (step is None or r.step == step)
    ]


def _peak_over_model_and_inputs(profile: Any) -> int:
    b = profile.breakdown
    return profile.peak_allocated_bytes - b["parameters"] - b["inputs"] - b["workspaces"]


# Forward of one layer, bf16, (1, 64, 256) input, inference: what CUDA's kernels allocate per
# matmul (the stand-ins) and what the real CPU kernels allocate.
W_BF16 = N * K * 2  # the dequantized weight in the compute dtype: 65,536 B
OUT = M * N * 2  # the layer's output: 16,384 B
BLOCKS_FP32 = N * K // 64 * 4  # nested absmax dequantized to fp32: 2,048 B
FORWARD = {
    # CUDA `gemm_4bit` fallback / CPU default `gemm_4bit`: the weight, then F.linear's output.
    "nf4": [W_BF16, OUT],
    "fp4": [W_BF16, OUT],
    # ... after the nested absmax: dequantize_blockwise's output, then `+ offset`.
    "nf4-dq": [BLOCKS_FP32, BLOCKS_FP32, W_BF16, OUT],
    # Int8Tensor's linear: qdata cast to bf16, mm, row scale cast (n, 1) fp32 -> bf16, times it.
    "int8-wo": [W_BF16, OUT, N * 2, OUT],
    # Float8Tensor.dequantize: fp32 copy, fp32 product, bf16 cast; then the matmul.
    "fp8": [2 * W_BF16, 2 * W_BF16, W_BF16, OUT],
}
# Peak above parameters and inputs, per method. nf4-dq: CUDA's `_dequant_linear_fallback`
# keeps `absmax_dq` alive (a local) through F.linear; the CPU default `gemm_4bit` frees
# dequantize_blockwise's output once `+ offset` is done: one fp32 (blocks,) buffer less.
FORWARD_PEAK = {
    "nf4": (W_BF16 + OUT, W_BF16 + OUT),
    "fp4": (W_BF16 + OUT, W_BF16 + OUT),
    "nf4-dq": (W_BF16 + OUT + 2 * BLOCKS_FP32, W_BF16 + OUT + BLOCKS_FP32),
    "int8-wo": (W_BF16 + OUT, W_BF16 + OUT),
    # _dequantize_affine_float8 keeps its fp32 copy through the product and the bf16 cast.
    "fp8": (2 * W_BF16 + 2 * W_BF16 + W_BF16,) * 2,
}


@pytest.mark.parametrize("method", [m for m in METHODS if m != "int8"])
def test_forward_temporaries_real_layer_equal_estimate(method: str) -> None:
    w = memfit.Workload(batch_size=1, mode="inference", precision="bf16-true", quantize=method)
    batch = torch.randn(1, M, K, dtype=torch.bfloat16)
    est = memfit.estimate(module_spec(_one_layer(), lambda b: batch[:b]), w).profile
    last = max(r.step for r in est.records.values())
    real = _one_layer().to(torch.bfloat16)
    memfit.apply_(real, [QuantizeConfig(method=method)], device="cpu")
    _cpu_path_as_cuda(real)
    real.eval()
    with torch.no_grad(), memfit.measure(real) as m:
        real(batch)
    assert m.profile is not None
    expected = [("forward", n) for n in FORWARD[method]]
    assert _allocations(m.profile) == _allocations(est, last) == expected
    cuda_peak, cpu_peak = FORWARD_PEAK[method]
    assert _peak_over_model_and_inputs(est) == cuda_peak
    assert _peak_over_model_and_inputs(m.profile) == cpu_peak


def _measure_train(model: torch.nn.Module, x: torch.Tensor) -> Any:
    model.train()
    x = x.clone().requires_grad_(True)
    with memfit.measure(model) as m:
        model(x).sum().backward()
    return m.profile


@pytest.mark.parametrize("method", ["nf4", "nf4-dq", "fp4"])
def test_4bit_forward_and_backward_real_equal_stand_in(method: str) -> None:
    """MatMul4Bit with an input that needs its gradient (QLoRA's base layers): forward
    (dequantized weight, F.linear) and backward (`F.dequantize_4bit(B, state)` then the
    matmul) allocate the same buffers, same order, same peak, for the real layer on the CPU and
    the stand-in the estimate traces (run here on real tensors)."""
    x = torch.randn(1, M, K, dtype=torch.bfloat16)
    real = _one_layer().to(torch.bfloat16)
    memfit.apply_(real, [QuantizeConfig(method=method)], device="cpu")
    cfg = QuantizeConfig(method=method)
    stand = torch.nn.Sequential(QuantizedLinear(cfg, N, K, torch.bfloat16, None, False))
    a, b = _measure_train(real, x), _measure_train(stand, x)
    assert _allocations(a) == _allocations(b)
    assert a.peak_allocated_bytes == b.peak_allocated_bytes
    assert a.peak_phase == b.peak_phase == "backward"
    dq = [BLOCKS_FP32] if method == "nf4-dq" else []
    backward = [("backward", n) for n in [*dq, W_BF16, M * K * 2]]
    assert _allocations(a)[-len(backward) :] == backward


def test_int8_backward_real_equals_stand_in() -> None:
    """LLM.int8 in training: on the CPU bitsandbytes runs `MatMul8bitFp` (weight dequantized,
    F.linear) instead of CUDA's `MatMul8bitLt` (int8 matmul), so the forwards differ; the
    backwards are the same code (CB copied to the input's dtype, scaled by SCB / 127, one
    matmul), and allocate the same buffers."""
    x = torch.randn(1, M, K, dtype=torch.bfloat16)
    real = _one_layer().to(torch.bfloat16)
    memfit.apply_(real, [QuantizeConfig(method="int8")], device="cpu")
    cfg = QuantizeConfig(method="int8")
    stand = torch.nn.Sequential(QuantizedLinear(cfg, N, K, torch.bfloat16, None, False))
    a, b = _measure_train(real, x), _measure_train(stand, x)
    # The gradient of .sum() is an expanded (1, 64, 128) bf16: made contiguous (16,384 B),
    # CB as bf16 (65,536 B), SCB / 127 (n, 1) fp32 (512 B), grad of the input (32,768 B).
    backward = [("backward", n) for n in (OUT, W_BF16, 512, M * K * 2)]
    assert [x for x in _allocations(a) if x[0] == "backward"] == backward
    assert [x for x in _allocations(b) if x[0] == "backward"] == backward
    # CPU forward (MatMul8bitFp): CB as bf16, SCB / 127, output. CUDA's (the stand-in): the
    # fp16 input copy, row stats, int8 rows, |A| and its >= 6.0 mask, the int32 product, its
    # fp16 dequantization and the bf16 output (docs/technique-quantize.md).
    assert [n for p, n in _allocations(a) if p == "forward"][:3] == [W_BF16, 512, OUT]
