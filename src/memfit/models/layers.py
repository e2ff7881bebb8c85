"""The layers of a transformers model built from a config: shortened consistently, compared.

memfit traces 3 of a model's N repeated layers and replays the middle one N - 3 times
(memfit.estimator.trace.block_replay). Two things make that honest for the configs transformers
writes:

- **Shortening.** A config describes its layers one by one in fields of their own, which
  transformers checks against `num_hidden_layers`: one entry per layer (`layer_types`,
  `mlp_layer_types`, `no_rope_layers`, `layers_block_type`, ...), a list of layer indices
  (`mlp_only_layers`, `moe_layers`, `attn_layer_indices`, ...: `INDEX_FIELDS`), or overrides keyed
  by layer index (`per_layer_config`). A model of k layers gets the entries of the first k,
  read from the full config as transformers completed it (a `layer_types` it derived from
  `sliding_window_pattern` or `max_window_layers` included), so its layers are exactly the full
  model's first k (`shortened_fields`). Patterns given as a period (`decoder_sparse_step`,
  `first_k_dense_replace`, `attn_layer_period`) are by layer index, so they hold as they are.
- **Alikeness.** The replay copies one traced layer, so every layer must be alike
  (`layers_differ`): the per-layer fields give every layer the same entry, and the modules
  transformers builds for the full model (on the meta device, no memory) are alike layer by
  layer: classes, parameter shapes, and the settings a layer keeps (its attention type, sliding
  window, whether it has rotary embeddings). Full and sliding attention layers, or MoE and dense
  MLPs, that alternate make a model that is traced whole: exact, and slower.

Known limit: only the top-level config's layers are shortened; a model whose layers are
counted in a nested config (a multimodal model's `text_config`) is traced whole.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "INDEX_FIELDS",
    "LayerUnits",
    "config_differences",
    "layer_paths",
    "module_differences",
    "replay_units",
    "shortened_fields",
    "unit_layer_paths",
]

#: Config fields that list layer indices (a layer is in the list or not), from transformers'
#: configuration files: Qwen2-MoE/Qwen3-MoE/Qwen3-Next `mlp_only_layers`, Llama 4 `moe_layers`,
#: Bamba `attn_layer_indices`, LFM2 `full_attn_idxs`, Zamba2 `hybrid_layer_ids`, Inkling
#: `local_layer_ids`, Mllama `cross_attention_layers`, Qwen4 `ple_layer_ids`.
INDEX_FIELDS = (
    "mlp_only_layers",
    "moe_layers",
    "attn_layer_indices",
    "full_attn_idxs",
    "hybrid_layer_ids",
    "local_layer_ids",
    "cross_attention_layers",
    "ple_layer_ids",
)

#: transformers' per-layer overrides (integrations/heterogeneity): {"<layer index>": {...}}.
PER_LAYER_CONFIG = "per_layer_config"

#: Attributes a layer's modules keep that name the layer itself, not what it does (its index;
#: BigBird's random-attention seed is its index too): left out when layers are compared.
INDEX_ATTRIBUTES = frozenset({"layer_idx", "layer_id", "layer_index", "layer_number", "seed"})


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def _per_layer_lists(config: Mapping[str, Any], n: int) -> dict[str, list[Any]]:
    """The top-level fields of `config` holding one scalar entry per layer (a list of `n`).

    Token ids are never per layer (`eos_token_id` may be a list of any length)."""
    return {
        k: list(v)
        for k, v in config.items()
        if isinstance(v, (list, tuple))
        and len(v) == n
        and k not in INDEX_FIELDS
        and not k.endswith(("token_id", "token_ids"))
        and all(_scalar(x) for x in v)
    }


def shortened_fields(
    fields: Mapping[str, Any], key: str, full: Mapping[str, Any], n: int, k: int
) -> dict[str, Any]:
    """The config fields of the model of the first `k` of `n` layers.

    `fields` are the fields given (a config.json's); `full` is the full config as transformers
    completed it (`PreTrainedConfig.to_dict()`), whose per-layer fields may be derived ones.
    `key` is the field counting the layers (`num_hidden_layers`, `n_layer`, ...).
    """
    out = dict(fields)
    out[key] = k
    for name, values in _per_layer_lists(full, n).items():
        out[name] = values[:k]
    for name in INDEX_FIELDS:
        value = full.get(name)
        if isinstance(value, (list, tuple)):
            out[name] = [i for i in value if isinstance(i, int) and i < k]
    overrides = full.get(PER_LAYER_CONFIG)
    if isinstance(overrides, Mapping) and overrides:
        out[PER_LAYER_CONFIG] = {i: v for i, v in overrides.items() if int(i) < k}
    return out


def config_differences(full: Mapping[str, Any], n: int) -> str | None:
    """Why the config gives its `n` layers different behaviour, or None when it does not.

    A per-layer list whose entries are all equal, or each the layer's own index (Mistral
    Large 4's `kv_source_layers` of a model whose layers each keep their own cache), says
    nothing that differs; a list of layer indices that names none or all of them neither."""
    for name, values in _per_layer_lists(full, n).items():
        if len(set(map(repr, values))) > 1 and values != list(range(n)):
            counts = Counter(map(repr, values))
            return f"{name}: " + ", ".join(f"{c} x {v}" for v, c in counts.most_common())
    for name in INDEX_FIELDS:
        value = full.get(name)
        if isinstance(value, (list, tuple)):
            chosen = sorted({i for i in value if isinstance(i, int) and 0 <= i < n})
            if chosen and len(chosen) < n:
                shown = ", ".join(map(str, chosen[:8])) + (", ..." if len(chosen) > 8 else "")
                return f"{name} names {len(chosen)} of the {n} layers ([{shown}])"
    overrides = full.get(PER_LAYER_CONFIG)
    if isinstance(overrides, Mapping) and overrides:
        return f"{PER_LAYER_CONFIG} overrides layers {sorted(overrides)[:8]}"
    return None


def _layer_stack(model: torch.nn.Module, n: int) -> list[torch.nn.Module] | None:
    """The model's stack of `n` layers: its nn.ModuleList (or nn.Sequential) of `n` children
    holding the most parameters; None when it has none."""
    paths = layer_paths(model, n)
    return None if paths is None else [model.get_submodule(p) for p in paths]


def layer_paths(model: torch.nn.Module, n: int) -> list[str] | None:
    """Module paths of the model's stack of `n` layers (as `_layer_stack` finds it), or None."""
    best: list[str] | None = None
    best_params = -1
    for name, mod in model.named_modules():
        if isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential)) and len(mod) == n:
            count = sum(p.numel() for p in mod.parameters())
            if count > best_params:
                prefix = name + "." if name else ""
                best, best_params = [prefix + c for c, _ in mod.named_children()], count
    return best


def unit_layer_paths(
    model: torch.nn.Module, units: LayerUnits | None, count: int | None
) -> list[str] | None:
    """For a model replayed by units of layers, built with the first `count` units (None: all),
    the paths of its layers: the tracer files events by layer, and
    memfit.estimator.trace.block_replay.by_units then by unit. None without units (the blocks are
    then the
    model's stack of identical modules, memfit.models.structure.find_repeated_blocks)."""
    if units is None:
        return None
    return layer_paths(model, units.layers if count is None else units.layers_of(count))


def _layer_signature(layer: torch.nn.Module) -> tuple[Any, ...]:
    """What a layer is, less its index: each module's class, parameters and buffers (shape,
    dtype) and the settings it keeps (int, bool, str or None attributes; floats are numerical
    constants, such as DiffLlama's per-layer lambda, which change no size)."""
    out = []
    for name, mod in layer.named_modules():
        tensors = tuple(
            (t_name, tuple(t.shape), t.dtype)
            for t_name, t in (*mod._parameters.items(), *mod._buffers.items())
            if t is not None
        )
        settings = tuple(
            sorted(
                (a, v)
                for a, v in vars(mod).items()
                if not a.startswith("_")
                and a not in INDEX_ATTRIBUTES
                and a != "training"
                and (v is None or isinstance(v, (bool, int, str)))
            )
        )
        out.append((name, type(mod).__name__, tensors, settings))
    return tuple(out)


def module_differences(model: torch.nn.Module, n: int) -> str | None:
    """Why the `n` layers of `model` (built whole) are not alike, or None when they are (or
    when the model has no stack of `n` layers to compare)."""
    stack = _layer_stack(model, n)
    if stack is None:
        return None
    first = _layer_signature(stack[0])
    for i, layer in enumerate(stack[1:], start=1):
        sig = _layer_signature(layer)
        if sig != first:
            return f"layer {i} differs from layer 0 ({_first_difference(first, sig)})"
    return None


def _first_difference(a: tuple[Any, ...], b: tuple[Any, ...]) -> str:
    """The first module in which two layer signatures differ, and how."""
    for (name_a, cls_a, t_a, s_a), (name_b, cls_b, t_b, s_b) in zip(a, b, strict=False):
        if (name_a, cls_a) != (name_b, cls_b):
            return f"{name_a or 'the layer'} is {cls_a}, {name_b or 'the layer'} is {cls_b}"
        if t_a != t_b:
            return f"{name_a or 'the layer'} has other parameters"
        if s_a != s_b:
            attr = sorted({k for k, _ in set(s_a) ^ set(s_b)})[0]
            return f"{name_a}.{attr}" if name_a else f"the layer's {attr}"
    return "another number of modules"


@dataclass(frozen=True)
class LayerUnits:
    """How a stack of `layers` layers is cut into the units memfit replays: unit 0 is the first
    `head` layers, every later unit the next `period` layers, and the later units are alike
    (each holds the same kinds of layers in the same order). A stack of alike layers is
    `LayerUnits(n, 1, 1)`: one layer a unit."""

    layers: int
    head: int
    period: int

    @property
    def count(self) -> int:
        """Units in the whole stack."""
        return 1 + (self.layers - self.head) // self.period

    @property
    def alike(self) -> bool:
        """One layer a unit: every layer alike (or only the first one differs)."""
        return self.head == 1 and self.period == 1

    def layers_of(self, units: int) -> int:
        """Layers of a stack of the first `units` units."""
        return self.head + (units - 1) * self.period

    def unit_of(self, layer: int) -> int:
        """The unit layer `layer` belongs to."""
        return 0 if layer < self.head else 1 + (layer - self.head) // self.period


#: A replay traces 3 units and checks them against 4 (memfit.estimator.trace.block_replay): a stack
#: of
#: fewer units is traced whole.
_FEWEST_UNITS = 5


def _kinds(full: Mapping[str, Any], n: int, model: torch.nn.Module) -> list[Any] | None:
    """What each of the `n` layers is: its entries in the config's per-layer fields and its
    modules' signature; None when the model has no stack of `n` layers to compare."""
    stack = _layer_stack(model, n)
    if stack is None:
        return None
    lists = [v for v in _per_layer_lists(full, n).values() if v != list(range(n))]
    chosen = [
        {i for i in v if isinstance(i, int)}
        for v in (full.get(name) for name in INDEX_FIELDS)
        if isinstance(v, (list, tuple))
    ]
    raw = full.get(PER_LAYER_CONFIG)
    overrides = {int(i): repr(v) for i, v in raw.items()} if isinstance(raw, Mapping) else {}
    return [
        (
            tuple(repr(v[i]) for v in lists),
            tuple(i in c for c in chosen),
            overrides.get(i),
            _layer_signature(layer),
        )
        for i, layer in enumerate(stack)
    ]


def _units(kinds: list[Any]) -> LayerUnits | None:
    """The cheapest cut of the layers into units (fewest layers in the two short traces, of 3
    and 4 units), or None when no cut gives `_FEWEST_UNITS` units for fewer layers traced
    than the stack holds."""
    n = len(kinds)
    best: LayerUnits | None = None
    for period in range(1, n // _FEWEST_UNITS + 1):
        start = n - period  # the periodic part is kinds[start:], as far back as it goes
        while start > 0 and kinds[start - 1] == kinds[start - 1 + period]:
            start -= 1
        head = start + (n - start) % period or period
        units = LayerUnits(n, head, period)
        traced = 2 * head + 5 * period
        if units.count < _FEWEST_UNITS or (not units.alike and traced >= n):
            continue
        if best is None or traced < 2 * best.head + 5 * best.period:
            best = units
    return best


#: key -> replay_units' answer, for this process.
_ANSWERS: dict[str, tuple[LayerUnits | None, str | None]] = {}


def replay_units(
    key: str, full: Mapping[str, Any], n: int, build_full: Callable[[], torch.nn.Module]
) -> tuple[LayerUnits | None, str | None]:
    """How memfit may replay the `n` layers of a model, and why they differ.

    Returns (units, reason): `units` None when the stack must be traced whole; `reason`
    None when the layers are all alike. `full` is the full config as transformers completed it
    (`to_dict()`); `build_full()` builds the whole model on the meta device. The answer is
    kept per `key` (what builds the model, as text), so a process asks once per model.
    """
    if key not in _ANSWERS:
        model = build_full()
        reason = config_differences(full, n) or module_differences(model, n)
        kinds = _kinds(full, n, model)
        if kinds is None:  # no stack to compare: alike as far as the config tells
            units = LayerUnits(n, 1, 1) if reason is None else None
        else:
            units = _units(kinds)
        _ANSWERS[key] = (units, reason)
    return _ANSWERS[key]
