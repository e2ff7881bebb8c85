"""Model sources: one interface for catalog names, HF config.json files, factories and modules.

`resolve_model(source)` returns a `ModelSpec` that can build the model (on the meta device when
memfit builds it, so a 70B model costs nothing), make a batch of inputs, and compute the loss.
Sources accepted:
- a catalog name ("llama-2-7b", see `memfit models`);
- a path to an HF `config.json`, or to a directory holding one;
- "path/to/file.py:build" or "package.module:build": a function returning an nn.Module, with an
  optional `make_batch(batch_size[, seq_len])` beside it ("file.py:build:make_batch" names it
  explicitly; see memfit.models.factory for how the file is imported);
- an nn.Module, or a zero-argument callable returning one.

The same transformers model is the same step whatever the source: a `LlamaForCausalLM` named
from the catalog, read from a config.json, returned by a factory or passed in gets the same batch
(`input_ids` and `labels`) and the same loss (the model's own, `output.loss`). Its task is read
from transformers' Auto mappings (memfit.models.hf_tasks), not guessed from a class name.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.models.catalog import (
    TASKS,
    CatalogModel,
    build_model,
    get_model,
    hf_config,
    name_loss_type,
    supported_tasks,
)
from memfit.models.checkpoint import (
    DTYPE_KEY,
    HEADERS_KEY,
    checkpoint_notes,
    read_checkpoint,
    state_dict_dtype,
)
from memfit.models.factory import in_script, load_functions, script_of, user_error
from memfit.models.hf_tasks import (
    check_model_type,
    default_task,
    input_kind_of,
    max_positions_of,
    task_of_class,
    tasks_of_model_type,
)
from memfit.models.layers import LayerUnits, replay_units

__all__ = ["ModelSpec", "load_functions", "resolve_model"]

#: Parameters of a user's `make_batch` that memfit fills from the workload, by name.
SEQ_LEN_PARAMETER = "seq_len"
IMAGE_SIZE_PARAMETER = "image_size"

_NO_LOSS_NOTE = (
    "{what}, so memfit does not know its loss: the backward starts from the output's own .loss "
    "(or the output itself when it is a scalar) when there is one, else from the sum of its "
    "first output that requires grad. A sum holds nothing of its own, so a real loss's memory "
    "is left out (a cross-entropy over logits holds about two more logits-sized tensors)."
)


@dataclass
class ModelSpec:
    """A resolved model source.

    Attributes:
        name: display name.
        build: `build(num_layers, attention)` returns the model; `num_layers` (or None for
            all) shortens the stack of repeated blocks when `can_shorten` is true; `attention`
            ("sdpa" or "eager") picks the attention implementation of models memfit builds
            from a name or a config. A model built by the user's factory, or passed in, keeps
            the attention implementation it was built with.
        owns_model: True when memfit built the model and may change it in place.
        input_kind: "tokens", "seq2seq-tokens", "image", "audio" or "custom" (no inputs memfit
            can make: a `make_batch` is needed).
        task: the head, e.g. "causal-lm"; "custom" for a model memfit has no task for.
        make_batch: the user's input factory, or None (memfit makes the batch for `task`).
            It is called `make_batch(batch_size)`, with `seq_len=` when it has a parameter
            named `seq_len` and with `image_size=` when it has one named `image_size`. Such a
            batch is the user's, so its shape is too: a workload's `seq_len` (or
            `image_size`) is passed to a make_batch that takes it, and one that does not
            take it raises BadInputError rather than being reported and not used (see
            `user_batch`).
        max_positions: longest sequence the model accepts, or None.
        num_layers: number of repeated blocks of the full model, when known (of units of
            layers with `layer_units`).
        loss: how the traced loss is computed:
            "hf": the loss is the model's own `output.loss` (a transformers head; memfit's
            batches carry labels, a make_batch's must too: an output without a loss is a
            TraceError);
            "cross_entropy": cross-entropy of the logits against the batch's class labels
            (memfit.models.zoo CNNs);
            "sum": the documented fallback for a model whose loss memfit does not know
            (a model of the user's own, a transformers model without a head): the output's
            own `.loss` or a scalar output when there is one, else the sum of its first output
            that requires grad. `notes` says so.
        image_size: side of the input image for vision models, when the config gives it.
        notes: what the estimate of this model assumes that a user should know (the loss
            fallback), to be shown with the estimate's notes.

    Known limits: a factory is called once when resolved (to read its model's class and
    config) and again for each trace, so it should build a fresh model each time; a factory's
    or a module's model cannot be shortened, so it is traced whole (exact, slower than the
    catalog's replay of 3 blocks for deep models); the inputs memfit makes are token ids,
    pixels and log-mel frames: other inputs (raw audio, several modalities) need a
    `make_batch`; an encoder-decoder's inference step is still given labels (its loss is
    computed, under no_grad); a head whose forward reads token values (T5's sequence
    classifier finds its EOS tokens with unique_consecutive) cannot run on fake tensors and
    is a TraceError.
    """

    name: str
    build: Callable[[int | None, str], torch.nn.Module]
    owns_model: bool
    input_kind: str
    task: str
    make_batch: Callable[..., Any] | None = None
    max_positions: int | None = None
    num_layers: int | None = None
    can_shorten: bool = False
    loss: str = "hf"
    image_size: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: What builds the model, as text (catalog entry or config.json fields, head, input kind),
    #: for the trace cache (memfit.estimator.trace.cache); None for a model memfit cannot name
    #: that way (an nn.Module passed in, a factory's), which is never cached.
    cache_key: str | None = None
    #: True when `make_batch`'s batches, like memfit's own, hold one sequence per row and no
    #: `position_ids` or attention mask (the trainer callbacks' copies of a real first batch
    #: without them): transformers then makes position_ids as an arange and finds no packed
    #: sequences, which the trace cannot read off fake values (step_runner).
    unpacked_batches: bool = False
    #: When the model's layers are not all alike but repeat in runs (memfit.models.layers):
    #: how they are cut into the units the replay copies. Then `num_layers` counts units and
    #: `build(n)` builds the layers of the first `n` units. None: a unit is a layer.
    layer_units: LayerUnits | None = None

    @property
    def batch_is_user_defined(self) -> bool:
        """True when the batch (and so its shape) comes from the user's `make_batch`."""
        return self.make_batch is not None

    @property
    def batch_takes_seq_len(self) -> bool:
        """True when the user's `make_batch` has a `seq_len` parameter, so `--seq` sizes its
        batch; False without a make_batch (memfit's own batches always take it)."""
        return self.make_batch is not None and _parameter(self.make_batch, SEQ_LEN_PARAMETER)

    @property
    def batch_takes_image_size(self) -> bool:
        """True when the user's `make_batch` has an `image_size` parameter."""
        return self.make_batch is not None and _parameter(self.make_batch, IMAGE_SIZE_PARAMETER)

    def user_batch(self, batch_size: int, seq_len: int | None, image_size: int | None) -> Any:
        """The user's batch: `make_batch(batch_size)`, with `seq_len=` / `image_size=` when it
        takes them and they are given. A size given to a make_batch that cannot take it raises
        BadInputError, as does a make_batch that needs a size not given."""
        assert self.make_batch is not None
        kwargs: dict[str, int] = {}
        for pname, value, flag in (
            (SEQ_LEN_PARAMETER, seq_len, "--seq"),
            (IMAGE_SIZE_PARAMETER, image_size, "--image-size"),
        ):
            takes = _parameter(self.make_batch, pname)
            if value is not None and not takes:
                raise BadInputError(
                    f"{flag} {value} ({pname}={value}) cannot be honoured for {self.name!r}: "
                    f"its make_batch{_signature(self.make_batch)} makes the batch, of its own "
                    f"shape. Drop {flag}, or give make_batch a {pname} parameter, e.g. "
                    f"def make_batch(batch_size, {pname}), and memfit passes it."
                )
            if value is not None:
                kwargs[pname] = value
            elif takes and _parameter_is_required(self.make_batch, pname):
                raise BadInputError(
                    f"The make_batch of {self.name!r} needs {pname} "
                    f"(make_batch{_signature(self.make_batch)}), and none was given: pass "
                    f"{flag} (or {pname}= in the Workload), or give the parameter a default."
                )
        return self.make_batch(batch_size, **kwargs)


def _parameter(fn: Callable[..., Any], name: str) -> bool:
    """Whether `fn` takes a parameter `name` by keyword."""
    try:
        p = inspect.signature(fn).parameters.get(name)
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


def _parameter_is_required(fn: Callable[..., Any], name: str) -> bool:
    return inspect.signature(fn).parameters[name].default is inspect.Parameter.empty


def _signature(fn: Callable[..., Any]) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"


def resolve_model(source: Any, *, task: str | None = None) -> ModelSpec:
    """Turn whatever the user gave into a `ModelSpec`; bad input raises BadInputError.

    `task` picks the head of a catalog name or a config.json among those transformers has for
    its model type; without it, a catalog entry's default, or for a config.json the rule of
    memfit.models.hf_tasks.default_task (its `architectures`, else the head transformers
    pretrains the model type with, else its one training objective; several: BadInputError
    asking for the task). A model a factory returns, or one passed in, has its head already:
    `task` may only repeat it.
    """
    if isinstance(source, ModelSpec):
        return source
    if isinstance(source, torch.nn.Module):
        return _from_module(source, task)
    if callable(source) and not isinstance(source, str):
        return _from_factory(source, None, getattr(source, "__name__", "model"), task)
    if not isinstance(source, (str, os.PathLike)):
        raise BadInputError(
            f"Cannot use {source!r} as a model: pass a catalog name, a config.json path, "
            "'file.py:build', or an nn.Module."
        )
    text = os.fspath(source)
    path = Path(text)
    if path.is_dir() and (path / "config.json").is_file():
        return _with_checkpoint(_from_hf_config(path / "config.json", task), path)
    if path.suffix == ".json":
        if not path.is_file():
            raise BadInputError(f"Config file {text!r} does not exist.")
        return _from_hf_config(path, task)
    if ":" in text and not _looks_like_windows_drive(text):
        fn, make_batch = load_functions(text)
        file = script_of(text)
        if file is not None:  # build and make_batch run as the file's own code would
            fn = in_script(fn, file)
            make_batch = in_script(make_batch, file) if make_batch is not None else None
        return _from_factory(fn, make_batch, text, task)

    return _from_catalog(get_model(text), task)


def _with_checkpoint(spec: ModelSpec, folder: Path) -> ModelSpec:
    """A checkpoint folder's spec: its safetensors headers (memfit.models.checkpoint) kept in
    `extra`, with the dtype transformers' dtype="auto" reads from them, and a note."""
    headers = read_checkpoint(folder)
    if headers is None:
        return spec
    spec.extra[HEADERS_KEY] = headers
    spec.extra[DTYPE_KEY] = state_dict_dtype(folder, headers)
    spec.notes.extend(checkpoint_notes(folder, headers))
    if spec.cache_key is not None:  # the same config with other weights traces alike
        spec.cache_key += f"|checkpoint:{headers.total_bytes}"
    return spec


def _looks_like_windows_drive(text: str) -> bool:
    return len(text) > 2 and text[1] == ":" and text[0].isalpha() and text[2] in "\\/"


# ----------------------------------------------------------------------------- catalog, config


def _from_catalog(entry: CatalogModel, task: str | None) -> ModelSpec:
    chosen = task or entry.task
    if chosen not in supported_tasks(entry):
        raise BadInputError(
            f"Task {chosen!r} is not available for {entry.name!r}. "
            f"Choose one of: {', '.join(supported_tasks(entry))}."
        )
    key = entry.repeated_layers_key
    num_layers = int(entry.config[key]) if key else None
    loss, notes = "hf", []
    cache_key = _entry_key(entry, chosen)
    units, differ = None, None
    # The built-in catalog's layers are alike (tests/models/test_layers.py checks each entry):
    # only a config.json's are compared.
    if num_layers is not None and num_layers > _FEWEST_REPLAYED and entry.hf_id is None:
        units, differ = _replay_units(entry, chosen, num_layers, cache_key)
    grouped = units if differ is not None else None  # replayed by units of layers
    if differ is not None:
        how = (
            "every layer is traced (exact, and slower than a replay)"
            if units is None
            else _unit_text(units)
        )
        notes.append(
            f"The {num_layers} layers of {entry.name} are not all alike ({differ}): {how}."
        )

    def build(n: int | None, attention: str) -> torch.nn.Module:
        if n is not None and grouped is not None:
            n = grouped.layers_of(n)
        return build_model(entry, task=chosen, num_layers=n, attn_implementation=attention)

    if entry.model_type is None:
        loss = "cross_entropy"
    elif chosen == "base":
        loss = "sum"
        notes.append(_NO_LOSS_NOTE.format(what=f"{entry.name} is built without a head (base)"))
    return ModelSpec(
        name=entry.name,
        build=build,
        owns_model=True,
        input_kind=entry.input_kind,
        task=chosen,
        max_positions=entry.max_positions,
        num_layers=grouped.count if grouped is not None else num_layers,
        can_shorten=key is not None and (differ is None or units is not None),
        layer_units=grouped,
        loss=loss,
        image_size=entry.image_size,
        extra={"entry": entry},
        notes=notes,
        cache_key=cache_key,
    )


#: A stack of more layers than this may be replayed (memfit.estimator.trace.block_replay traces 3
#: and
#: checks them against 4), so only then are its layers compared.
_FEWEST_REPLAYED = 4


def _replay_units(
    entry: CatalogModel, task: str, n: int, key: str
) -> tuple[LayerUnits | None, str | None]:
    """How the `n` layers of `entry` may be replayed, and why they differ
    (memfit.models.layers.replay_units)."""
    assert entry.model_type is not None
    full = hf_config(entry.model_type, dict(entry.config), entry.name).to_dict()
    return replay_units(key, full, n, lambda: build_model(entry, task=task))


def _unit_text(units: LayerUnits) -> str:
    """How a model whose layers differ is replayed, for its note."""
    runs = "they are alike" if units.period == 1 else f"they repeat every {units.period} layers"
    return (
        f"{runs} after the first {units.head}, so memfit traces those and 2 repeats and "
        "replays the rest (checked against a trace of 3 repeats)"
    )


def _entry_key(entry: CatalogModel, task: str) -> str:
    """Every field of a catalog entry that shapes the model it builds, and the head."""
    fields = {f.name: getattr(entry, f.name) for f in dataclasses.fields(entry)}
    fields["config"] = dict(entry.config)
    return json.dumps({"entry": fields, "task": task}, sort_keys=True, default=repr)


#: The config fields that size a model, under their canonical names (transformers maps a
#: family's own names, such as GPT-2's n_embd, to them through `attribute_map`).
SIZE_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "intermediate_size", "max_position_embeddings",
)  # fmt: skip


def _defaulted_sizes(raw: dict[str, Any], config: Any) -> list[str]:
    """A note naming the sizes the file leaves to transformers' defaults (a config of only
    `{"model_type": "llama"}` builds a 6.7B model): never a silent guess."""
    aliases = getattr(config, "attribute_map", {}) or {}
    missing = []
    for name in SIZE_FIELDS:
        value = getattr(config, name, None)
        if value is None or name in raw or aliases.get(name) in raw:
            continue
        missing.append(f"{name}={value}")
    if not missing:
        return []
    return [
        f"the file does not give {', '.join(missing)}: these come from transformers' "
        f"{type(config).__name__} defaults; put the checkpoint's own values in the config"
    ]


def _from_hf_config(path: Path, task: str | None) -> ModelSpec:
    origin = str(path)
    try:
        raw = _special_floats(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError) as e:
        raise BadInputError(f"Cannot read HF config {origin!r}: {e}") from e
    if not isinstance(raw, dict):
        raise BadInputError(
            f"{origin!r} holds a JSON {type(raw).__name__}, not a config: a config.json is an "
            'object such as {"model_type": "llama", "hidden_size": 2048, ...}.'
        )
    model_type = raw.get("model_type")
    if not model_type:
        raise BadInputError(
            f"{origin!r} has no 'model_type' field, so transformers cannot tell which "
            'architecture it describes. Add e.g. "model_type": "llama".'
        )
    check_model_type(model_type, origin)
    fields = {k: v for k, v in raw.items() if k not in ("architectures", "model_type")}
    config = hf_config(model_type, fields, origin)
    available = tasks_of_model_type(model_type)
    chosen = task or default_task(model_type, config, list(raw.get("architectures") or []), origin)
    if chosen not in available:
        known = "" if chosen in TASKS else f" memfit's tasks are: {', '.join(TASKS)}."
        raise BadInputError(
            f"{origin}: task {chosen!r} is not available for model_type {model_type!r}; "
            f"transformers has: {', '.join(available) or 'no head memfit trains'}.{known}"
        )
    notes = _start_token(fields, config, chosen, model_type) if chosen == "seq2seq-lm" else []
    notes += _defaulted_sizes(raw, config)
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    layers_key = None
    if not encoder_decoder:
        layers_key = next((k for k in ("num_hidden_layers", "n_layer", "num_layers") if k in raw),
                          None)  # fmt: skip
    input_kind = input_kind_of(chosen, model_type, config)
    image_size = getattr(config, "image_size", None) if input_kind == "image" else None
    entry = CatalogModel(
        name=path.parent.name if path.name == "config.json" and path.parent.name else path.stem,
        hf_id=None,
        model_type=model_type,
        task=chosen,
        tasks=available,
        config=fields,
        parameter_count=0,
        input_kind=input_kind,
        max_positions=max_positions_of(config, input_kind),
        image_size=image_size if isinstance(image_size, int) else None,
        repeated_layers_key=layers_key,
    )
    spec = _from_catalog(entry, chosen)
    spec.notes[:0] = notes
    catalog_build = spec.build

    def build(n: int | None, attention: str) -> torch.nn.Module:
        try:
            return catalog_build(n, attention)
        except BadInputError as e:
            raise BadInputError(f"{origin}: {e}") from e

    spec.build = build
    return spec


#: How transformers writes a float JSON has no literal for (PreTrainedConfig.
#: _encode_special_floats, transformers >= 5): {"__float__": "Infinity"} (Mamba2's and Bamba's
#: `time_step_limit` default to (0.0, inf)).
_FLOAT_TAG = "__float__"
_FLOAT_TAGS = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def _special_floats(value: Any) -> Any:
    """A config.json's values with transformers' tagged floats read back as floats, as
    `PreTrainedConfig.from_json_file` reads them."""
    if isinstance(value, dict):
        tag = value.get(_FLOAT_TAG)
        if len(value) == 1 and isinstance(tag, str) and tag in _FLOAT_TAGS:
            return _FLOAT_TAGS[tag]
        return {k: _special_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_special_floats(v) for v in value]
    return value


def _start_token(fields: dict[str, Any], config: Any, task: str, model_type: str) -> list[str]:
    """A seq2seq LM's training step shifts its labels right into the decoder's inputs, starting
    them with `decoder_start_token_id`. T5's config class has no such field (transformers 5;
    None before), and the default config it writes has none, so that step raises; every T5
    checkpoint sets it to `pad_token_id`. Its value changes no memory: memfit sets it so in
    `fields` and returns the note that says so (none when the config has one)."""
    if getattr(config, "decoder_start_token_id", None) is not None:
        return []
    pad = getattr(config, "pad_token_id", None)
    if not isinstance(pad, int):
        return []  # transformers' own error says which id is missing
    fields["decoder_start_token_id"] = pad
    return [
        f"The config has no decoder_start_token_id, with which {model_type}'s {task} step "
        f"starts the decoder's inputs (transformers' training step fails without it): memfit "
        f"traced it as pad_token_id ({pad}), as {model_type} checkpoints set it. Add "
        f'"decoder_start_token_id": {pad} to the config before training.'
    ]


# ----------------------------------------------------------------------------- modules


def _from_module(module: torch.nn.Module, task: str | None) -> ModelSpec:
    name = type(module).__name__
    return ModelSpec(
        name=name,
        build=lambda _n, _a: module,
        owns_model=False,
        **_module_fields(module, name, task),
    )


def _from_factory(
    fn: Callable[[], Any], make_batch: Callable[..., Any] | None, name: str, task: str | None
) -> ModelSpec:
    probe = _call_factory(fn, name)
    fields = _module_fields(probe, name, task)
    del probe

    def build(_n: int | None, _attention: str) -> torch.nn.Module:
        model = _call_factory(fn, name)
        if fields["loss"] == "hf":
            name_loss_type(model, fields["task"])
        return model

    return ModelSpec(name=name, build=build, owns_model=True, make_batch=make_batch, **fields)


def _call_factory(fn: Callable[[], Any], name: str) -> torch.nn.Module:
    """`fn()` on the meta device; its errors (and a SystemExit) are BadInputError."""
    try:
        with torch.device("meta"):
            model = fn()
    except SystemExit as e:
        raise BadInputError(
            user_error(f"The model factory {name!r} exited instead of returning a model; it", e)
        ) from None
    except Exception as e:
        raise BadInputError(user_error(f"The model factory {name!r}", e)) from e
    if not isinstance(model, torch.nn.Module):
        raise BadInputError(
            f"The model factory {name!r} returned {type(model).__name__}, not an nn.Module."
        )
    return model


def _module_fields(module: torch.nn.Module, name: str, task: str | None) -> dict[str, Any]:
    """What a built model says of its task, inputs and loss (ModelSpec fields)."""
    hf = _hf_model(module)
    cls = type(hf if hf is not None else module).__name__
    if hf is None:
        if task is not None:
            raise BadInputError(
                f"--task {task!r} cannot apply to {name!r}: it is a {cls}, not a transformers "
                "model, so memfit has no head to choose. Drop --task and give a make_batch "
                "beside the factory (file.py:build:make_batch)."
            )
        return {
            "task": "custom",
            "input_kind": "custom",
            "loss": "sum",
            "notes": [_NO_LOSS_NOTE.format(what=f"{name} ({cls}) is not a transformers model")],
        }
    config = hf.config
    model_type = getattr(config, "model_type", None)
    found = task_of_class(type(hf), model_type)
    if task is not None and task != found:
        raise BadInputError(
            f"--task {task!r} cannot apply to {name!r}: it is a {cls}, whose head is "
            f"{found or 'none memfit knows'}, and a model built outside memfit keeps its head. "
            f"Drop --task, or build the model for {task!r}."
        )
    notes: list[str] = []
    loss = "hf"
    if found is None:
        loss = "sum"
        notes.append(_NO_LOSS_NOTE.format(what=f"{cls} is not a head of transformers' Auto "
                                          "classes that memfit knows"))  # fmt: skip
    elif found == "base":
        loss = "sum"
        notes.append(_NO_LOSS_NOTE.format(what=f"{cls} is a transformers model without a head"))
    kind = input_kind_of(found or "base", model_type or "", config)
    image_size = getattr(config, "image_size", None) if kind == "image" else None
    return {
        "task": found or "custom",
        "input_kind": kind,
        "loss": loss,
        "max_positions": max_positions_of(config, kind),
        "image_size": image_size if isinstance(image_size, int) else None,
        "notes": notes,
    }


def _hf_model(module: torch.nn.Module) -> Any:
    """The transformers PreTrainedModel `module` is, or wraps (a peft model), else None."""
    mu = sys.modules.get("transformers.modeling_utils")
    if mu is None:  # transformers' models not imported: none can have been built
        return None
    if isinstance(module, mu.PreTrainedModel):
        return module
    peft = sys.modules.get("peft")
    if peft is not None and isinstance(module, peft.PeftModel):
        base = module.get_base_model()
        return base if isinstance(base, mu.PreTrainedModel) else None
    return None
