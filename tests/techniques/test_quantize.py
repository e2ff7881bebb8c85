"""Quantized base weights: layouts equal the real libraries' storages byte for byte; llama-2-7b
by hand; the trace holds those storages; apply_ quantizes a real model with transformers' rule.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import memfit
from memfit.errors import BadInputError
from memfit.techniques import QuantizeConfig
from memfit.techniques.quantize.config import prepare_kbit_casts
from memfit.techniques.quantize.layouts import nbytes
from tests.conftest import module_spec

bnb = pytest.importorskip("bitsandbytes")

N, K = 96, 320  # 30720 weights: 480 blocks of 64, 2 nested blocks of 256


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())


def _bnb4(method: str, dtype: torch.dtype) -> list[torch.Tensor]:
    dq = method == "nf4-dq"
    qt = "fp4" if method == "fp4" else "nf4"
    layer = bnb.nn.Linear4bit(K, N, bias=False, compress_statistics=dq, quant_type=qt)
    layer = layer.to(dtype).to("cpu")  # bitsandbytes quantizes when the weight moves
    qs = layer.weight.quant_state
    out = [layer.weight.data, qs.absmax, qs.code]
    if dq:
        out += [qs.offset, qs.state2.absmax, qs.state2.code]
    return out


@pytest.mark.parametrize("method", ["nf4", "nf4-dq", "fp4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_bnb_4bit_layout_equals_real_layer(method: str, dtype: torch.dtype) -> None:
    real = _storage_bytes(_bnb4(method, dtype))
    expected = {
        # data 30720/2, absmax 480 fp32, code 16 fp32
        "nf4": 15360 + 480 * 4 + 64,
        "fp4": 15360 + 480 * 4 + 64,
        # data, absmax 480 uint8, code, offset fp32, state2 absmax 2 fp32, state2 code 256 fp32
        "nf4-dq": 15360 + 480 + 64 + 4 + 2 * 4 + 1024,
    }[method]
    assert real == expected
    assert nbytes(QuantizeConfig(method=method).storages(N, K, dtype)) == expected


def test_bnb_int8_layout_equals_real_layer() -> None:
    layer = bnb.nn.Linear8bitLt(K, N, bias=False, has_fp16_weights=False).to(torch.float16)
    layer = layer.to("cpu")
    real = _storage_bytes([layer.weight.data, layer.weight.SCB])
    assert real == N * K + N * 4  # CB int8, SCB fp32 per row
    assert nbytes(QuantizeConfig(method="int8").storages(N, K, torch.float16)) == real


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao")
@pytest.mark.parametrize("method", ["int8-wo", "fp8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_torchao_layout_equals_real_tensor(method: str, dtype: torch.dtype) -> None:
    from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

    m = torch.nn.Sequential(torch.nn.Linear(K, N, bias=False)).to(dtype)
    quantize_(m, Int8WeightOnlyConfig() if method == "int8-wo" else Float8WeightOnlyConfig())
    w = m[0].weight
    names, _ = w.__tensor_flatten__()
    real = _storage_bytes([getattr(w, n) for n in names])
    # int8-wo: qdata int8 + scale fp32 (n, 1) + zero_point int8 (n, 1); fp8: qdata + scale.
    assert real == (N * K + N * 4 + N if method == "int8-wo" else N * K + N * 4)
    assert nbytes(QuantizeConfig(method=method).storages(N, K, dtype)) == real


def test_torchao_int4_layout() -> None:
    """Int4Tensor (plain) needs mslk's CUDA kernels to quantize, so this checks the layout of
    torchao's docstring: qdata (n, k/2) int8, scale and zero_point (k/128, n) bf16."""
    st = QuantizeConfig(method="int4-wo").storages(N, 256, torch.bfloat16)
    assert [(s.name, s.shape, s.dtype) for s in st] == [
        ("qdata", (N, 128), torch.int8),
        ("scale", (2, N), torch.bfloat16),
        ("zero_point", (2, N), torch.bfloat16),
    ]
    assert nbytes(st) == N * 128 + 2 * (2 * N * 2)


def _llama7b_linears() -> list[tuple[int, int]]:
    h, i = 4096, 11008
    return [(h, h)] * 4 + [(i, h), (i, h), (h, i)]


def test_llama_2_7b_nf4_by_hand() -> None:
    cfg = QuantizeConfig(method="nf4")
    per_layer = sum(nbytes(cfg.storages(n, k, torch.bfloat16)) for n, k in _llama7b_linears())
    # q: 16,777,216 weights -> 8,388,608 B packed + 262,144 absmax x 4 B + 64 B code
    q = 8_388_608 + 1_048_576 + 64
    # gate: 45,088,768 weights -> 22,544,384 B + 704,512 x 4 B + 64 B
    gate = 22_544_384 + 2_818_048 + 64
    assert per_layer == 4 * q + 3 * gate == 113_836_480
    assert 32 * per_layer == 3_642_767_360


def test_llama_2_7b_nf4_double_quant_by_hand() -> None:
    cfg = QuantizeConfig(method="nf4-dq")
    per_layer = sum(nbytes(cfg.storages(n, k, torch.bfloat16)) for n, k in _llama7b_linears())
    # q: packed + 262,144 uint8 absmax + code 64 + offset 4 + 1,024 nested x 4 B + 1,024 B code
    q = 8_388_608 + 262_144 + 64 + 4 + 4_096 + 1_024
    # gate: 704,512 blocks -> 2,752 nested blocks
    gate = 22_544_384 + 704_512 + 64 + 4 + 11_008 + 1_024
    assert per_layer == 4 * q + 3 * gate == 104_406_748
    assert 32 * per_layer == 3_341_015_936


def _tiny_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, vocab_size=256,
                      max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def _batch(b: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 256, (b, 32))
    return {"input_ids": ids, "labels": ids}


def _ceil512(n: int) -> int:
    return -(-n // 512) * 512


@pytest.mark.parametrize("method", ["nf4", "nf4-dq", "int8", "int8-wo", "fp8"])
def test_trace_parameters_are_the_layout(method: str) -> None:
    """Inference estimate of a tiny Llama in bf16: parameters = quantized storages of the 14
    block linears (each rounded to 512 B as the allocator does) + embeddings, norms, lm_head."""
    w = memfit.Workload(batch_size=1, mode="inference", precision="bf16-true", quantize=method)
    est = memfit.estimate(
        module_spec(_tiny_llama(), lambda b: {"input_ids": _batch(b)["input_ids"]}), w
    )
    cfg = QuantizeConfig(method=method)
    shapes = [(128, 128)] * 4 + [(256, 128), (256, 128), (128, 256)]
    quant = 2 * sum(
        _ceil512(s.nbytes) for n, k in shapes for s in cfg.storages(n, k, torch.bfloat16)
    )
    full = 2 * _ceil512(256 * 128 * 2) + 5 * _ceil512(128 * 2)  # embed, lm_head; 5 norms
    assert est.profile.breakdown["parameters"] == quant + full
    assert est.parameter_count == sum(p.numel() for p in _tiny_llama().parameters())
    assert any("kept in full precision" in n and "lm_head" in n for n in est.notes)


def test_qlora_trains_and_prepare_kbit_casts() -> None:
    """QLoRA in bf16-true: LoRA adapters in fp32 (peft on a 4-bit base); prepare_kbit casts the
    bf16 embeddings, norms and lm_head to fp32: 2 x 65,536 B + 5 x 512 B more parameters."""
    base = memfit.Workload(batch_size=1, precision="bf16-true", quantize="nf4",
                           lora=memfit.LoraConfig(rank=4))  # fmt: skip
    a = memfit.estimate(module_spec(_tiny_llama(), _batch), base)
    b = memfit.estimate(module_spec(_tiny_llama(), _batch), base.with_(prepare_kbit=True))
    grown = b.profile.breakdown["parameters"] - a.profile.breakdown["parameters"]
    assert grown == 2 * (_ceil512(256 * 128 * 4) - _ceil512(256 * 128 * 2))  # norms: 512 B both
    shapes = [(128, 128)] * 4 + [(256, 128), (256, 128), (128, 256)]
    assert a.trainable_parameter_count == 2 * sum(4 * (k + n) for n, k in shapes)


def test_int4_training_is_refused() -> None:
    spec = module_spec(_tiny_llama(), _batch)
    w = memfit.Workload(precision="bf16-true", quantize="int4-wo", lora=memfit.LoraConfig(rank=4))
    with pytest.raises(BadInputError, match="no backward"):
        memfit.estimate(spec, w)


def test_prepare_kbit_refused_for_torchao() -> None:
    with pytest.raises(BadInputError, match="torchao"):
        prepare_kbit_casts(torch.nn.Linear(2, 2), QuantizeConfig(method="int8-wo"))


def test_apply_quantizes_a_real_model_keeping_lm_head() -> None:
    model = _tiny_llama().to(torch.bfloat16)
    memfit.apply_(model, [QuantizeConfig(method="nf4-dq"), memfit.LoraConfig(rank=4)],
                  device="cpu")  # fmt: skip
    q = model.model.layers[0].self_attn.q_proj
    assert isinstance(q.base_layer, bnb.nn.Linear4bit)
    assert q.base_layer.weight.quant_state.nested
    assert type(model.lm_head) is torch.nn.Linear
    assert q.lora_A["default"].weight.dtype == torch.float32
    loss = model(**_batch(2)).loss
    loss.backward()
    assert q.lora_B["default"].weight.grad is not None


def test_bad_blocksize() -> None:
    with pytest.raises(BadInputError, match="blocksize 100"):
        QuantizeConfig(method="nf4", blocksize=100)
