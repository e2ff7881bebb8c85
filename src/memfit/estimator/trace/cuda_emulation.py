"""Make CPU fake tensors take the code paths CUDA would take: autocast policy and SDPA kernel.

`torch.autocast("cuda")` has no effect on CPU tensors, and CPU autocast uses other op lists (for
instance CPU autocast leaves `layer_norm` and `softmax` in 16 bits, CUDA runs them in fp32). So the
tracer runs the model under `CudaEmulation`, a TorchFunctionMode that sits above autograd, like the
real Autocast dispatch key, and casts arguments by CUDA's policy (ATen/autocast_mode.h:
AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE, AT_FORALL_PROMOTE).
Casts are recorded by autograd exactly as CUDA autocast records them.

The weight-cast cache is emulated too (autocast_mode.cpp `cached_cast`): a cast to the low dtype
of an fp32 leaf that requires grad and is not a view is kept until the autocast region ends, so
every cast weight stays alive for the whole forward.

Limitations (written down, not hidden): the policy is applied to torch-level calls seen by a
TorchFunctionMode (F.linear, torch.matmul, Tensor.softmax, F.layer_norm, ...). C++ composite ops
that are called directly from C++ (not from Python) are not re-dispatched through the policy;
`cross_entropy`, the composite that matters for memory, is handled by name (its log_softmax in
the logits' dtype, its nll_loss in fp32, as ATen's composite meets CUDA's policy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from memfit.estimator.trace.attention import choose_backend, describe_call, run_sdpa

# ATen/autocast_mode.h, AT_FORALL_LOWER_PRECISION_FP (CUDA list), by Python-level name.
LOWER_PRECISION_OPS = frozenset(
    {
        "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
        "conv_transpose2d", "conv_transpose3d", "convolution", "prelu", "addmm", "addmv",
        "addr", "matmul", "__matmul__", "__rmatmul__", "einsum", "mm", "mv", "linalg_vecdot",
        "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "lstm_cell",
        "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    }
)  # fmt: skip

# ATen/autocast_mode.h, AT_FORALL_FP32 (CUDA list), plus the loss composites that reach
# nll_loss / log_softmax inside C++ (cross_entropy).
FP32_OPS = frozenset(
    {
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
        "reciprocal", "rsqrt", "sinh", "tan", "pow", "__pow__", "softplus", "layer_norm",
        "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm", "nuclear_norm",
        "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss",
        "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss",
        "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
        "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
        "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
        "interpolate",
    }
)  # fmt: skip

# AT_FORALL_FP32_SET_OPT_DTYPE: run in fp32 by passing dtype=float32 when the input is 16-bit.
FP32_SET_OPT_DTYPE_OPS = frozenset(
    {"prod", "softmax", "log_softmax", "cumprod", "cumsum", "sum", "linalg_vector_norm"}
)

# AT_FORALL_PROMOTE: cast every floating argument to the widest floating type among them.
PROMOTE_OPS = frozenset(
    {"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
     "index_put", "tensordot", "scatter_add", "cat", "stack"}
)  # fmt: skip

_SDPA_NAMES = frozenset({"scaled_dot_product_attention"})


def fused_dropout(args: Any, kwargs: Any) -> torch.Tensor | None:
    """`F.dropout` as CUDA runs it in training, or None where CUDA takes the CPU path too.

    ATen Dropout.cpp `dropout`: on CUDA, `is_fused_kernel_acceptable` (a CUDA input, 0 < p < 1,
    not empty) sends training dropout to `native_dropout`, which returns the output and a
    bool mask, and autograd saves the 1-byte mask (`native_dropout_backward(grad, mask,
    scale)`). On CPU the same call takes `_dropout_impl`: a noise tensor of the input's dtype
    (`empty_like(input).bernoulli_(1 - p).div_(1 - p)`) saved by `input * noise`, two or four
    bytes per element instead of one. In-place dropout keeps PyTorch's path.
    """
    names = ("input", "p", "training", "inplace")
    bound = dict(zip(names, args, strict=False))
    bound.update(kwargs)
    x, p = bound.get("input"), float(bound.get("p", 0.5))
    if not bound.get("training", True) or bound.get("inplace", False) or not 0.0 < p < 1.0:
        return None
    if not isinstance(x, torch.Tensor) or not _eligible(x) or x.numel() == 0:
        return None
    return torch.native_dropout(x, p, True)[0]


def _eligible(t: object) -> bool:
    # autocast_mode.h is_eligible: a defined floating tensor that is not float64.
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


class CudaEmulation(TorchFunctionMode):
    """TorchFunctionMode that applies CUDA autocast (when `dtype` is set) and CUDA SDPA choice.

    Args:
        dtype: the autocast dtype (torch.float16 / torch.bfloat16), or None for no autocast.
        capability: compute capability of the target GPU, or None (Ampere assumed).
        enabled: called on every op; autocast casts only while it returns True (the tracer
            says True during forward and during checkpoint recomputation).
        on_attention: called with the backend name of each SDPA call (for reports and tests).
    """

    def __init__(
        self,
        *,
        dtype: torch.dtype | None,
        capability: tuple[int, int] | None,
        enabled: Callable[[], bool] = lambda: True,
        on_attention: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__()
        self.dtype = dtype
        self.capability = capability
        self.enabled = enabled
        self.on_attention = on_attention
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def clear_cache(self) -> None:
        """End of an autocast region: cast weights are released (autocast clear_cache)."""
        self._cache.clear()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        autocast_on = self.dtype is not None and self.enabled()
        if name in _SDPA_NAMES:
            return self._sdpa(args, kwargs, autocast_on)
        if name == "dropout" and (fused := fused_dropout(args, kwargs)) is not None:
            return fused
        if not autocast_on:
            return func(*args, **kwargs)
        if name == "cross_entropy":
            return self._cross_entropy(args, kwargs)
        assert self.dtype is not None
        if name in LOWER_PRECISION_OPS:
            args, kwargs = self._cast_all(args, kwargs, self.dtype)
        elif name in FP32_OPS:
            args, kwargs = self._cast_all(args, kwargs, torch.float32)
        elif name in FP32_SET_OPT_DTYPE_OPS:
            return self._fp32_set_opt_dtype(func, name, args, kwargs)
        elif name in PROMOTE_OPS:
            args, kwargs = self._promote(args, kwargs)
        return func(*args, **kwargs)

    # -- policies ---------------------------------------------------------------------------

    def _cast(self, t: Any, dtype: torch.dtype) -> Any:
        if not _eligible(t) or t.dtype == dtype:
            return t
        cacheable = (
            dtype == self.dtype
            and t.dtype == torch.float32
            and t.requires_grad
            and t.is_leaf
            and not t._is_view()
        )
        if cacheable:
            hit = self._cache.get(id(t))
            if hit is not None and hit[0] is t:
                return hit[1]
            out = t.to(dtype)
            # Keep `t` in the entry so that id(t) cannot be reused by another tensor.
            self._cache[id(t)] = (t, out)
            return out
        return t.to(dtype)

    def _cast_all(self, args: Any, kwargs: Any, dtype: torch.dtype) -> tuple[Any, Any]:
        cast = lambda t: self._cast(t, dtype)  # noqa: E731
        return pytree.tree_map(cast, args), pytree.tree_map(cast, kwargs)

    def _promote(self, args: Any, kwargs: Any) -> tuple[Any, Any]:
        dtypes = [t.dtype for t in pytree.tree_leaves((args, kwargs)) if _eligible(t)]
        if not dtypes:
            return args, kwargs
        widest = dtypes[0]
        for d in dtypes[1:]:
            widest = torch.promote_types(widest, d)
        return self._cast_all(args, kwargs, widest)

    def _fp32_set_opt_dtype(self, func, name: str, args: Any, kwargs: Any):
        first = args[0] if args else None
        if not isinstance(first, torch.Tensor) or not _eligible(first):
            return func(*args, **kwargs)
        if first.dtype == torch.float32 or kwargs.get("dtype"):
            return func(*args, **kwargs)
        if name in ("softmax", "log_softmax") and first.dtype == torch.float16:
            # ATen softmax/log_softmax: a CUDA half input with dtype=float runs the kernel with
            # half_to_float=True, producing fp32 output without an fp32 copy of the input.
            dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
            if dim is not None:
                op = torch.ops.aten._softmax if name == "softmax" else torch.ops.aten._log_softmax
                return op(first, dim, True)
        kwargs = dict(kwargs)
        kwargs["dtype"] = torch.float32
        return func(*args, **kwargs)

    def _cross_entropy(self, args: Any, kwargs: Any) -> torch.Tensor:
        # cross_entropy_loss is a C++ composite with no AutocastCUDA kernel (only AutocastCPU
        # registers it), so on CUDA its inner calls meet the policy one by one. ATen
        # LossNLL.cpp cross_entropy_loss_symint calls `at::log_softmax(self, class_dim,
        # self.scalar_type())`: the dtype is set, and fp32_set_opt_dtype leaves a set dtype
        # alone, so log_softmax runs in the logits' 16-bit dtype (and saves that result). Its
        # `nll_loss` is on the fp32 list: the 16-bit log-probabilities are cast to fp32, and
        # NllLossBackward0 saves that copy. Backward then makes an fp32 nll gradient, casts it
        # back, and _log_softmax_backward_data runs in 16 bits.
        names = ("input", "target", "weight", "size_average", "ignore_index", "reduce")
        bound = dict(zip(names, args, strict=False))
        bound.update(kwargs)
        logits, target = bound["input"], bound["target"]
        smoothing = bound.get("label_smoothing", 0.0)
        if target.is_floating_point() or smoothing:
            # Probabilities as targets or label smoothing: keep PyTorch's own composite, in fp32.
            args, kwargs = self._cast_all(args, kwargs, torch.float32)
            return torch.nn.functional.cross_entropy(*args, **kwargs)
        dim = 1 if logits.dim() > 1 else 0
        lsm = torch.log_softmax(logits, dim, dtype=logits.dtype)
        weight = bound.get("weight")
        return torch.nn.functional.nll_loss(
            self._cast(lsm, torch.float32),
            target,
            weight=None if weight is None else self._cast(weight, torch.float32),
            ignore_index=bound.get("ignore_index", -100),
            reduction=bound.get("reduction", "mean"),
        )

    def _sdpa(self, args: Any, kwargs: Any, autocast_on: bool) -> torch.Tensor:
        if autocast_on:
            args, kwargs = self._cast_all(args, kwargs, self.dtype)  # type: ignore[arg-type]
        call, bound = describe_call(tuple(args), dict(kwargs))
        backend = choose_backend(call, self.capability)
        if self.on_attention is not None:
            self.on_attention(backend)
        return run_sdpa(backend, **bound)
