"""Quantized linear layers on fake tensors: stand-ins that hold storages of exactly the real
library's layout (`QuantizeConfig.storages`) and whose forward and backward allocate what the
real CUDA code does. The real kernels cannot run on fake tensors (their fake kernels only shape
the output), so each path is written out from the library's source:

- bitsandbytes 4-bit: `nn.Linear4bit.forward` (input cast to the compute dtype, the output back
  to the input's dtype), `autograd._functions.matmul_4bit` / `MatMul4Bit`, and CUDA's
  `gemm_4bit` (backends/cuda/ops.py): past `_GEMM_4BIT_CUSTOM_FLOOR_M` rows the estimate takes
  `_dequant_linear_fallback` (nested absmax dequantized to fp32, plus the offset; the weight
  dequantized to the input's dtype; `F.linear`); bitsandbytes' per-GPU heuristic runs its fused
  kernel (no dequantized weight) for some shapes up to 1536 rows, so there the figure is an
  upper bound. Backward (`MatMul4Bit.backward`): the weight dequantized to the quantization
  dtype, cast to the gradient's dtype, one matmul. peft's LoRA wrapper of a 4-bit layer clones
  the base output (peft/tuners/lora/bnb.py, "defensively clone").
- bitsandbytes LLM.int8 (`MatMul8bitLt`, CUDA kernels): input cast to fp16, row-wise int8
  quantization (with the threshold's outlier mask; no outlier column is assumed: their number
  depends on the data), an int32 matmul dequantized to fp16 then the input's dtype. Backward:
  `CB` copied to the input's dtype and scaled by `SCB / 127`, one matmul.
- torchao weight-only: the ops of the tensor subclass's `F.linear` (Int8Tensor: the int8
  weight cast to the activation dtype, mm, times the row scales; Float8Tensor: `dequantize()`
  then `F.linear`; Int4Tensor: mslk's fused `bf16i4bf16_rowwise`, inference only), run as
  plain ops under autograd as torchao runs them.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.techniques.quantize.config import (
    BNB_INT8_THRESHOLD,
    QuantizeConfig,
    lora_in_fp32,
    prepare_kbit_casts,
    targets,
)
from memfit.workload import Workload

#: bitsandbytes' CUDA `gemm_4bit` runs its own kernel at or below this many rows
#: (backends/cuda/ops.py `_GEMM_4BIT_CUSTOM_FLOOR_M = 4`); above, memfit assumes the
#: dequantize-then-F.linear fallback (always taken past `_gemm_4bit_custom_max_m = 1536`).
GEMM_4BIT_CUSTOM_FLOOR_M = 4
#: Attribute on a stand-in's first storage: the element count of the weight it replaces.
LOGICAL_NUMEL = "_memfit_logical_numel"


def logical_numel(p: torch.Tensor) -> int:
    """Elements a parameter stands for: the original weight's count for the first storage of a
    quantized weight, 0 for its other storages, else its own count."""
    return int(getattr(p, LOGICAL_NUMEL, p.numel()))


class QuantizedLinear(torch.nn.Module):
    """A linear layer whose weight is stored as `config`'s library stores it (fake storages)."""

    def __init__(self, config: QuantizeConfig, n: int, k: int, weight_dtype: torch.dtype,
                 bias: torch.nn.Parameter | None, lora_clone: bool) -> None:  # fmt: skip
        super().__init__()
        self.config, self.out_features, self.in_features = config, n, k
        self.weight_dtype = weight_dtype
        self.names: dict[str, str] = {}
        for i, s in enumerate(config.storages(n, k, weight_dtype)):
            p = torch.nn.Parameter(torch.empty(s.shape, dtype=s.dtype), requires_grad=False)
            setattr(p, LOGICAL_NUMEL, n * k if i == 0 else 0)
            attr = "q_" + s.name.replace(".", "_")
            self.register_parameter(attr, p)
            self.names[s.name] = attr
        self.bias = bias
        self.lora_clone = lora_clone
        self.compute_dtype = getattr(torch, config.compute_dtype) if config.compute_dtype else None

    def storage(self, name: str) -> torch.Tensor:
        return getattr(self, self.names[name])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.config.method
        if m == "int8":
            out = self._bnb_int8(x)
        elif m in ("nf4", "nf4-dq", "fp4"):
            out = self._bnb_4bit(x)
        elif m == "int8-wo":
            out = self._torchao_int8(x)
        elif m == "fp8":
            out = self._torchao_fp8(x)
        else:
            out = self._torchao_int4(x)
        return out.clone() if self.lora_clone else out

    def _cast_bias(self, dtype: torch.dtype) -> None:
        # Linear4bit / Linear8bitLt.forward: `bias.data = bias.data.to(x.dtype)` (kept).
        if self.bias is not None and self.bias.dtype != dtype:
            self.bias.data = self.bias.data.to(dtype)

    def _bnb_4bit(self, x: torch.Tensor) -> torch.Tensor:
        if self.compute_dtype is None and x.dtype in (torch.float32, torch.bfloat16):
            self.compute_dtype = x.dtype  # Linear4bit.set_compute_type, on the first call
        inp_dtype = x.dtype
        if self.compute_dtype is not None:
            x = x.to(self.compute_dtype)
        self._cast_bias(x.dtype)
        out = _Bnb4bitMatmul.apply(x, self.bias, self)
        return out.to(inp_dtype)

    def gemm_4bit(self, a: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """CUDA `gemm_4bit`: the fused kernel's output, or `_dequant_linear_fallback`."""
        if a.numel() // a.shape[-1] <= GEMM_4BIT_CUSTOM_FLOOR_M:
            return a.new_empty((*a.shape[:-1], self.out_features))
        if self.config.method == "nf4-dq":
            absmax_dq = torch.empty(self.storage("absmax").shape, dtype=torch.float32)
            absmax = absmax_dq + self.storage("offset")  # noqa: F841  (alive until return)
        b_dq = torch.empty((self.out_features, self.in_features), dtype=a.dtype)
        return torch.nn.functional.linear(a, b_dq, bias)

    def dequantize_4bit(self, dtype: torch.dtype) -> torch.Tensor:
        """`functional.dequantize_4bit` then `.to(dtype)`, as MatMul4Bit.backward calls it."""
        if self.config.method == "nf4-dq":
            absmax = torch.empty(self.storage("absmax").shape, dtype=torch.float32)
            absmax += self.storage("offset")  # in place, as dequantize_4bit does
        w = torch.empty((self.out_features, self.in_features), dtype=self.weight_dtype)
        return w.to(dtype)

    def _bnb_int8(self, x: torch.Tensor) -> torch.Tensor:
        self._cast_bias(x.dtype)
        return _Bnb8bitMatmul.apply(x, self.bias, self)

    def _torchao_int8(self, x: torch.Tensor) -> torch.Tensor:
        a = x.reshape(-1, x.shape[-1])
        m = torch.mm(a, self.storage("qdata").t().to(x.dtype))  # (M, N)
        y = m * self.storage("scale").to(m.dtype).flatten()
        y = y.reshape(*x.shape[:-1], self.out_features)
        if self.bias is not None:
            y += self.bias
        return y

    def _torchao_fp8(self, x: torch.Tensor) -> torch.Tensor:
        # Float8Tensor.dequantize -> _dequantize_affine_float8: `fp8_tensor` (fp32) is a local,
        # alive through the fp32 product and its cast to the hp dtype (three buffers at once).
        fp8_tensor = self.storage("qdata").to(torch.float32)
        w = (fp8_tensor * self.storage("scale")).to(self.weight_dtype)
        del fp8_tensor
        return torch.nn.functional.linear(x, w.to(x.dtype), self.bias)

    def _torchao_int4(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            raise BadInputError(
                "int4-wo in training: torchao's Int4Tensor runs mslk's fused "
                "bf16i4bf16_rowwise kernel, which has no backward. Use nf4 for QLoRA, or "
                "mode='inference'."
            )
        y = x.new_empty((*x.shape[:-1], self.out_features))
        return y + self.bias if self.bias is not None else y


class _Bnb4bitMatmul(torch.autograd.Function):
    """MatMul4Bit: nothing of the input saved; backward dequantizes the weight again."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, bias: Any, mod: QuantizedLinear) -> torch.Tensor:
        ctx.mod = mod
        return mod.gemm_4bit(a, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        grad_a = None
        if ctx.needs_input_grad[0]:
            grad_a = torch.matmul(grad, ctx.mod.dequantize_4bit(grad.dtype))
        return grad_a, None, None


class _Bnb8bitMatmul(torch.autograd.Function):
    """MatMul8bitLt on CUDA (frozen int8 weight, threshold > 0, no outlier column)."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, bias: Any, mod: QuantizedLinear) -> torch.Tensor:
        shape = a.shape
        a2 = a.reshape(-1, shape[-1])
        ca, sca = _int8_vectorwise_quant(a2.to(torch.float16))
        sub_a = torch.empty(0, dtype=a.dtype)  # int8_mixed_scaled_mm without outliers
        out_i32 = torch.empty((a2.shape[0], mod.out_features), dtype=torch.int32)
        del ca, sca
        out = torch.empty_like(out_i32, dtype=torch.float16)  # int8_mm_dequant (cuda)
        del out_i32
        if bias is not None and bias.dtype != torch.float16:
            out.add_(bias)
        out = out.to(a.dtype)
        ctx.mod, ctx.saved = mod, (sub_a, a2)  # ctx.tensors = (CAt, subA, A)
        ctx.shape, ctx.dtype_a = shape, a.dtype
        return out.reshape(*shape[:-1], mod.out_features)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        grad_a = None
        if ctx.needs_input_grad[0]:
            mod = ctx.mod
            g = grad  # MatMul8bitLt.backward: only a 3-D gradient is reshaped and made contiguous
            if g.dim() == 3:
                g = g.reshape(-1, g.shape[-1]).contiguous()
            cb = mod.storage("CB").to(ctx.dtype_a, copy=True)
            cb.mul_(mod.storage("SCB").unsqueeze(1).mul(1.0 / 127.0))
            grad_a = torch.matmul(g.to(ctx.dtype_a), cb).view(ctx.shape)
        return grad_a, None, None


def _int8_vectorwise_quant(a16: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CUDA `int8_vectorwise_quant` with the LLM.int8 threshold: row stats, int8 rows, and the
    outlier mask's temporaries (`A.abs() >= threshold`, `.any()`, `.any(dim=0)`)."""
    row_stats = torch.empty(a16.shape[0], dtype=torch.float32)
    out_row = torch.empty(a16.shape, dtype=torch.int8)
    outliers = a16.abs() >= BNB_INT8_THRESHOLD
    outliers.any()
    outliers.any(dim=0)
    return out_row, row_stats


def quantize_for_trace(model: torch.nn.Module, config: QuantizeConfig, fake_mode: Any,
                       training: bool) -> list[str]:  # fmt: skip
    """Replace the chosen linear layers of a fake model by `QuantizedLinear`s, in place.
    Returns notes for the estimate (what stayed in full precision and why)."""
    from memfit.techniques.quantize.config import check_layer

    if training and config.method == "int4-wo":
        raise BadInputError(
            "quantize='int4-wo' in training: torchao's Int4Tensor runs mslk's fused "
            "bf16i4bf16_rowwise kernel, which has no backward (and peft has no LoRA for it). "
            "Use quantize='nf4' for QLoRA, or mode='inference'."
        )
    names, keep = targets(model, config)
    lora_bases = {n for n, m in model.named_modules() if hasattr(m, "base_layer")}
    count = 0
    for name in names:
        old: Any = model.get_submodule(name)
        w = old.weight
        n, k = (w.shape[1], w.shape[0]) if type(old).__name__ == "Conv1D" else w.shape
        check_layer(config, name, n, k)
        parent, _, attr = name.rpartition(".")
        is_lora_base = parent in lora_bases and attr == "base_layer"
        bias = old.bias
        if bias is not None:
            bias.requires_grad_(False)
        with fake_mode:
            new = QuantizedLinear(config, n, k, w.dtype, bias,
                                  lora_clone=is_lora_base and config.library == "bitsandbytes"
                                  and config.method != "int8")  # fmt: skip
        new.train(old.training)
        setattr(model.get_submodule(parent) if parent else model, attr, new)
        count += 1
    if count == 0:
        raise BadInputError(
            f"quantize={config.method!r}: no linear layer of the model is quantized (kept in "
            f"full precision: {', '.join(keep) or 'none'}). Drop quantize."
        )
    lora_in_fp32(model, config)
    kinds = sorted({n.replace(".base_layer", "").rsplit(".", 1)[-1] for n in names})
    kept = ", ".join(keep) if keep else "nothing"
    return [
        f"{config.label}: linear layers {', '.join(kinds)} quantized ({config.library}); "
        "kept in full precision by transformers' rule (output embedding, tied weights, last "
        f"module, _keep_in_fp32_modules): {kept}; embeddings and norms are not linear "
        "layers and stay as they are."
    ]


def prepare_quantized(model: torch.nn.Module, w: Workload, fake_mode: Any) -> list[str]:
    """The trace-time preparation of `w.quantize` (and `w.prepare_kbit`) on a fake model, after
    LoRA and the precision cast, as a QLoRA user's model is; returns notes for the estimate."""
    if w.quantize is None:
        return []
    config = QuantizeConfig(method=w.quantize)
    with fake_mode:
        notes = quantize_for_trace(model, config, fake_mode, w.training)
        if w.prepare_kbit:
            cast = prepare_kbit_casts(model, config)
            # By kind, not by count: the repeated blocks are traced a few times and replayed.
            kinds = sorted({re.sub(r"\.\d+\.", ".N.", n) for n in cast})
            notes.append(
                "prepare_kbit: peft's prepare_model_for_kbit_training casts the 16-bit "
                "parameters that are not quantized to float32"
                + (f": {', '.join(kinds)}." if kinds else " (none were 16-bit).")
            )
    return notes
