"""The KV cache of a generation: its size by hand, and finding its storages in a run.

The hand formula (a plain cache: every layer keeps keys and values of every token):

    bytes = 2 (keys and values) x layers x kv_heads x head_dim x tokens x batch x beams x bytes

`kv_heads` is the config's `num_key_value_heads` (grouped-query attention shares one head of keys
and values among `num_attention_heads / num_key_value_heads` query heads); `head_dim` is the
config's `head_dim`, else `hidden_size / num_attention_heads`. A sliding-window layer keeps at
most `sliding_window` tokens (transformers' DynamicSlidingWindowLayer / StaticSlidingWindowLayer).

In a run (estimated or measured) the cache's tensors are found on transformers' `Cache` object:
`watch_cache` wraps the object's `update` and `reorder_cache` so that every tensor a layer holds
after them is filed as `kv_cache`, whether it was made by `torch.cat` (DynamicLayer), allocated
at the maximum length (StaticLayer) or gathered for beam search (`index_select`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.events import Category


@dataclass(frozen=True, kw_only=True)
class KVGeometry:
    """What sizes a model's KV cache, from its config."""

    layers: int
    kv_heads: int
    head_dim: int
    #: Per layer: the window a sliding-window layer keeps, or None (full attention).
    windows: tuple[int | None, ...]

    def tokens_kept(self, layer: int, tokens: int) -> int:
        """Tokens layer `layer` keeps of `tokens` (a sliding window caps it)."""
        window = self.windows[layer]
        return tokens if window is None else min(tokens, window)


def kv_geometry(config: Any) -> KVGeometry:
    """The KV cache geometry of a transformers config (its text config for multimodal ones)."""
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    layers = int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
    types = getattr(config, "layer_types", None) or ["full_attention"] * layers
    window = getattr(config, "sliding_window", None)
    windows = tuple(
        int(window) if (t == "sliding_attention" and window) else None for t in types[:layers]
    )
    return KVGeometry(layers=layers, kv_heads=kv_heads, head_dim=int(head_dim), windows=windows)


def kv_bytes(
    geometry: KVGeometry, *, tokens: int, batch: int, beams: int, dtype_bytes: int
) -> list[int]:
    """Bytes of keys plus values that each layer keeps for `tokens` positions (hand formula)."""
    return [
        2 * geometry.kv_heads * geometry.head_dim * geometry.tokens_kept(i, tokens) * batch
        * beams * dtype_bytes
        for i in range(geometry.layers)
    ]  # fmt: skip


def check_tp(geometry: KVGeometry, tp: int) -> None:
    """Tensor parallelism splits the KV heads over `tp` GPUs: it must divide them."""
    if geometry.kv_heads % tp:
        divisors = [d for d in range(1, geometry.kv_heads + 1) if geometry.kv_heads % d == 0]
        raise BadInputError(
            f"tp={tp} does not divide the model's {geometry.kv_heads} KV heads "
            f"(num_key_value_heads): tensor parallelism gives each GPU whole heads. Use tp in "
            f"{divisors}."
        )


#: Where a quantized layer (transformers' QuantizedLayer) keeps its quantized states.
QUANTIZED_STATES = ("_quantized_keys", "_quantized_values")


def layer_tensors(cache: Any) -> Iterator[tuple[int, torch.Tensor]]:
    """(layer index, tensor) for every tensor the cache's layers hold now: keys and values (a
    quantized layer's full-precision residual) and a quantized layer's quantized states."""
    for i, layer in enumerate(getattr(cache, "layers", ())):
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor):
                yield i, t
        for name in QUANTIZED_STATES:
            for t in state_tensors(getattr(layer, name, None)):
                yield i, t


def state_tensors(state: Any) -> Iterator[torch.Tensor]:
    """The plain tensors behind a quantized state: a tensor subclass's inner tensors
    (`__tensor_flatten__`: quanto's WeightQBitsTensor holds `_data` (a PackedTensor holding
    `_data`), `_scale`, `_shift`), the items of a tuple (HQQ's `(tensor, meta)`), the values
    of a dict (HQQ's meta: scale, zero) or the fields of a dataclass (memfit's
    kv_cache_quantized.EmulatedQBits)."""
    import dataclasses

    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if isinstance(state, torch.Tensor):
        if is_traceable_wrapper_subclass(state):
            names, _ = state.__tensor_flatten__()
            for name in names:
                yield from state_tensors(getattr(state, name))
        else:
            yield state
    elif isinstance(state, (tuple, list)):
        for item in state:
            yield from state_tensors(item)
    elif isinstance(state, dict):
        for item in state.values():
            yield from state_tensors(item)
    elif dataclasses.is_dataclass(state) and not isinstance(state, type):
        for f in dataclasses.fields(state):
            yield from state_tensors(getattr(state, f.name))


def watch_cache(cache: Any, mark: Callable[[torch.Tensor, int], None]) -> Callable[[], None]:
    """Call `mark(tensor, layer)` on every tensor the cache holds after each `update` and
    `reorder_cache` (instance attributes shadow the methods); returns the undo.

    The wrappers hold the cache weakly: a reference cycle would keep its tensors alive until
    the garbage collector runs, not until `generate` drops the cache, and change the run.
    """
    ref = weakref.ref(cache)
    wrapped = []
    for name in ("update", "reorder_cache"):
        function = getattr(type(cache), name, None)
        if function is None or name in vars(cache):
            continue

        def wrapper(*args: Any, _function: Any = function, **kwargs: Any) -> Any:
            obj = ref()
            out = _function(obj, *args, **kwargs)
            for layer, t in layer_tensors(obj):
                mark(t, layer)
            return out

        setattr(cache, name, wrapper)
        wrapped.append(name)

    def undo() -> None:
        obj = ref()
        if obj is not None:
            for name in wrapped:
                vars(obj).pop(name, None)

    return undo


def cache_of(outputs_or_kwargs: Any) -> Any:
    """The transformers Cache in a model call's keyword arguments or outputs, or None.

    transformers 5.24 renamed the argument `past_key_values` to `cache` (generation/utils.py
    `ALL_CACHE_NAMES`; the old name is deprecated until 5.40): both are looked for.
    """
    get = getattr(outputs_or_kwargs, "get", None)
    if get is None:
        return None
    for name in CACHE_ARGUMENTS:
        cache = get(name)
        if hasattr(cache, "layers"):
            return cache
    return None


#: The names a model call gives its cache: transformers >= 5.24, then earlier versions.
CACHE_ARGUMENTS = ("cache", "past_key_values")


class CacheWatcher:
    """Files every tensor of the caches passed to a model as `kv_cache` in a tracker.

    Used by the estimate (on fake tensors) and by `memfit.measure` (real ones) alike, from a
    forward pre-hook on the model that sees the cache in the call's keyword arguments.
    """

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker
        self._undo: weakref.WeakKeyDictionary[Any, Callable[[], None]] = weakref.WeakKeyDictionary()
        #: Storage id -> cache layer index, for every storage filed.
        self.layer_of: dict[int, int] = {}

    def mark(self, t: torch.Tensor, layer: int) -> None:
        sid = self.tracker.sid_of(t)
        # An offloaded layer's host copy stays host memory (estimator.generation.kv_cache_offload).
        host = sid is not None and self.tracker.records[sid].host
        self.tracker.mark(t, Category.KV_CACHE, host=host)
        if sid is not None:
            self.layer_of[sid] = layer

    def see(self, kwargs: Any) -> None:
        cache = cache_of(kwargs)
        if cache is None or cache in self._undo:
            return
        self._undo[cache] = watch_cache(cache, self.mark)
        for layer, t in layer_tensors(cache):
            self.mark(t, layer)

    def close(self) -> None:
        for undo in list(self._undo.values()):
            undo()
        self._undo.clear()
