"""Pre-quantized checkpoints: memfit's bytes per layer equal the stored bytes per layer.

Where the library runs on CPU (bitsandbytes 0.50), a tiny model is quantized with it, saved,
loaded back by transformers and its layers' storages measured. Where it needs a GPU, the
checkpoint's tensors are written by hand from the format's specification (transformers'
integration code; memfit.techniques.prequantized.layouts cites each) and checked against the
tensors transformers' own module classes declare, and against the headers memfit reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import memfit
from memfit.errors import BadInputError
from memfit.models.sources import resolve_model
from memfit.techniques.prequantized import (
    bind_prequantized,
    forward_path,
    read_quantization_config,
)
from memfit.techniques.prequantized.layouts import linear_storages
from memfit.techniques.quantize.layouts import nbytes
from tests.conftest import TINY_LLAMA_CONFIG

E, H, I, LAYERS = 4, 64, 64, 2  # noqa: E741  (a tiny GPT-OSS: experts, hidden, intermediate)
OSS_SKIP = [
    "model.layers.*.self_attn",
    "model.layers.*.mlp.router",
    "model.embed_tokens",
    "lm_head",
]
OSS_QUANT = {"quant_method": "mxfp4", "modules_to_not_convert": OSS_SKIP}
OSS = {
    "model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "hidden_size": H,
    "intermediate_size": I, "num_hidden_layers": LAYERS, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": E, "num_experts_per_tok": 2,
    "vocab_size": 128, "layer_types": ["sliding_attention", "full_attention"],
    "sliding_window": 8, "max_position_embeddings": 256, "quantization_config": OSS_QUANT,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "original_max_position_embeddings": 4096, "truncate": False},
}  # fmt: skip


def _traced_params(source: str, w: memfit.Workload, gpu: str | None) -> dict[str, torch.Tensor]:
    """The parameters of the fake model memfit traces for `source` on `gpu`, by name."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memfit.cuda.target import get_gpu
    from memfit.estimator.trace.step_runner import _traced_model

    spec = resolve_model(source)
    cap = get_gpu(gpu).compute_capability if gpu else None
    spec = bind_prequantized(spec, w, cap)
    model, _, _ = _traced_model(spec, w, None, FakeTensorMode(allow_non_fake_inputs=True),
                                torch.bfloat16, None)  # fmt: skip
    return dict(model.named_parameters())


def _bytes_under(params: dict[str, Any], prefix: str) -> int:
    return sum(p.numel() * p.element_size() for n, p in params.items()
               if n.startswith(prefix + "."))  # fmt: skip


# ----------------------------------------------------------------------------- reading, refusing


def test_unknown_method_is_refused_by_name() -> None:
    with pytest.raises(
        BadInputError, match=r"quant_method 'nonesuch' is not a method transformers"
    ):
        read_quantization_config({"quant_method": "nonesuch"}, "x/config.json")


def test_method_memfit_does_not_model_is_refused_by_name() -> None:
    with pytest.raises(BadInputError, match="quant_method 'hqq' is a method transformers loads"):
        read_quantization_config({"quant_method": "hqq", "quant_config": {}}, "x/config.json")


def test_bitsandbytes_config_reads_as_transformers_does() -> None:
    c = read_quantization_config({"quant_method": "bitsandbytes", "load_in_4bit": True,
                                  "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
                                  "bnb_4bit_compute_dtype": "bfloat16"}, "c")  # fmt: skip
    assert (c.method, c.bnb) == ("bitsandbytes_4bit", ("nf4-dq", "bfloat16"))
    assert read_quantization_config({"quant_method": "bitsandbytes", "load_in_8bit": True},
                                    "c").bnb == ("int8", None)  # fmt: skip


def test_forward_path_rules() -> None:
    mx = read_quantization_config({"quant_method": "mxfp4"}, "c")
    assert not forward_path(mx, (7, 0)).kernel  # V100: dequantized to bf16
    assert forward_path(mx, (7, 5)).kernel and forward_path(mx, (9, 0)).kernel
    fp8 = read_quantization_config({"quant_method": "fp8", "weight_block_size": [128, 128]}, "c")
    assert not forward_path(fp8, (8, 6)).kernel and forward_path(fp8, (8, 9)).kernel
    fb = read_quantization_config({"quant_method": "fbgemm_fp8"}, "c")
    with pytest.raises(BadInputError, match=r"compute capability >= 9\.0"):
        forward_path(fb, (8, 9))


def test_training_on_a_gptq_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TINY_LLAMA_CONFIG, "quantization_config": {
        "quant_method": "gptq", "bits": 4, "group_size": 32}}))  # fmt: skip
    with pytest.raises(BadInputError, match="not training on it"):
        memfit.estimate(str(tmp_path), memfit.Workload(batch_size=1, seq_len=8))


# ----------------------------------------------------------------------------- MXFP4 (GPT-OSS)


def _oss_checkpoint(folder: Path) -> Path:
    """A tiny GPT-OSS MXFP4 checkpoint written by hand: transformers' tensors in bf16 except
    the experts' `*_blocks` / `*_scales` (uint8, integrations/mxfp4.py), no dtype in the config
    (as openai/gpt-oss-20b's)."""
    from safetensors.torch import save_file
    from transformers import GptOssConfig, GptOssForCausalLM

    cfg = {k: v for k, v in OSS.items() if k not in ("model_type", "architectures",
                                                      "quantization_config")}  # fmt: skip
    model = GptOssForCausalLM(GptOssConfig(**cfg)).to(torch.bfloat16)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()
          if not k.endswith(("experts.gate_up_proj", "experts.down_proj"))}  # fmt: skip
    for layer in range(LAYERS):
        p = f"model.layers.{layer}.mlp.experts."
        sd[p + "gate_up_proj_blocks"] = torch.randint(0, 255, (E, 2 * I, H // 32, 16),
                                                      dtype=torch.uint8)  # fmt: skip
        sd[p + "gate_up_proj_scales"] = torch.full((E, 2 * I, H // 32), 127, dtype=torch.uint8)
        sd[p + "down_proj_blocks"] = torch.randint(0, 255, (E, H, I // 32, 16), dtype=torch.uint8)
        sd[p + "down_proj_scales"] = torch.full((E, H, I // 32), 127, dtype=torch.uint8)
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(OSS))
    return folder


#: One experts module, kernel path: blocks (E, N, K/32, 16) and scales (E, N, K/32) uint8 of
#: gate_up (N = 2I, K = H) and down (N = H, K = I), biases float32 (E, 2I) and (E, H).
OSS_KERNEL_LAYER = (E * 2 * I * H // 2 + E * 2 * I * H // 32 + E * H * I // 2 + E * H * I // 32
                    + 4 * (E * 2 * I + E * H))  # fmt: skip


def test_mxfp4_kernel_path_storage_per_layer(tmp_path: Path) -> None:
    from transformers import GptOssConfig
    from transformers.integrations.mxfp4 import Mxfp4GptOssExperts

    src = str(_oss_checkpoint(tmp_path))
    w = memfit.Workload(mode="inference", batch_size=1, seq_len=8, precision="bf16-true")
    params = _traced_params(src, w, "rtx-4090")
    for layer in range(LAYERS):
        assert _bytes_under(params, f"model.layers.{layer}.mlp.experts") == OSS_KERNEL_LAYER
    # The packed weights transformers' own Mxfp4GptOssExperts declares: the same bytes.
    cfg = {k: v for k, v in OSS.items() if k not in ("model_type", "architectures")}
    with torch.device("meta"):
        real = Mxfp4GptOssExperts(GptOssConfig(**cfg))
    assert sum(p.numel() * p.element_size() for p in real.parameters()) == OSS_KERNEL_LAYER - (
        E * 2 * I * H // 32 + E * H * I // 32
    )  # its scales live in the kernels' precision config
    # The header check ran (a mismatch raises) and the 16-bit layers are those of the config.
    prof = memfit.estimate(src, w.with_(gpu="rtx-4090"))
    note = next(n for n in prof.notes if n.startswith("MXFP4"))
    assert f"Each of the {4 * LAYERS} quantized storages of the traced layers matches" in note
    assert "model.layers.*.self_attn" in note


def test_mxfp4_fallback_equals_what_transformers_loads_on_cpu(tmp_path: Path) -> None:
    """Below 7.5 (a V100) transformers dequantizes the experts to bf16, as it does on CPU
    without kernels: the model it loads here is that fallback's storage, layer by layer."""
    from transformers import AutoModelForCausalLM

    src = str(_oss_checkpoint(tmp_path))
    loaded = AutoModelForCausalLM.from_pretrained(src)  # CPU: Mxfp4Config dequantize=True
    real = dict(loaded.named_parameters())
    w = memfit.Workload(mode="inference", batch_size=1, seq_len=8, precision="auto")
    from memfit.estimator.auto_precision import resolve_precision

    _, w = resolve_precision(resolve_model(src), w)
    assert w.precision == "bf16-true"  # the headers' first floating tensor, as transformers
    traced = _traced_params(src, w, "v100-16gb")
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}.mlp.experts"
        assert (
            _bytes_under(traced, prefix)
            == _bytes_under(real, prefix)
            == 2 * (E * H * 2 * I + E * 2 * I + E * I * H + E * H)
        )


# ----------------------------------------------------------------------------- bitsandbytes


@pytest.mark.parametrize("kind", ["nf4-dq", "int8"])
def test_bitsandbytes_serialized_per_layer_bytes(tmp_path: Path, kind: str) -> None:
    pytest.importorskip("bitsandbytes")
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

    cfg = {k: v for k, v in TINY_LLAMA_CONFIG.items() if k not in ("model_type", "architectures")}
    LlamaForCausalLM(LlamaConfig(**cfg)).save_pretrained(tmp_path / "fp")
    q = (BitsAndBytesConfig(load_in_8bit=True) if kind == "int8" else BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16))  # fmt: skip
    AutoModelForCausalLM.from_pretrained(tmp_path / "fp", quantization_config=q,
                                         dtype=torch.bfloat16, device_map="cpu"
                                         ).save_pretrained(tmp_path / "q")  # fmt: skip
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "q", device_map="cpu")
    w = memfit.Workload(mode="inference", batch_size=1, seq_len=8, precision="bf16-true")
    traced = _traced_params(str(tmp_path / "q"), w, None)
    checked = 0
    for name, mod in back.named_modules():
        if type(mod).__name__ not in ("Linear4bit", "Linear8bitLt"):
            continue
        wt = mod.weight
        if kind == "int8":
            real = [wt.data, wt.SCB]
        else:
            qs = wt.quant_state
            real = [wt.data, qs.absmax, qs.code, qs.offset, qs.state2.absmax, qs.state2.code]
        assert _bytes_under(traced, name) == sum(t.numel() * t.element_size() for t in real)
        checked += 1
    assert checked == 7 * TINY_LLAMA_CONFIG["num_hidden_layers"]  # lm_head kept, as transformers


# ----------------------------------------------------------------------------- AWQ, GPTQ, FP8


def _layer_from_spec(method: str, n: int, k: int, **cfg: Any) -> dict[str, tuple[str, tuple]]:
    config = read_quantization_config({"quant_method": method, **cfg}, "c")
    return {s.name: (str(s.dtype).removeprefix("torch."), s.shape)
            for s in linear_storages(config, n, k)}  # fmt: skip


def test_awq_gemm_layout_by_hand() -> None:
    """AWQ GEMM, 4-bit, group 128, an 11008 x 4096 (up_proj of a 7B) layer: qweight
    (K, N/8), qzeros (K/128, N/8) int32, scales (K/128, N) fp16."""
    got = _layer_from_spec("awq", 11008, 4096, bits=4, group_size=128, version="gemm")
    assert got == {"qweight": ("int32", (4096, 1376)), "qzeros": ("int32", (32, 1376)),
                   "scales": ("float16", (32, 11008))}  # fmt: skip
    config = read_quantization_config({"quant_method": "awq", "bits": 4, "group_size": 128}, "c")
    assert nbytes(linear_storages(config, 11008, 4096)) == 4096 * 11008 // 2 + 32 * 1376 * 4 + (
        32 * 11008 * 2
    )


def test_gptq_layout_by_hand() -> None:
    got = _layer_from_spec("gptq", 11008, 4096, bits=4, group_size=128, desc_act=False)
    assert got == {"qweight": ("int32", (512, 11008)), "qzeros": ("int32", (32, 1376)),
                   "scales": ("float16", (32, 11008)), "g_idx": ("int32", (4096,))}  # fmt: skip
    got8 = _layer_from_spec("gptq", 4096, 4096, bits=8, group_size=-1)
    assert got8["qweight"] == ("int32", (1024, 4096)) and got8["scales"] == ("float16", (1, 4096))


def test_fp8_layouts_equal_transformers_modules() -> None:
    """The tensors transformers' FP8Linear and FbgemmFp8Linear declare (built on meta)."""
    from transformers.integrations.fbgemm_fp8 import FbgemmFp8Linear
    from transformers.integrations.finegrained_fp8 import FP8Linear

    n, k = 300, 520  # not multiples of 128: the block scales round up
    with torch.device("meta"):
        fg = FP8Linear(k, n, block_size=(128, 128))
        ue = FP8Linear(k, n, block_size=(128, 128), scale_fmt="ue8m0")
        fb = FbgemmFp8Linear(k, n, bias=False)
    real_fg = {name: (str(t.dtype).removeprefix("torch."), tuple(t.shape))
               for name, t in [*fg.named_parameters(), *fg.named_buffers()]}  # fmt: skip
    assert _layer_from_spec("fp8", n, k, weight_block_size=[128, 128]) == real_fg
    assert real_fg["weight_scale_inv"] == ("float32", (3, 5))
    ue8m0 = _layer_from_spec("fp8", n, k, weight_block_size=[128, 128], scale_fmt="ue8m0")
    assert ue8m0["weight_scale_inv"] == (str(ue.weight_scale_inv.dtype).removeprefix("torch."),
                                         (3, 5))  # fmt: skip
    real_fb = {name: (str(t.dtype).removeprefix("torch."), tuple(t.shape))
               for name, t in [*fb.named_parameters(), *fb.named_buffers()]}  # fmt: skip
    assert _layer_from_spec("fbgemm_fp8", n, k) == real_fb


@pytest.mark.parametrize("method,cfg", [
    ("awq", {"bits": 4, "group_size": 32}), ("gptq", {"bits": 4, "group_size": 32}),
    ("fp8", {"weight_block_size": [32, 32]}), ("fbgemm_fp8", {}),
])  # fmt: skip
def test_hand_written_checkpoint_traces_its_headers(tmp_path: Path, method: str,
                                                    cfg: dict[str, Any]) -> None:  # fmt: skip
    """A checkpoint written from the spec's shapes: every quantized linear of the trace has the
    header's dtype and shape (the check raises otherwise), and the kept lm_head stays."""
    from safetensors.torch import save_file

    quant = {"quant_method": method, **cfg}
    config = read_quantization_config(quant, "c")
    tensors = {}
    shapes = {"q_proj": (64, 64), "k_proj": (32, 64), "v_proj": (32, 64), "o_proj": (64, 64),
              "gate_proj": (128, 64), "up_proj": (128, 64), "down_proj": (64, 128)}  # fmt: skip
    for layer in range(2):
        for proj, (n, k) in shapes.items():
            part = "self_attn" if proj.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            for s in linear_storages(config, n, k):
                tensors[f"model.layers.{layer}.{part}.{proj}.{s.name}"] = torch.zeros(
                    s.shape, dtype=s.dtype
                )
    tensors["lm_head.weight"] = torch.zeros((128, 64), dtype=torch.bfloat16)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({**TINY_LLAMA_CONFIG,
                                                      "quantization_config": quant}))  # fmt: skip
    w = memfit.Workload(mode="inference", batch_size=1, seq_len=8, precision="bf16-true")
    traced = _traced_params(str(tmp_path), w, "h100-sxm")
    for name, t in tensors.items():
        if name != "lm_head.weight":
            assert (traced[name].dtype, tuple(traced[name].shape)) == (t.dtype, tuple(t.shape))
    assert traced["lm_head.weight"].dtype == torch.bfloat16
    prof = memfit.estimate(str(tmp_path), w.with_(gpu="h100-sxm"))
    stored = f"Each of the {len(tensors) - 1} quantized storages of the traced layers matches"
    assert any(stored in n for n in prof.notes)


# ----------------------------------------------------------------------------- 8B examples

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "checkpoints"
#: Llama-3.1-8B's linear layers of one block, (out, in).
LLAMA8B_LINEARS = [(4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096),
                   (14336, 4096), (14336, 4096), (4096, 14336)]  # fmt: skip
LLAMA8B_16BIT = 2 * (2 * 128256 * 4096 + 32 * 2 * 4096 + 4096)  # embed, lm_head, norms (bf16)


def _quantized_layer(method: str, n: int, k: int) -> int:
    """Bytes of one quantized n x k layer, by hand from each format's shapes."""
    if method == "awq":  # qweight (k, n/8) + qzeros (k/128, n/8) int32 + scales (k/128, n) fp16
        return k * n // 2 + (k // 128) * (n // 8) * 4 + (k // 128) * n * 2
    if method == "gptq":  # qweight (k/8, n) + qzeros + scales as AWQ + g_idx (k,) int32
        return k * n // 2 + (k // 128) * (n // 8) * 4 + (k // 128) * n * 2 + 4 * k
    if method == "fp8":  # weight (n, k) fp8 + weight_scale_inv (n/128, k/128) fp32
        return n * k + (n // 128) * (k // 128) * 4
    return n * k + n * 4 + 4  # fbgemm: weight fp8 + weight_scale (n, 1) + input_scale_ub (1,)


@pytest.mark.parametrize("method", ["awq", "gptq", "fp8", "fbgemm-fp8"])
def test_llama_8b_examples_weights_by_hand(method: str) -> None:
    w = memfit.Workload(mode="inference", batch_size=1, seq_len=8, precision="bf16-true")
    params = _traced_params(str(EXAMPLES / f"llama-3.1-8b-{method}"), w, "h100-sxm")
    per_block = sum(_quantized_layer(method, n, k) for n, k in LLAMA8B_LINEARS)
    total = sum(p.numel() * p.element_size() for p in params.values())
    assert total == 32 * per_block + LLAMA8B_16BIT


# ----------------------------------------------------------------------------- compressed-tensors

CT_SCHEMES = {
    "fp8-channel": ("float-quantized", {"num_bits": 8, "type": "float", "strategy": "channel"},
                    {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}),
    "fp8-static": ("float-quantized", {"num_bits": 8, "type": "float", "strategy": "tensor"},
                   {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}),
    "w4a16-group": ("pack-quantized", {"num_bits": 4, "type": "int", "strategy": "group",
                                       "group_size": 32}, None),
}  # fmt: skip


def _ct_checkpoint(folder: Path, scheme: str) -> Path:
    """A tiny llama quantized and compressed by compressed-tensors itself, saved as
    llm-compressor saves one (ModelCompressor.compress_model, save_pretrained, update_config)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        QuantizationStatus,
        apply_quantization_config,
    )
    from transformers import LlamaConfig, LlamaForCausalLM

    fmt, weights, inputs = CT_SCHEMES[scheme]
    cfg = {k: v for k, v in TINY_LLAMA_CONFIG.items() if k not in ("model_type", "architectures")}
    model = LlamaForCausalLM(LlamaConfig(**cfg)).to(torch.bfloat16)
    acts = QuantizationArgs(**inputs) if inputs else None
    group = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**weights),
                               input_activations=acts)  # fmt: skip
    config = QuantizationConfig(config_groups={"group_0": group}, ignore=["lm_head"], format=fmt,
                                quantization_status=QuantizationStatus.INITIALIZED)  # fmt: skip
    apply_quantization_config(model, config)
    for mod in model.modules():
        for name in ("weight_scale", "input_scale"):
            if hasattr(mod, name):
                getattr(mod, name).data.fill_(0.01)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=fmt)
    compressor.compress_model(model)
    model.save_pretrained(folder)
    compressor.update_config(folder)
    return folder


@pytest.mark.parametrize("scheme", list(CT_SCHEMES))
def test_compressed_tensors_per_layer_bytes(tmp_path: Path, scheme: str) -> None:
    """Stored bytes per layer (as transformers loads the checkpoint) equal memfit's compressed
    layout and the headers; after the first forward (compressed-tensors decompresses every
    layer) they equal the layers memfit traces."""
    pytest.importorskip("compressed_tensors")
    from transformers import AutoModelForCausalLM

    from memfit.techniques.prequantized.layouts import ct_storages

    src = str(_ct_checkpoint(tmp_path, scheme))
    loaded = AutoModelForCausalLM.from_pretrained(src, device_map="cpu")
    names = [n for n, m in loaded.named_modules() if n.startswith("model.layers.")
             and hasattr(m, "weight_scale")]  # fmt: skip
    assert len(names) == 14

    def stored(mod: torch.nn.Module) -> int:
        own = [*mod.parameters(recurse=False), *mod.buffers(recurse=False)]
        return sum(t.numel() * t.element_size() for t in own)

    config = read_quantization_config(json.loads((tmp_path / "config.json").read_text())[
        "quantization_config"], src)  # fmt: skip
    at_load = {n: stored(loaded.get_submodule(n)) for n in names}
    for n in names:
        shape = loaded.get_submodule(n)
        out, inp = (shape.out_features, shape.in_features)
        assert at_load[n] == nbytes(ct_storages(config, out, inp, torch.bfloat16))
    with torch.no_grad():
        loaded(torch.randint(0, 128, (1, 8)))  # decompresses every layer
    w = memfit.Workload(mode="inference", batch_size=1, seq_len=8, precision="bf16-true")
    traced = _traced_params(src, w, "h100-sxm")
    for n in names:
        assert _bytes_under(traced, n) == stored(loaded.get_submodule(n))
    prof = memfit.estimate(src, w.with_(gpu="h100-sxm"))
    assert any("decompress every layer on the first forward" in t and
               "Each of the" in t for t in prof.notes)  # fmt: skip


def test_compressed_tensors_two_groups_is_refused_by_name() -> None:
    pytest.importorskip("compressed_tensors")
    raw = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {
        "a": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float",
                                                 "strategy": "channel"}},
        "b": {"targets": ["re:.*experts.*"], "weights": {"num_bits": 4, "type": "int",
                                                         "strategy": "group", "group_size": 32}},
    }}  # fmt: skip
    with pytest.raises(BadInputError, match="compressed-tensors with 2 config groups"):
        read_quantization_config(raw, "c")


# ----------------------------------------------------------------------------- gpt-oss-20b, CLI


def test_gpt_oss_20b_weights_by_hand() -> None:
    """The published gpt-oss-20b config (examples/checkpoints): experts packed (kernel path),
    the rest in bf16, byte for byte."""
    e, h, i, heads, kv, d, vocab, layers = 32, 2880, 2880, 64, 8, 64, 201088, 24
    experts = (e * 2 * i * (h // 32) * 16 + e * 2 * i * (h // 32)  # gate_up blocks, scales
               + e * h * (i // 32) * 16 + e * h * (i // 32)  # down blocks, scales
               + 4 * (e * 2 * i + e * h))  # float32 biases  # fmt: skip
    attention = 2 * (heads * d * h + heads * d + 2 * (kv * d * h + kv * d) + h * heads * d + h
                     + heads)  # q, k, v, o with biases, sinks  # fmt: skip
    rest = 2 * (e * h + e + 2 * h)  # router, two norms
    total = layers * (experts + attention + rest) + 2 * (2 * vocab * h + h)
    w = memfit.Workload(mode="inference", batch_size=1, seq_len=8, precision="bf16-true")
    params = _traced_params(str(EXAMPLES / "gpt-oss-20b"), w, "rtx-4090")
    assert sum(p.numel() * p.element_size() for p in params.values()) == total == 13_774_535_808


def test_cli_refuses_a_method_by_name_with_exit_2(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from memfit.cli.app import app

    (tmp_path / "config.json").write_text(
        json.dumps({**TINY_LLAMA_CONFIG, "quantization_config": {"quant_method": "hqq"}})
    )
    out = CliRunner().invoke(app, ["estimate", str(tmp_path), "--mode", "inference"])
    assert out.exit_code == 2
    assert "quant_method 'hqq' is a method transformers loads" in out.output


@pytest.mark.parametrize("gpu,kernel", [("rtx-4060-ti-16gb", True), ("v100-16gb", False)])
def test_gpt_oss_20b_generation_says_path_and_kept_layers(gpu: str, kernel: bool) -> None:
    w = memfit.Workload(mode="generate", batch_size=1, prompt_len=64, new_tokens=2,
                        precision="bf16-true", gpu=gpu)  # fmt: skip
    est = memfit.estimate(str(EXAMPLES / "gpt-oss-20b"), w)
    note = next(n for n in est.notes if n.startswith("MXFP4"))
    assert "model.layers.*.mlp.router" in note and "lm_head" in note
    if kernel:
        assert "keep the checkpoint's packed storage" in note and "matmul_ogs" in note
        assert est.profile.breakdown["parameters"] == 13_806_852_096  # allocator blocks
    else:
        assert "below the 7.5 transformers' Mxfp4HfQuantizer requires" in note
        assert est.profile.breakdown["parameters"] > 41_829_514_368
