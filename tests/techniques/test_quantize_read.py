"""A model loaded quantized by transformers and bitsandbytes (`BitsAndBytesConfig`), read back by
the trainer callbacks' copy (`integrations._reading.meta_copy` with
`techniques.quantize.read`): its estimate equals memfit's estimate of the same model quantized by
a Workload, storage for storage, and what memfit does not model is refused naming the layer."""

from __future__ import annotations

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes")
transformers = pytest.importorskip("transformers")

import memfit  # noqa: E402
from memfit.errors import BadInputError  # noqa: E402
from memfit.integrations._reading import BatchTemplate, meta_copy, spec_of_run  # noqa: E402
from memfit.techniques.quantize.read import quantized_stand_ins  # noqa: E402
from memfit.techniques.quantize.trace import QuantizedLinear  # noqa: E402

SEQ, BATCH = 32, 2
LAYERS = 14  # 2 blocks x (q, k, v, o, gate, up, down); lm_head stays in bf16 (transformers' rule)


def _config() -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, vocab_size=256, max_position_embeddings=64,
    )  # fmt: skip


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(_config()).save_pretrained(folder)
    return str(folder)


def _loaded(folder: str, **quant) -> torch.nn.Module:
    q = transformers.BitsAndBytesConfig(**quant)
    return transformers.LlamaForCausalLM.from_pretrained(
        folder, quantization_config=q, dtype=torch.bfloat16, device_map="cpu"
    )


def _read_estimate(model: torch.nn.Module, w: memfit.Workload) -> memfit.Estimate:
    batch = {"input_ids": torch.zeros(BATCH, SEQ, dtype=torch.long)}
    return memfit.estimate(spec_of_run(model, BatchTemplate.of(batch)), w)


CASES = {
    "nf4": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4"),
    "nf4-dq": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True),
    "fp4": dict(load_in_4bit=True, bnb_4bit_quant_type="fp4"),
    "int8": dict(load_in_8bit=True),
}


@pytest.mark.parametrize("method", list(CASES))
def test_a_model_loaded_quantized_estimates_as_memfits_quantized_model(saved, method):
    quant = dict(CASES[method])
    if method != "int8":  # memfit's own compute dtype for a bf16 model: its inputs' (bf16)
        quant["bnb_4bit_compute_dtype"] = torch.bfloat16
    w = memfit.Workload(batch_size=BATCH, seq_len=SEQ, mode="inference", precision="bf16-true")
    got = _read_estimate(_loaded(saved, **quant), w)
    torch.manual_seed(0)
    want = memfit.estimate(transformers.LlamaForCausalLM(_config()), w.with_(quantize=method))
    assert got.profile.breakdown == want.profile.breakdown
    assert got.profile.peak_allocated_bytes == want.profile.peak_allocated_bytes
    assert got.parameter_count == want.parameter_count == 393_856  # logical: the unquantized count
    label = memfit.techniques.QuantizeConfig(method=method).label
    assert f"{label}, read from the model: {LAYERS} linear layers" in " ".join(
        quantized_stand_ins(_loaded(saved, **quant), {})[1]
    )


def test_each_layer_setting_is_read(saved):
    """The compute dtype a layer fixed (transformers' default bnb_4bit_compute_dtype=float32),
    the block size and the original dtype come from the layer itself."""
    model = _loaded(saved, load_in_4bit=True, bnb_4bit_quant_type="nf4")
    copy = meta_copy(model)
    q = copy.model.layers[0].self_attn.q_proj
    assert isinstance(q, QuantizedLinear)
    assert (q.config.method, q.config.compute_dtype, q.config.blocksize) == ("nf4", "float32", 64)
    assert q.weight_dtype == torch.bfloat16 and q.lora_clone is False
    # Storages as bitsandbytes holds them: 128 x 128 packed two per byte, an absmax per 64.
    shapes = {n: (tuple(p.shape), p.dtype) for n, p in q.named_parameters()}
    assert shapes == {"q_data": ((8192, 1), torch.uint8), "q_absmax": ((256,), torch.float32),
                      "q_code": ((16,), torch.float32)}  # fmt: skip
    assert all(p.device.type == "meta" for p in q.parameters())
    # The real model is untouched.
    assert type(model.model.layers[0].self_attn.q_proj).__name__ == "Linear4bit"


def test_compute_dtype_changes_the_estimate(saved):
    """A float32 compute dtype dequantizes each weight to fp32 for bf16 inputs: the estimate of
    the model as loaded has bigger temporaries than with bfloat16 compute."""
    w = memfit.Workload(batch_size=BATCH, seq_len=SEQ, mode="inference", precision="bf16-true")
    fp32 = _read_estimate(_loaded(saved, load_in_4bit=True, bnb_4bit_quant_type="nf4"), w)
    bf16 = _read_estimate(
        _loaded(saved, load_in_4bit=True, bnb_4bit_quant_type="nf4",
                bnb_4bit_compute_dtype=torch.bfloat16), w,
    )  # fmt: skip
    assert fp32.profile.peak_allocated_bytes > bf16.profile.peak_allocated_bytes


def _one(layer: torch.nn.Module) -> torch.nn.Module:
    return torch.nn.Sequential(layer)


@pytest.mark.parametrize(
    ("layer", "words"),
    [
        (lambda: bnb.nn.Linear4bit(64, 64, quant_type="fp4", compress_statistics=True),
         "FP4 with double quantization"),
        (lambda: bnb.nn.Linear4bit(64, 64, quant_type="nf4", quant_storage=torch.bfloat16),
         "bnb_4bit_quant_storage"),
        (lambda: bnb.nn.Linear8bitLt(64, 64, has_fp16_weights=True), "has_fp16_weights=True"),
        (lambda: bnb.nn.Linear8bitLt(64, 64, has_fp16_weights=False, threshold=0.0),
         "threshold=0.0"),
    ],
)  # fmt: skip
def test_what_memfit_does_not_model_is_refused_naming_the_layer(layer, words):
    with pytest.raises(BadInputError, match=words) as e:
        meta_copy(_one(layer()))
    assert "'0'" in str(e.value)  # the layer's name
