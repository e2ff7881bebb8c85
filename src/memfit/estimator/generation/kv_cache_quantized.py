"""`cache="quantized"`: transformers' QuantizedCache with the quanto backend, its layout emulated.

transformers 5's `generate(cache_implementation="quantized")` builds `QuantizedCache(backend=
"quanto", config=...)` (generation/utils.py `_prepare_cache_for_generation`; `cache_config`
unset), whose layers are `QuantoQuantizedLayer(nbits=4, axis_key=0, axis_value=0,
q_group_size=64, residual_length=128)` (cache_utils.py). The layer's `update` (QuantizedLayer's,
run as it is during the trace) keeps:

- the prompt quantized at the first update (nothing in full precision);
- a full-precision residual (`keys`, `values`) that grows by `torch.cat` each decode step;
- at each update, the quantized states dequantized and concatenated with the residual and the
  new token (`keys_to_return`, full precision, the whole context: a temporary of every step);
- when the residual would reach `residual_length` tokens, everything re-quantized from
  `keys_to_return` and the residual emptied (every 128 decode steps).

optimum-quanto's quantize cannot run on fake tensors as it runs on real ones (its
`WeightQBitsTensor.__init__` packs only `type(data) is torch.Tensor`, never a FakeTensor), so
`EmulatedQuantoLayer` replaces the backend's `_quantize`/`_dequantize` with quanto 0.2.7's own
arithmetic as plain tensor ops, allocation for allocation as it runs on CUDA:

- `MaxOptimizer`: the tensor grouped (`group`: a view for axis 0), `amin`, `amax`, `scale =
  (rmax - rmin) / (qmax - qmin)`, `shift = -rmin`, each (groups, 1) in the tensor's dtype;
- `quantize_affine`: `round((base + shift) / scale)`, `clamp(0, 2**nbits - 1)`, `.to(uint8)`;
- `PackedTensor.pack` (`pack_weights`): a zeroed uint8 buffer of `ceil(groups / (8 // nbits))`
  rows of `q_group_size` bytes, or-ed with each shifted slice;
- `dequantize`: `quanto::unpack` (on CUDA one uint8 output, `8 // nbits` times the packed rows),
  `scale * data`, `-= shift`, ungrouped (a view for axis 0).

So one quantized tensor of E values holds `ceil(E / group / (8 // nbits)) * group` packed bytes
plus two (E / group)-element tensors in the cache's dtype (scale and shift): `quantized_bytes`.
`tests/estimator/test_generation_quantized.py` checks this layout against the real quanto
tensors (where optimum-quanto is installed) and the whole trace against a real `generate`
measured on CPU by memfit.measure.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.estimator.generation.kv_cache import KVGeometry

#: QuantoQuantizedLayer's defaults in transformers 5 (what generate builds without cache_config).
NBITS = 4
Q_GROUP_SIZE = 64
RESIDUAL_LENGTH = 128
AXIS = 0


@dataclass(eq=False)
class EmulatedQBits:
    """A quantized key or value tensor as quanto's WeightQBitsTensor holds it (its three
    storages: `_data._data`, `_scale`, `_shift`), and what dequantizing it needs. Its
    attributes are released in this order when it is dropped, as a WeightQBitsTensor's."""

    data: torch.Tensor  # packed uint8, (ceil(groups / (8 // nbits)), group) for axis 0
    scale: torch.Tensor  # (groups, 1), the tensor's dtype
    shift: torch.Tensor  # (groups, 1), the tensor's dtype
    rows: int  # rows of the grouped tensor (groups for axis 0, the group size for axis -1)
    shape: torch.Size
    axis: int
    nbits: int


def _group(base: torch.Tensor, axis: int, group_size: int) -> torch.Tensor:
    """optimum.quanto.tensor.grouped.group, with its error as a BadInputError."""
    axis_dim = base.shape[axis]
    axis_numel = base.numel() // axis_dim
    if group_size > axis_numel or axis_numel % group_size != 0:
        raise BadInputError(
            f"the quantized cache (quanto, q_group_size={group_size}) quantizes each row of "
            f"{axis_numel} values (kv_heads x positions x head_dim) in groups of {group_size}, "
            f"and {axis_numel} is not a multiple of {group_size}: quanto raises 'Group size "
            f"must be a divisor'. Use a prompt_len for which kv_heads x prompt_len x head_dim "
            "is a multiple of 64, or cache='dynamic'."
        )
    if axis == 0:
        return base.reshape([-1, group_size])
    grouped = base.reshape((axis_numel // group_size, group_size, axis_dim)).permute(1, 2, 0)
    return grouped.reshape(group_size, axis_dim * (axis_numel // group_size))


def quantize(tensor: torch.Tensor, axis: int, nbits: int, group_size: int) -> EmulatedQBits:
    """quanto's `MaxOptimizer()(t, qint{nbits}, axis, group)` then `quantize_weight`, as the
    same tensor ops (see the module docstring)."""
    base = _group(tensor, axis, group_size)
    opt_axis: int | None = None if base.shape[axis] == 1 else axis
    dim = [1] if opt_axis == 0 else [0]
    rmin = torch.amin(base, dim=dim, keepdim=True)
    rmax = torch.amax(base, dim=dim, keepdim=True)
    qmin, qmax = -(2 ** (nbits - 1)), 2 ** (nbits - 1) - 1
    scale = (rmax - rmin) / (qmax - qmin)
    shift = -rmin
    del rmin, rmax
    # quanto::quantize_affine (its "default" Python kernel, on CUDA too)
    grouped = _group(tensor, axis, group_size)
    data = torch.round((grouped + shift) / scale)
    ints = torch.clamp(data, min=0, max=2**nbits - 1).to(torch.uint8)
    del data, grouped
    # PackedTensor.pack -> pack_weights
    per_byte = 8 // nbits
    rows = ints.shape[0]
    row_dim = (rows + per_byte - 1) // per_byte
    packed = torch.zeros((row_dim, *ints.shape[1:]), device=ints.device, dtype=torch.uint8)
    for i in range(min(per_byte, rows // row_dim + 1)):
        start, end = i * row_dim, min(i * row_dim + row_dim, rows)
        packed[: end - start] |= ints[start:end] << (nbits * i)
    del ints
    return EmulatedQBits(packed, scale, shift, rows, tensor.shape, axis, nbits)


def unpack(packed: torch.Tensor, nbits: int) -> torch.Tensor:
    """`quanto::unpack` as its CUDA kernel runs it (library/extensions/cuda/unpack.cu): one
    uint8 output of `8 // nbits` times the packed rows (its values are not needed here). The
    CPU kernel (extensions/cpp/unpack.cpp) makes a masked and a shifted copy of each part and
    concatenates them: the one difference between this trace and a CPU measurement."""
    rows = packed.shape[0] * (8 // nbits)
    return torch.empty((rows, *packed.shape[1:]), dtype=torch.uint8, device=packed.device)


def dequantize(q: EmulatedQBits) -> torch.Tensor:
    """QBitsDequantizer.forward: `quanto::unpack` (one output on CUDA), `scale * data`,
    `-= shift`, ungrouped."""
    data = unpack(q.data, q.nbits)[: q.rows]  # PackedTensor.unpack: the grouped tensor's rows
    dqt = q.scale * data
    dqt -= q.shift
    if q.axis == 0:
        return dqt.reshape(q.shape)
    group_size = dqt.shape[0]
    axis_dim = q.shape[q.axis]
    ungrouped = dqt.reshape(group_size, axis_dim, dqt.numel() // axis_dim // group_size)
    return ungrouped.permute(2, 0, 1).reshape(q.shape)


def quantized_bytes(numel: int, *, dtype_bytes: int, nbits: int = NBITS,
                    group_size: int = Q_GROUP_SIZE) -> tuple[int, int]:  # fmt: skip
    """(packed bytes, scale bytes) of one quantized tensor of `numel` values (axis 0); the shift
    has the scale's bytes."""
    groups = numel // group_size
    per_byte = 8 // nbits
    return (groups + per_byte - 1) // per_byte * group_size, groups * dtype_bytes


def quantized_split(
    tokens: int, prompt: int, residual_length: int = RESIDUAL_LENGTH
) -> tuple[int, int]:
    """(quantized positions, full-precision residual positions) of a layer holding `tokens`
    positions after a prefill of `prompt`: QuantizedLayer.update quantizes the prompt, then
    flushes the residual into the quantized states when it would reach `residual_length`."""
    steps = tokens - prompt
    return prompt + residual_length * (steps // residual_length), steps % residual_length


def check_quantized(geometry: KVGeometry | None, num_beams: int) -> None:
    """What transformers' QuantizedCache refuses, before tracing (value and fix)."""
    del num_beams  # QuantizedLayer.reorder_cache defers beam reordering: beams are supported
    if geometry is not None and any(w is not None for w in geometry.windows):
        raise BadInputError(
            "cache='quantized' needs a model whose layers all use full attention; this one has "
            "sliding-window layers (layer_types 'sliding_attention'), and transformers' "
            "QuantizedCache raises 'only supported for models with only full attention "
            "layers'. Use cache='dynamic' or cache='static'."
        )


@contextlib.contextmanager
def emulated() -> Iterator[None]:
    """`QuantizedCache(backend="quanto")` builds `EmulatedQuantoLayer`s while inside (in place of
    transformers' QuantoQuantizedLayer, which needs optimum-quanto installed): a
    QuantizedLayer (transformers' update, residual and beam reordering, run as they are) whose
    `_quantize`/`_dequantize` are quanto's arithmetic on plain tensors (this module)."""
    import transformers.cache_utils as cu

    class Layer(cu.QuantizedLayer):
        def __init__(self, nbits: int = NBITS, axis_key: int = AXIS, axis_value: int = AXIS,
                     q_group_size: int = Q_GROUP_SIZE,
                     residual_length: int = RESIDUAL_LENGTH) -> None:  # fmt: skip
            super().__init__(
                nbits=nbits, axis_key=axis_key, axis_value=axis_value,
                q_group_size=q_group_size, residual_length=residual_length,
            )  # fmt: skip
            # QuantoQuantizedLayer's own checks
            if self.nbits not in (2, 4):
                raise ValueError(f"`nbits` for `quanto` backend has to be 2 or 4, not {nbits}")
            for name in ("axis_key", "axis_value"):
                if getattr(self, name) not in (0, -1):
                    raise ValueError(f"`{name}` for `quanto` backend has to be 0 or -1")

        def _quantize(self, tensor: torch.Tensor, axis: int) -> EmulatedQBits:  # type: ignore[override]
            return quantize(tensor, axis, self.nbits, self.q_group_size)

        def _dequantize(self, q_tensor: Any) -> torch.Tensor:
            return dequantize(q_tensor)

    Layer.__name__ = Layer.__qualname__ = "EmulatedQuantoLayer"
    original = cu.QuantoQuantizedLayer
    # Looked up by QuantizedCache.__init__ at call time.
    setattr(cu, "QuantoQuantizedLayer", Layer)  # noqa: B010
    try:
        yield
    finally:
        setattr(cu, "QuantoQuantizedLayer", original)  # noqa: B010
