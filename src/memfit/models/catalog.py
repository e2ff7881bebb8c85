"""The built-in model catalog: well-known models memfit can build from a name, offline.

Nothing here downloads anything. Each entry carries the official config of its model written
out in ``memfit.models._catalog_data`` and the exact parameter count of its default-task model, so a
user can say ``llama-2-7b`` and get a model built on the meta device (no weight memory) in
about a second, whatever its size.

Importing this module imports neither transformers nor torchvision; ``build_model`` imports
transformers when it needs it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from memfit.errors import BadInputError, closest
from memfit.models import _catalog_data
from memfit.models.layers import shortened_fields
from memfit.models.zoo import ZOO

__all__ = [
    "INPUT_KINDS",
    "TASKS",
    "CatalogModel",
    "build_model",
    "get_model",
    "hf_config",
    "list_models",
    "name_loss_type",
    "supported_tasks",
]

TASKS = (
    "causal-lm",
    "masked-lm",
    "seq-classification",
    "token-classification",
    "base",
    "seq2seq-lm",
    "image-classification",
    "speech-seq2seq",
)

INPUT_KINDS = ("tokens", "image", "audio", "seq2seq-tokens")

# The transformers Auto class that builds each task.
_AUTO_CLASS = {
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "seq-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "base": "AutoModel",
    "seq2seq-lm": "AutoModelForSeq2SeqLM",
    "image-classification": "AutoModelForImageClassification",
    "speech-seq2seq": "AutoModelForSpeechSeq2Seq",
}

# Tasks each HF model type offers, default first. These are the heads transformers has for the
# type, less the ones that make no sense for the checkpoint (BERT as a causal LM, Whisper's
# decoder alone). tests/models/test_catalog.py checks them against transformers' Auto mappings.
_DECODER_TASKS = ("causal-lm", "seq-classification", "token-classification", "base")
_ENCODER_TASKS = ("masked-lm", "seq-classification", "token-classification", "base")
_TASKS_BY_MODEL_TYPE: dict[str, tuple[str, ...]] = {
    "gpt2": _DECODER_TASKS,
    "opt": ("causal-lm", "seq-classification", "base"),
    "gpt_neox": _DECODER_TASKS,
    "bloom": _DECODER_TASKS,
    "falcon": _DECODER_TASKS,
    "llama": _DECODER_TASKS,
    "mistral": _DECODER_TASKS,
    "mixtral": _DECODER_TASKS,
    "qwen2": _DECODER_TASKS,
    "qwen3": _DECODER_TASKS,
    "gemma": _DECODER_TASKS,
    "phi": _DECODER_TASKS,
    "phi3": _DECODER_TASKS,
    "bert": _ENCODER_TASKS,
    "distilbert": _ENCODER_TASKS,
    "roberta": _ENCODER_TASKS,
    "albert": _ENCODER_TASKS,
    "t5": ("seq2seq-lm", "seq-classification", "token-classification", "base"),
    "vit": ("image-classification", "base"),
    "beit": ("image-classification", "base"),
    "whisper": ("speech-seq2seq", "base"),
}
_ZOO_TASKS = ("image-classification",)

# Heads whose label count is not in the official config: memfit builds them with 2 labels.
_TWO_LABEL_TASKS = ("seq-classification", "token-classification")


@dataclass(frozen=True, kw_only=True)
class CatalogModel:
    """One model of the catalog.

    ``config`` is read-only; ``build_model`` works on a copy of it.
    """

    name: str
    """Canonical lowercase CLI name, e.g. ``"llama-2-7b"``."""
    hf_id: str | None
    """The hub id the config comes from; None for memfit.models.zoo models."""
    model_type: str | None
    """The transformers ``model_type``; None for memfit.models.zoo models."""
    task: str
    """The default head, one of ``TASKS``."""
    config: Mapping[str, Any] = field(hash=False)
    """The official config.json fields that shape the model."""
    parameter_count: int
    """Exact parameter count of the default-task model, tied weights counted once."""
    aliases: tuple[str, ...] = ()
    input_kind: str
    """``"tokens"``, ``"image"``, ``"audio"`` or ``"seq2seq-tokens"``."""
    max_positions: int | None
    """Longest sequence the model takes; None when positions are unbounded (relative, ALiBi)
    or the input is not a sequence."""
    image_size: int | None = None
    repeated_layers_key: str | None
    """Config field holding the number of repeated blocks (what ``num_layers`` overrides);
    None for encoder-decoders and CNNs."""
    tasks: tuple[str, ...] | None = None
    """The tasks the model can be built for; None: memfit's table for its ``model_type``
    (catalog entries). A config.json read by memfit.models.sources lists every task
    transformers has a head for."""

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"{self.name}: task {self.task!r} is not one of {TASKS}")
        if self.input_kind not in INPUT_KINDS:
            raise ValueError(f"{self.name}: input_kind {self.input_kind!r} not in {INPUT_KINDS}")
        frozen = MappingProxyType(copy.deepcopy(dict(self.config)))
        object.__setattr__(self, "config", frozen)
        object.__setattr__(self, "aliases", tuple(self.aliases))
        if self.tasks is not None:
            object.__setattr__(self, "tasks", tuple(self.tasks))


_CATALOG: tuple[CatalogModel, ...] = tuple(CatalogModel(**e) for e in _catalog_data.ENTRIES)


def _build_index(entries: tuple[CatalogModel, ...]) -> dict[str, CatalogModel]:
    index: dict[str, CatalogModel] = {}
    for entry in entries:
        keys = [entry.name, *entry.aliases]
        if entry.hf_id is not None:
            keys.append(entry.hf_id)
        for key in keys:
            k = key.lower()
            other = index.get(k)
            if other is not None and other is not entry:
                raise RuntimeError(f"catalog key {key!r} names both {other.name} and {entry.name}")
            index[k] = entry
    return index


_INDEX: dict[str, CatalogModel] = _build_index(_CATALOG)


def list_models() -> list[CatalogModel]:
    """Every catalog entry, in catalog order (grouped by family, small to large)."""
    return list(_CATALOG)


def get_model(name: str) -> CatalogModel:
    """The entry called ``name``: its CLI name, an alias or its hub id, in any case.

    Raises BadInputError for an unknown name, suggesting the closest known names.
    """
    if not isinstance(name, str):
        raise BadInputError(f"model name must be a string, got {name!r}")
    entry = _INDEX.get(name.strip().lower())
    if entry is None:
        known = [e.name for e in _CATALOG]
        hint = closest(name.strip(), known) or closest(name.strip(), list(_INDEX))
        raise BadInputError(
            f"unknown model {name!r}: it is not in memfit's built-in catalog.{hint} Use one of "
            f"the {len(known)} built-in names (memfit.models.catalog.list_models()), an alias "
            "or a hub id listed there."
        )
    return entry


def supported_tasks(entry: CatalogModel) -> tuple[str, ...]:
    """The tasks (heads) ``build_model`` can build for ``entry``, its default task first."""
    tasks: tuple[str, ...]
    if entry.tasks is not None:
        tasks = entry.tasks
    elif entry.model_type is None:
        tasks = _ZOO_TASKS
    else:
        tasks = _TASKS_BY_MODEL_TYPE.get(entry.model_type, (entry.task,))
    if entry.task in tasks:
        return (entry.task, *(t for t in tasks if t != entry.task))
    return (entry.task, *tasks)


def build_model(
    entry: CatalogModel,
    *,
    task: str | None = None,
    num_layers: int | None = None,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
) -> torch.nn.Module:
    """Build ``entry`` on the meta device: the real structure, no weight memory.

    ``task`` picks the head (default: ``entry.task``); sequence and token classification heads
    get 2 labels. ``num_layers`` replaces the number of repeated blocks (the config field
    ``entry.repeated_layers_key``), to build a shortened copy. ``attn_implementation`` is passed
    to transformers; an architecture with no SDPA path (BLOOM) falls back to ``"eager"`` when
    ``"sdpa"`` was asked for, and the built model's ``config._attn_implementation`` says which
    one it got. memfit.models.zoo models ignore ``attn_implementation``.
    """
    task = entry.task if task is None else task
    tasks = supported_tasks(entry)
    if task not in tasks:
        raise BadInputError(
            f"task {task!r} is not available for {entry.name}; it supports: {', '.join(tasks)}."
        )
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise BadInputError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    if num_layers is not None:
        if entry.repeated_layers_key is None:
            raise BadInputError(
                f"{entry.name} has no single stack of repeated blocks, so num_layers "
                f"({num_layers!r}) cannot shorten it; build it without num_layers."
            )
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise BadInputError(f"num_layers must be a positive integer, got {num_layers!r}")

    if entry.model_type is None:
        return _build_zoo(entry, dtype=dtype)
    return _build_hf(
        entry,
        task=task,
        num_layers=num_layers,
        dtype=dtype,
        attn_implementation=attn_implementation,
    )


def _build_zoo(entry: CatalogModel, *, dtype: torch.dtype) -> torch.nn.Module:
    cfg = dict(entry.config)
    arch = cfg.pop("arch")
    with torch.device("meta"):
        model = ZOO[arch](**cfg)
    return model.to(dtype=dtype)


def _build_hf(
    entry: CatalogModel,
    *,
    task: str,
    num_layers: int | None,
    dtype: torch.dtype,
    attn_implementation: str,
) -> torch.nn.Module:
    import transformers
    from transformers.utils import logging as hf_logging

    assert entry.model_type is not None
    kwargs: dict[str, Any] = copy.deepcopy(dict(entry.config))
    if task in _TWO_LABEL_TASKS:
        kwargs["num_labels"] = 2
    auto_class = getattr(transformers, _AUTO_CLASS[task])

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # config upgrade notices are noise for a catalog build
    try:
        key = entry.repeated_layers_key
        if num_layers is not None and key is not None:
            kwargs = _first_layers(entry, kwargs, key, num_layers)
        config = hf_config(entry.model_type, kwargs, entry.name)
        with torch.device("meta"):
            try:
                model = auto_class.from_config(
                    config, dtype=dtype, attn_implementation=attn_implementation
                )
            except (ValueError, ImportError) as exc:
                if attn_implementation != "sdpa" or "does not support" not in str(exc):
                    raise _build_error(entry.name, attn_implementation, exc) from exc
                model = _eager(auto_class, config, dtype, entry.name)
            except Exception as exc:  # the model's __init__ fails on this config
                raise _build_error(entry.name, attn_implementation, exc) from exc
    finally:
        hf_logging.set_verbosity(previous)
    name_loss_type(model, task)
    return model


def _first_layers(
    entry: CatalogModel, kwargs: dict[str, Any], key: str, num_layers: int
) -> dict[str, Any]:
    """`kwargs` for the model of the first `num_layers` layers of `entry`: the layer count,
    and every per-layer field of the full config (memfit.models.layers.shortened_fields)."""
    n = entry.config[key]
    if not isinstance(n, int) or num_layers >= n:
        return {**kwargs, key: num_layers}
    assert entry.model_type is not None
    full = hf_config(entry.model_type, kwargs, entry.name).to_dict()
    return shortened_fields(kwargs, key, full, n, num_layers)


def name_loss_type(model: torch.nn.Module, task: str) -> None:
    """Name the loss transformers falls back to anyway for class names it does not map (e.g.
    GPT2LMHeadModel), so that the forward does not warn about it. Changes nothing else."""
    if getattr(model, "loss_type", None) is None and task in _LOSS_TYPES:
        model.loss_type = _LOSS_TYPES[task]  # type: ignore[assignment]


def hf_config(model_type: str, fields: Mapping[str, Any], origin: str) -> Any:
    """``transformers.AutoConfig.for_model(model_type, **fields)``; a config transformers
    rejects (a hidden size that is not a multiple of the number of heads, a field of the wrong
    type) raises BadInputError naming `origin` (the model's name or config file) and the field.
    """
    import transformers
    from huggingface_hub import errors as hub_errors

    # transformers >= 5 validates configs as huggingface_hub strict dataclasses.
    strict = getattr(hub_errors, "StrictDataclassError", ValueError)
    try:
        return transformers.AutoConfig.for_model(model_type, **fields)
    except (ValueError, TypeError, strict) as exc:
        reason = str(exc.__cause__ if exc.__cause__ is not None else exc).rstrip(".")
        raise BadInputError(
            f"{origin}: transformers rejects this {model_type} config: {reason}. Fix that field."
        ) from exc


def _eager(auto_class: Any, config: Any, dtype: torch.dtype, name: str) -> torch.nn.Module:
    """The model with eager attention (an architecture without an SDPA path)."""
    try:
        return auto_class.from_config(config, dtype=dtype, attn_implementation="eager")
    except Exception as exc:  # the model's __init__ fails on this config
        raise _build_error(name, "eager", exc) from exc


def _build_error(name: str, attn_implementation: str, exc: Exception) -> BadInputError:
    """A model transformers would not build from a valid config: an attention implementation
    it does not have for the architecture, an inconsistency only the layers check (BERT's
    hidden size against its heads), a package it needs, or a config its code does not read
    as it wrote it (a field its layers need that the config does not carry)."""
    if attn_implementation in str(exc):
        return BadInputError(
            f"cannot build {name} with attn_implementation={attn_implementation!r}: {exc}"
        )
    reason = str(exc).strip().rstrip(".")
    if isinstance(exc, (ValueError, ImportError)):
        return BadInputError(f"transformers cannot build {name}: {reason}. Fix that field.")
    return BadInputError(
        f"transformers cannot build {name} from this config: its model code raised "
        f"{type(exc).__name__}: {reason}. A real run would fail the same way; fix the config "
        "(or the installed transformers)."
    )


#: transformers' LOSS_MAPPING keys for the heads memfit builds.
_LOSS_TYPES = {
    "causal-lm": "ForCausalLM",
    "masked-lm": "ForMaskedLM",
    "seq-classification": "ForSequenceClassification",
    "token-classification": "ForTokenClassification",
}
