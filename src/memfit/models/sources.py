"""Model sources: one interface for catalog names, HF config.json files, factories and modules.

`resolve_model(source)` returns a `ModelSpec` that can build the model (on the meta device when
memfit builds it, so a 70B model costs nothing), make a batch of inputs, and compute the loss.
Sources accepted:
- a catalog name ("llama-2-7b", see `memfit models`);
- a path to an HF `config.json`, or to a directory holding one (task from `architectures`, or
  `task=`);
- "path/to/file.py:build" or "package.module:build": a function returning an nn.Module, with an
  optional `make_batch(batch_size)` beside it ("file.py:build:make_batch" names it explicitly);
- an nn.Module, or a zero-argument callable returning one.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.models.catalog import CatalogModel, build_model, get_model, supported_tasks

# HF `architectures` suffixes -> memfit task names.
_ARCH_SUFFIX_TO_TASK = (
    ("ForCausalLM", "causal-lm"),
    ("LMHeadModel", "causal-lm"),
    ("ForMaskedLM", "masked-lm"),
    ("ForPreTraining", "masked-lm"),
    ("ForSequenceClassification", "seq-classification"),
    ("ForTokenClassification", "token-classification"),
    ("ForConditionalGeneration", "seq2seq-lm"),
    ("ForImageClassification", "image-classification"),
    ("Model", "base"),
)


@dataclass
class ModelSpec:
    """A resolved model source.

    Attributes:
        name: display name.
        build: `build(num_layers, attention)` returns the model; `num_layers` (or None for
            all) shortens the stack of repeated blocks when `can_shorten` is true; `attention`
            ("sdpa" or "eager") picks the attention implementation of models memfit builds.
        owns_model: True when memfit built the model and may change it in place.
        input_kind: "tokens", "seq2seq-tokens", "image", "audio" or "custom".
        task: the head, e.g. "causal-lm".
        make_batch: user input factory `make_batch(batch_size)`, or None.
        max_positions: longest sequence the model accepts, or None.
        num_layers: number of repeated blocks of the full model, when known.
        loss: "hf" (use output.loss), "cross_entropy" (logits vs class labels) or "sum".
    """

    name: str
    build: Callable[[int | None, str], torch.nn.Module]
    owns_model: bool
    input_kind: str
    task: str
    make_batch: Callable[[int], Any] | None = None
    max_positions: int | None = None
    num_layers: int | None = None
    can_shorten: bool = False
    loss: str = "hf"
    image_size: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def resolve_model(source: Any, *, task: str | None = None) -> ModelSpec:
    """Turn whatever the user gave into a `ModelSpec`; bad input raises BadInputError."""
    if isinstance(source, ModelSpec):
        return source
    if isinstance(source, torch.nn.Module):
        module = source
        hf = _is_hf(module)
        return ModelSpec(
            name=type(module).__name__,
            build=lambda _n, _a: module,
            owns_model=False,
            input_kind=_guess_input_kind(module),
            task=task or (_task_of_class(type(module).__name__) if hf else "custom"),
            loss="hf" if hf else "sum",
            max_positions=_max_positions(module) if hf else None,
        )
    if callable(source) and not isinstance(source, str):
        return _from_factory(source, None, getattr(source, "__name__", "model"))
    if not isinstance(source, (str, os.PathLike)):
        raise BadInputError(
            f"Cannot use {source!r} as a model: pass a catalog name, a config.json path, "
            "'file.py:build', or an nn.Module."
        )
    text = os.fspath(source)
    path = Path(text)
    if path.is_dir() and (path / "config.json").is_file():
        return _from_hf_config(path / "config.json", task)
    if path.suffix == ".json":
        if not path.is_file():
            raise BadInputError(f"Config file {text!r} does not exist.")
        return _from_hf_config(path, task)
    if ":" in text and not _looks_like_windows_drive(text):
        return _from_factory_string(text)

    return _from_catalog(get_model(text), task)


def _looks_like_windows_drive(text: str) -> bool:
    return len(text) > 2 and text[1] == ":" and text[0].isalpha() and text[2] in "\\/"


def _task_of_class(name: str) -> str:
    """HF class name -> task: "LlamaForCausalLM" -> "causal-lm" (see _ARCH_SUFFIX_TO_TASK)."""
    for suffix, t in _ARCH_SUFFIX_TO_TASK:
        if name.endswith(suffix):
            return t
    return "custom"


def _max_positions(module: torch.nn.Module) -> int | None:
    cfg = getattr(module, "config", None)
    value = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    return int(value) if isinstance(value, int) else None


def _is_hf(module: torch.nn.Module) -> bool:
    return hasattr(module, "config") and hasattr(module, "can_generate")


def _guess_input_kind(module: torch.nn.Module) -> str:
    cfg = getattr(module, "config", None)
    if cfg is None:
        return "custom"
    if getattr(cfg, "is_encoder_decoder", False):
        return "seq2seq-tokens"
    if hasattr(cfg, "image_size") and hasattr(cfg, "num_channels"):
        return "image"
    return "tokens"


def _from_catalog(entry: Any, task: str | None) -> ModelSpec:
    chosen = task or entry.task
    if chosen not in supported_tasks(entry):
        raise BadInputError(
            f"Task {chosen!r} is not available for {entry.name!r}. "
            f"Choose one of: {', '.join(supported_tasks(entry))}."
        )
    key = entry.repeated_layers_key
    num_layers = int(entry.config[key]) if key else None

    def build(n: int | None, attention: str) -> torch.nn.Module:
        return build_model(entry, task=chosen, num_layers=n, attn_implementation=attention)

    return ModelSpec(
        name=entry.name,
        build=build,
        owns_model=True,
        input_kind=entry.input_kind,
        task=chosen,
        max_positions=entry.max_positions,
        num_layers=num_layers,
        can_shorten=key is not None,
        loss="cross_entropy" if entry.model_type is None else "hf",
        image_size=entry.image_size,
        extra={"entry": entry},
    )


def _from_hf_config(path: Path, task: str | None) -> ModelSpec:
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BadInputError(f"Cannot read HF config {str(path)!r}: {e}") from e
    model_type = cfg.get("model_type")
    if not model_type:
        raise BadInputError(
            f"{str(path)!r} has no 'model_type' field, so transformers cannot tell which "
            'architecture it describes. Add e.g. "model_type": "llama".'
        )
    default_task = "causal-lm"
    for arch in cfg.get("architectures") or []:
        for suffix, t in _ARCH_SUFFIX_TO_TASK:
            if arch.endswith(suffix):
                default_task = t
                break
        break
    layers_key = next((k for k in ("num_hidden_layers", "n_layer", "num_layers") if k in cfg), None)
    if cfg.get("is_encoder_decoder"):
        layers_key = None
    input_kind = "tokens"
    if cfg.get("is_encoder_decoder"):
        input_kind = "audio" if "num_mel_bins" in cfg else "seq2seq-tokens"
    elif "image_size" in cfg and "num_channels" in cfg:
        input_kind = "image"
    entry = CatalogModel(
        name=path.parent.name or str(path),
        hf_id=None,
        model_type=model_type,
        task=default_task,
        config={k: v for k, v in cfg.items() if k not in ("architectures", "model_type")},
        parameter_count=0,
        input_kind=input_kind,
        max_positions=cfg.get("max_position_embeddings") or cfg.get("n_positions"),
        image_size=cfg.get("image_size"),
        repeated_layers_key=layers_key,
    )
    return _from_catalog(entry, task)


def load_functions(text: str) -> tuple[Callable[..., Any], Callable[..., Any] | None]:
    """ "file.py:fn[:make_batch]" (or "package.module:fn[:make_batch]") -> the functions.

    Without a third part, a `make_batch` beside `fn` is returned if the file has one.
    """
    parts = text.split(":")
    if len(parts) < 2 or not parts[1]:
        raise BadInputError(
            f"{text!r} names no function: write file.py:function (e.g. train.py:build)."
        )
    target, fn_name = parts[0], parts[1]
    batch_name = parts[2] if len(parts) > 2 else None
    if target.endswith(".py"):
        file = Path(target)
        if not file.is_file():
            raise BadInputError(f"File {target!r} does not exist.")
        mod_name = "memfit_user_" + file.stem
        spec = importlib.util.spec_from_file_location(mod_name, file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            raise BadInputError(
                f"Importing {target!r} raised {type(e).__name__}; its traceback:\n"
                + traceback.format_exc()
            ) from e
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise BadInputError(f"Cannot import module {target!r}: {e}") from e
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise BadInputError(f"{target!r} has no function {fn_name!r}.")
    make_batch = getattr(module, batch_name or "make_batch", None)
    if batch_name and not callable(make_batch):
        raise BadInputError(f"{target!r} has no function {batch_name!r}.")
    return fn, make_batch if callable(make_batch) else None


def _from_factory_string(text: str) -> ModelSpec:
    fn, make_batch = load_functions(text)
    return _from_factory(fn, make_batch, text)


def _from_factory(fn: Callable[[], Any], make_batch: Any, name: str) -> ModelSpec:
    def build(_n: int | None, _attention: str) -> torch.nn.Module:
        try:
            with torch.device("meta"):
                model = fn()
        except Exception as e:
            raise BadInputError(
                f"The model factory {name!r} raised {type(e).__name__}; its traceback:\n"
                + traceback.format_exc()
            ) from e
        if not isinstance(model, torch.nn.Module):
            raise BadInputError(
                f"The model factory {name!r} returned {type(model).__name__}, not an nn.Module."
            )
        return model

    return ModelSpec(
        name=name,
        build=build,
        owns_model=True,
        input_kind="custom" if make_batch else "tokens",
        task="custom",
        make_batch=make_batch,
        loss="sum",
    )
