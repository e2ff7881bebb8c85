"""Pre-quantized checkpoints on fake tensors: the layers transformers' quantizer converts are
replaced by stand-ins holding the checkpoint's storages (memfit.techniques.prequantized.layouts)
whose forward allocates what the real kernel path does; on the dequantized path the model keeps
its 16-bit layers, as transformers does.

Forwards, written out from the code they stand for:
- MXFP4 experts (integrations/mxfp4.py `Mxfp4GptOssMLP.forward`): the router logits
  (`F.linear`, (T, E)), the Triton routing metadata (top-k scores and indices, gather and scatter
  indices: int32 (T * k) each), `matmul_ogs` with the fused SwiGLU ((T * k, I) out), and the
  scatter `matmul_ogs` ((T, H) out). The swizzled layout's padding is not modelled.
- AWQ / GPTQ: AutoAWQ's `WQLinear_GEMM.forward` rule (`FP16_MATMUL_HEURISTIC_CONDITION =
  x.shape[0] * x.shape[1] >= 1024`): from 1024 rows the weight is dequantized to a float16
  (K, N) temporary and multiplied; below, the fused kernel writes only the output. gptqmodel's
  GPTQ kernels are assumed to do the same (an upper bound for Marlin, which never
  dequantizes).
- FP8 fine-grained (finegrained_fp8.py `fp8_linear`): the input quantized per token to
  float8 (M, K) with float32 scales (M, ceil(K / bk)), the output (M, N) in the input's dtype,
  the bias added in place.
- FP8 fbgemm (`FbgemmFp8Linear.forward`): `quantize_fp8_per_row` (float8 (M, K), float32 (M,)),
  `f8f8bf16_rowwise` (bf16 (M, N)), then `output + bias` (a new tensor).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.techniques.prequantized.config import (
    ForwardPath,
    PrequantizedConfig,
    forward_path,
    read_quantization_config,
)
from memfit.techniques.prequantized.layouts import (
    ct_storages,
    linear_storages,
    mxfp4_expert_storages,
)
from memfit.techniques.quantize.layouts import QuantStorage, nbytes
from memfit.techniques.quantize.trace import LOGICAL_NUMEL

__all__ = ["PLAN_KEY", "bind_prequantized", "prepare_prequantized"]

#: Where `bind_prequantized` leaves (config, path) in `ModelSpec.extra`.
PLAN_KEY = "prequantized"
#: AutoAWQ `WQLinear_GEMM.forward`: `x.shape[0] * x.shape[1] >= 1024` rows dequantize.
AWQ_DEQUANT_MIN_ROWS = 1024


def bind_prequantized(spec: Any, w: Any, capability: tuple[int, int] | None) -> Any:
    """`spec` with its checkpoint's quantization (config, forward path on `capability`) in
    `extra[PLAN_KEY]` and in its cache key; `spec` itself when the config has none."""
    entry = spec.extra.get("entry")
    raw = None if entry is None else dict(entry.config).get("quantization_config")
    if raw is None:
        return spec
    config = read_quantization_config(raw, spec.name)
    path = forward_path(config, capability)
    if w.quantize is not None:
        raise BadInputError(
            f"quantize={w.quantize!r} on {spec.name!r}, whose checkpoint is already quantized "
            f"({config.label}, quantization_config): drop --quantize."
        )
    if w.training and not config.method.startswith("bitsandbytes"):
        raise BadInputError(
            f"{spec.name!r} is a pre-quantized {config.label} checkpoint: memfit models its "
            "inference and generation, not training on it: estimate, max-seq or serve it with "
            "--mode inference or generate (`gpus --for` and `plan` plan training)."
        )
    key = None if spec.cache_key is None else f"{spec.cache_key}|prequantized:{path.kernel}"
    return dataclasses.replace(spec, extra={**spec.extra, PLAN_KEY: (config, path)},
                               cache_key=key)  # fmt: skip


def prepare_prequantized(model: torch.nn.Module, spec: Any, w: Any, fake_mode: Any) -> list[str]:
    """Replace, in the fake `model`, what the checkpoint's quantizer converts; returns notes."""
    plan = spec.extra.get(PLAN_KEY)
    if plan is None:
        return []
    config, path = plan
    if config.bnb is not None:
        return _bitsandbytes(model, config, w, fake_mode)
    expected: dict[str, QuantStorage] = {}  # checkpoint name: what the format stores there
    if config.method == "compressed-tensors":
        keep = list(config.skip or ())
        swapped, per = _compressed_tensors(model, config, expected, fake_mode)
        what = "linear layers"
    elif config.method == "mxfp4":
        keep = _not_converted(model, config)
        swapped, per = _mxfp4(model, keep, path, expected, fake_mode)
        what = "GPT-OSS experts modules"
    else:
        keep = _not_converted(model, config)
        swapped, per = _linears(model, config, keep, path, expected, fake_mode)
        what = "linear layers"
    kept = ", ".join(keep) or "none"
    if swapped == 0:
        raise BadInputError(
            f"{spec.name!r}: its quantization_config ({config.label}) converts no layer of the "
            f"model (kept: {kept}). Fix modules_to_not_convert, or remove quantization_config."
        )
    checked = _against_headers(expected, spec.extra.get("checkpoint"))
    if config.method == "awq" and w.precision.startswith("bf16"):
        checked += (
            " transformers loads an AWQ model in float16 on CUDA when bfloat16 is asked "
            "(quantizer_awq.py update_dtype): the same bytes."
        )
    entry = spec.extra.get("entry")
    names_dtype = entry is not None and any(k in entry.config for k in ("dtype", "torch_dtype"))
    if not names_dtype and "checkpoint_dtype" not in spec.extra:
        checked += (
            " The config names no dtype: transformers 5 loads the other weights in the dtype of "
            "the checkpoint's first floating tensor, which memfit reads from a checkpoint "
            f"folder's safetensors headers; without them the precision given ({w.precision}) "
            "is used."
        )
    rule = "the config's ignore list" if config.ct else "the config and transformers' rule"
    if not path.kernel:
        return [f"{config.label}: {path.why}; its {swapped} {what} ({per}) are traced so, in the "
                f"model's dtype ({w.precision}). Kept unquantized by {rule} "
                f"(modules_to_not_convert): {kept}." + checked]  # fmt: skip
    return [f"{config.label}: {swapped} {what} keep the checkpoint's packed storage "
            f"({per}); {path.why}. Kept in 16-bit by {rule} (modules_to_not_convert): "
            f"{kept}; embeddings and norms stay as they are." + checked]  # fmt: skip


def _against_headers(expected: dict[str, QuantStorage], headers: Any) -> str:
    """The format's storages checked against the checkpoint's safetensors headers (same name,
    dtype and shape), as a sentence for the note; "" without headers. A mismatch is a
    BadInputError naming the tensor: the config does not describe the stored weights."""
    if headers is None:
        return ""
    seen = 0
    for name, s in expected.items():
        stored = headers.tensors.get(name)
        if stored is None:
            continue
        dtype = str(s.dtype).removeprefix("torch.")
        if stored.torch_dtype != dtype or stored.shape != tuple(s.shape):
            raise BadInputError(
                f"{name}: the checkpoint stores {stored.torch_dtype} {list(stored.shape)} "
                f"({stored.file}), but its quantization_config gives {dtype} {list(s.shape)}. "
                "The config does not describe these weights: fix quantization_config."
            )
        seen += 1
    if seen == 0:
        return (
            " No quantized tensor of the checkpoint's headers has these names: the layout is "
            "the config's."
        )
    return (
        f" Each of the {seen} quantized storages of the traced layers matches its safetensors "
        "header in dtype and shape."
    )


def _not_converted(model: torch.nn.Module, config: PrequantizedConfig) -> list[str]:
    from transformers.quantizers.base import HfQuantizer

    skip = None if config.skip is None else list(config.skip)
    hf: Any = model  # a transformers PreTrainedModel (memfit builds it from the config)
    return sorted(HfQuantizer.get_modules_to_not_convert(
        hf, skip, getattr(hf, "_keep_in_fp32_modules", None),
        add_default_skips=config.method == "awq"))  # fmt: skip


def _converts(name: str, keep: list[str]) -> bool:
    from transformers.quantizers.quantizers_utils import should_convert_module

    return bool(should_convert_module(name, keep))


def _storages_of(module: torch.nn.Module, storages: list[QuantStorage], logical: int) -> None:
    for i, s in enumerate(storages):
        p = torch.nn.Parameter(torch.empty(s.shape, dtype=s.dtype), requires_grad=False)
        setattr(p, LOGICAL_NUMEL, logical if i == 0 else 0)
        module.register_parameter(s.name, p)


class PrequantizedLinear(torch.nn.Module):
    """A linear layer holding a pre-quantized checkpoint's storages (fake)."""

    def __init__(self, config: PrequantizedConfig, n: int, k: int,
                 bias: torch.nn.Parameter | None) -> None:  # fmt: skip
        super().__init__()
        self.config, self.out_features, self.in_features = config, n, k
        _storages_of(self, linear_storages(config, n, k), n * k)
        if bias is not None and config.method == "fbgemm_fp8":  # FbgemmFp8Linear: float32
            bias = torch.nn.Parameter(bias.detach().to(torch.float32), requires_grad=False)
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m, n, k = self.config.method, self.out_features, self.in_features
        a = x.reshape(-1, k)  # (M, K)
        if m in ("awq", "gptq"):
            if a.shape[0] >= AWQ_DEQUANT_MIN_ROWS:
                w_dq = torch.empty((k, n), dtype=torch.float16)  # dequantized weight
                out = torch.matmul(a, w_dq.to(a.dtype))
                del w_dq
            else:
                out = a.new_empty((a.shape[0], n))  # fused dequantize-matmul kernel
            if self.bias is not None:
                out = out + self.bias
        elif m == "fp8":
            block_k = self.config.weight_block_size[1] if self.config.weight_block_size else k
            x_q = torch.empty(a.shape, dtype=torch.float8_e4m3fn)  # per-token FP8 input
            x_s = torch.empty((a.shape[0], -(-k // block_k)), dtype=torch.float32)
            out = a.new_empty((a.shape[0], n))
            del x_q, x_s
            if self.bias is not None:
                out.add_(self.bias)
        else:  # fbgemm_fp8
            x_q = torch.empty(a.shape, dtype=torch.float8_e4m3fn)
            x_s = torch.empty((a.shape[0],), dtype=torch.float32)
            out = torch.empty((a.shape[0], n), dtype=torch.bfloat16)
            del x_q, x_s
            if self.bias is not None:
                out = out + self.bias
        return out.reshape(*x.shape[:-1], n)


def _linears(model: torch.nn.Module, config: PrequantizedConfig, keep: list[str],
             path: ForwardPath, expected: dict[str, QuantStorage],
             fake_mode: Any) -> tuple[int, str]:  # fmt: skip
    _refuse_fused_experts(model, config)
    blocks = _gptq_blocks(model, config) if config.method == "gptq" else None
    names = [
        n for n, mod in model.named_modules()
        if type(mod) is torch.nn.Linear and _converts(n, keep)
        and (blocks is None or any(n.startswith(b + ".") for b in blocks))
    ]  # fmt: skip
    for name in names:
        old: Any = model.get_submodule(name)
        for s in linear_storages(config, old.out_features, old.in_features):
            expected[f"{name}.{s.name}"] = s
        if path.kernel:
            with fake_mode:
                new = PrequantizedLinear(config, old.out_features, old.in_features, old.bias)
            model.set_submodule(name, new)
    kinds = sorted({n.rsplit(".", 1)[-1] for n in names})
    per = ", ".join(f"{s.name} {s.dtype} {list(s.shape)}".replace("torch.", "")
                    for s in linear_storages(config, 4096, 4096)) if config.method in (
                        "fp8", "fbgemm_fp8") else _group_text(config)  # fmt: skip
    return len(names), f"{', '.join(kinds)}: {per}"


def _group_text(config: PrequantizedConfig) -> str:
    return (
        f"qweight/qzeros int32, {config.bits} bits in 32, scales float16 per group of "
        f"{config.group_size}" + (", g_idx int32" if config.method == "gptq" else "")
    )


def _gptq_blocks(model: torch.nn.Module, config: PrequantizedConfig) -> list[str]:
    """optimum's GPTQQuantizer converts the linear layers of the repeated blocks only
    (`block_name_to_quantize`, else the block list it finds): the largest ModuleList."""
    raw = config.raw
    import json

    named = json.loads(raw).get("block_name_to_quantize")
    if named:
        return [named] if isinstance(named, str) else list(named)
    lists = [(len(m), n) for n, m in model.named_modules()
             if isinstance(m, torch.nn.ModuleList) and len(m) > 0]  # fmt: skip
    return [max(lists)[1]] if lists else []


def _refuse_fused_experts(model: torch.nn.Module, config: PrequantizedConfig) -> None:
    for name, mod in model.named_modules():
        if name.endswith(".experts") and not isinstance(mod, torch.nn.ModuleList):
            raise BadInputError(
                f"{config.label} on a model with fused experts ({name}, "
                f"{type(mod).__name__}): memfit does not model quantized fused experts for "
                f"{config.method} yet (only MXFP4's GPT-OSS experts). Remove "
                "quantization_config to estimate the 16-bit model."
            )


class Mxfp4MlpStandIn(torch.nn.Module):
    """`Mxfp4GptOssMLP` with its experts' packed storages (fake)."""

    def __init__(self, router: Any, experts: Any) -> None:
        super().__init__()
        self.router: Any = router
        self.experts = torch.nn.Module()
        e, h, i = int(experts.num_experts), int(experts.hidden_size), int(experts.intermediate_size)
        self.num_experts: int = e
        self.hidden: int = h
        self.intermediate: int = i
        logical = e * h * 2 * i
        storages = mxfp4_expert_storages(e, h, i)
        _storages_of(self.experts, storages[:2], logical)
        _storages_of(self.experts, storages[2:], e * h * i)
        for name, n in (("gate_up_proj_bias", 2 * i), ("down_proj_bias", h)):
            p = torch.nn.Parameter(torch.empty((e, n), dtype=torch.float32), requires_grad=False)
            self.experts.register_parameter(name, p)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b = hidden_states.shape[0]
        x = hidden_states.reshape(-1, self.hidden)  # (T, H)
        t, k = x.shape[0], int(self.router.top_k)
        logits = torch.nn.functional.linear(x, self.router.weight, self.router.bias)  # (T, E)
        scores, idx = torch.topk(logits, k, dim=-1)  # routing: (T, k)
        gather = torch.empty((t * k,), dtype=torch.int32)
        scatter = torch.empty((t * k,), dtype=torch.int32)
        inter = x.new_empty((t * k, self.intermediate))  # matmul_ogs + fused SwiGLU
        out = x.new_empty((t, self.hidden))  # scatter matmul_ogs, gammas applied
        del inter, gather, scatter, scores, idx
        return out.reshape(b, -1, self.hidden), logits


def _mxfp4(model: torch.nn.Module, keep: list[str], path: ForwardPath,
           expected: dict[str, QuantStorage], fake_mode: Any) -> tuple[int, str]:  # fmt: skip
    """transformers' `replace_with_mxfp4_linear`: every `GptOssMLP` whose `.experts` is to be
    converted becomes `Mxfp4GptOssMLP` (kernel path only: with `dequantize` it returns the
    model unchanged)."""
    names = [n for n, mod in model.named_modules()
             if type(mod).__name__ == "GptOssMLP" and _converts(f"{n}.experts", keep)]  # fmt: skip
    if not names:
        raise BadInputError(
            "quant_method 'mxfp4': transformers converts only GPT-OSS experts (GptOssMLP), and "
            "this model has none to convert. Remove quantization_config."
        )
    per = 0
    for name in names:
        old: Any = model.get_submodule(name)
        ex = old.experts
        stored = mxfp4_expert_storages(ex.num_experts, ex.hidden_size, ex.intermediate_size)
        expected.update({f"{name}.experts.{s.name}": s for s in stored})
        per = nbytes(stored)
        if path.kernel:
            with fake_mode:
                model.set_submodule(name, Mxfp4MlpStandIn(old.router, old.experts))
    return len(names), f"{per} bytes of blocks and scales each in the checkpoint"


class CtDecompressedLinear(torch.nn.Module):
    """A compressed-tensors layer after its first forward: dense weight, scales kept."""

    def __init__(self, config: PrequantizedConfig, n: int, k: int, dtype: torch.dtype,
                 bias: torch.nn.Parameter | None) -> None:  # fmt: skip
        super().__init__()
        self.out_features, self.in_features = n, k
        _storages_of(self, ct_storages(config, n, k, dtype, decompressed=True), n * k)
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight: Any = self.weight
        return torch.nn.functional.linear(x, weight, self.bias)


def _ct_matches(name: str, ignore: tuple[str, ...]) -> bool:
    """compressed-tensors' `match_name` (utils/match.py): "re:" patterns by `re.match`, else
    the exact module name."""
    return any(re.match(t.removeprefix("re:"), name) if t.startswith("re:") else t == name
               for t in ignore)  # fmt: skip


def _compressed_tensors(
    model: torch.nn.Module, config: PrequantizedConfig, expected: dict[str, QuantStorage],
    fake_mode: Any,
) -> tuple[int, str]:  # fmt: skip
    """Every nn.Linear not ignored (target "Linear") becomes its decompressed self; `expected`
    gets the compressed storages the checkpoint holds."""
    ignore = config.skip or ()
    names = [n for n, mod in model.named_modules()
             if isinstance(mod, torch.nn.Linear) and not _ct_matches(n, ignore)]  # fmt: skip
    load = 0
    for name in names:
        old: Any = model.get_submodule(name)
        dtype = old.weight.dtype
        stored = ct_storages(config, old.out_features, old.in_features, dtype)
        load += nbytes(stored)
        expected.update({f"{name}.{s.name}": s for s in stored})
        with fake_mode:
            new = CtDecompressedLinear(config, old.out_features, old.in_features, dtype, old.bias)
        model.set_submodule(name, new)
    return len(names), f"{load} bytes compressed at load, in the traced layers"


def _bitsandbytes(model: torch.nn.Module, config: PrequantizedConfig, w: Any,
                  fake_mode: Any) -> list[str]:  # fmt: skip
    from memfit.techniques.quantize.config import QuantizeConfig
    from memfit.techniques.quantize.trace import quantize_for_trace

    assert config.bnb is not None
    method, compute = config.bnb
    qc = QuantizeConfig(method=method, compute_dtype=compute, skip=config.skip or ())
    with fake_mode:
        notes = quantize_for_trace(model, qc, fake_mode, w.training)
    return ["bitsandbytes-serialized checkpoint (quantization_config): " + notes[0]]


def layer_kinds(names: list[str]) -> list[str]:
    """Module names with block indices folded ("model.layers.N.mlp")."""
    return sorted({re.sub(r"\.\d+\.", ".N.", n) for n in names})
