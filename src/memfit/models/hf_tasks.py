"""The task (head) of a transformers model, read from transformers' own Auto mappings.

A memfit task names a head memfit can feed and train: the batch it makes and the loss it traces
follow from it (memfit.estimator.trace.step_runner.make_batch_for). transformers lists the class of
each
head of each ``model_type`` (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES["llama"] == "LlamaForCausalLM"``);
reading those lists, rather than a table of memfit's or a guess from a class name's suffix, gives
every model type transformers knows the tasks it really has.

Importing this module does not import transformers; each function imports it when called.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.errors import BadInputError, closest
from memfit.models.catalog import TASKS

__all__ = [
    "TASK_MAPPINGS",
    "check_model_type",
    "default_task",
    "input_kind_of",
    "max_positions_of",
    "task_of_class",
    "tasks_of_model_type",
]

#: The transformers Auto mapping (``transformers.models.auto.modeling_auto``) listing, for each
#: model_type, the class of each memfit task.
TASK_MAPPINGS: dict[str, str] = {
    "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "masked-lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "seq-classification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "token-classification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "base": "MODEL_MAPPING_NAMES",
    "seq2seq-lm": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "image-classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "speech-seq2seq": "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
}

#: When one class heads several tasks (BartForConditionalGeneration is transformers' seq2seq LM
#: and its masked LM), the first of these is its task.
_CLASS_PRECEDENCE = (
    "speech-seq2seq",
    "seq2seq-lm",
    "causal-lm",
    "masked-lm",
    "image-classification",
    "seq-classification",
    "token-classification",
    "base",
)

#: Tasks that are a training objective of their own, from which a default is chosen.
_OBJECTIVES = ("seq2seq-lm", "speech-seq2seq", "causal-lm", "masked-lm", "image-classification")
_SEQ2SEQ = ("seq2seq-lm", "speech-seq2seq")


def _mapping(task: str) -> Mapping[str, Any]:
    from transformers.models.auto import modeling_auto

    return getattr(modeling_auto, TASK_MAPPINGS[task])


def _classes(value: Any) -> tuple[str, ...]:
    """A mapping value: one class name, or a tuple of them (DeiT's two image classifiers)."""
    return (value,) if isinstance(value, str) else tuple(value)


def check_model_type(model_type: str, origin: str) -> None:
    """Raise BadInputError when transformers does not know `model_type`, naming the closest.

    `origin` says where the value comes from (the config file), for the message.
    """
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type in CONFIG_MAPPING_NAMES:
        return
    hint = closest(model_type, list(CONFIG_MAPPING_NAMES))
    raise BadInputError(
        f"{origin}: model_type {model_type!r} is unknown to transformers "
        f"{transformers.__version__}.{hint} Fix the name, or upgrade transformers if the "
        "model is newer than it."
    )


def tasks_of_model_type(model_type: str) -> tuple[str, ...]:
    """The memfit tasks transformers has a class for, for `model_type`, in `TASKS` order."""
    return tuple(t for t in TASKS if model_type in _mapping(t))


def _task_of_name(name: str, model_type: str | None) -> str | None:
    """The task whose Auto mapping lists class `name`: for `model_type` first, then for any
    model type (a class of one family reused by another)."""
    if model_type is not None:
        for task in _CLASS_PRECEDENCE:
            value = _mapping(task).get(model_type)
            if value is not None and name in _classes(value):
                return task
    for task in _CLASS_PRECEDENCE:
        if any(name in _classes(v) for v in _mapping(task).values()):
            return task
    return None


def task_of_class(cls: type, model_type: str | None) -> str | None:
    """The task of a model class: that of the first class of its MRO an Auto mapping lists
    (a user's subclass of LlamaForCausalLM is a causal LM). None when no mapping lists the
    class or a parent (a model class of the user's own, BertForPreTraining,
    LlamaForQuestionAnswering, ...)."""
    for c in cls.__mro__:
        task = _task_of_name(c.__name__, model_type)
        if task is not None:
            return task
    return None


def default_task(model_type: str, config: Any, architectures: list[str], origin: str) -> str:
    """The task a config describes when none is given, by this rule:

    1. the class the config's `architectures` names, when an Auto mapping lists it;
    2. else the class transformers pretrains the model type with
       (MODEL_FOR_PRETRAINING_MAPPING_NAMES: GPT2LMHeadModel, BartForConditionalGeneration),
       when an Auto mapping lists it as one of the model type's tasks;
    3. else the one training objective (seq2seq-lm, speech-seq2seq, causal-lm, masked-lm,
       image-classification) transformers has for the model type: among the seq2seq ones for
       an encoder-decoder config (`config.is_encoder_decoder`), among the others otherwise.

    When rule 3 leaves no task or more than one, BadInputError asks for `--task` and lists
    the tasks the model type has (BERT without `architectures`: causal-lm or masked-lm).
    """
    from transformers.models.auto.modeling_auto import MODEL_FOR_PRETRAINING_MAPPING_NAMES

    available = tasks_of_model_type(model_type)
    for name in (*architectures[:1], MODEL_FOR_PRETRAINING_MAPPING_NAMES.get(model_type)):
        task = _task_of_name(name, model_type) if name else None
        if task in available:
            return task
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    fitting = [t for t in _OBJECTIVES if t in available and (t in _SEQ2SEQ) == encoder_decoder]
    if len(fitting) == 1:
        return fitting[0]
    why = (
        f"several tasks fit it ({', '.join(fitting)})"
        if fitting
        else "transformers has no head for it that memfit trains"
    )
    raise BadInputError(
        f"{origin}: memfit cannot tell which head to build for model_type {model_type!r}: the "
        f"config names no 'architectures' and {why}. Pass the task (--task, or task=): one of "
        f"{', '.join(available) or 'none memfit knows'}."
    )


def input_kind_of(task: str, model_type: str, config: Any) -> str:
    """The inputs memfit makes for `task` on a model of `config` (see catalog.INPUT_KINDS).

    The heads that fix their inputs decide (a seq2seq LM takes encoder and decoder tokens, a
    causal LM on BART's decoder takes tokens); the others (classification, base) take what the
    whole model takes: an encoder-decoder's two sequences (or log-mel frames and tokens when
    the config has `num_mel_bins`), a vision model's pixels, else tokens.
    """
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_MAPPING_NAMES

    fixed = {
        "speech-seq2seq": "audio",
        "seq2seq-lm": "seq2seq-tokens",
        "image-classification": "image",
        "causal-lm": "tokens",
        "masked-lm": "tokens",
    }
    if task in fixed:
        return fixed[task]
    if getattr(config, "is_encoder_decoder", False):
        return "audio" if hasattr(config, "num_mel_bins") else "seq2seq-tokens"
    if model_type in MODEL_FOR_IMAGE_MAPPING_NAMES:
        return "image"
    return "tokens"


def max_positions_of(config: Any, input_kind: str) -> int | None:
    """The longest token sequence the model takes: its position table's length; None when its
    positions are relative (T5) or its input is not a token sequence."""
    if input_kind == "image":
        return None
    if input_kind == "audio":
        value = getattr(config, "max_target_positions", None)
    else:
        value = getattr(config, "max_position_embeddings", None) or getattr(
            config, "n_positions", None
        )
    return value if isinstance(value, int) and not isinstance(value, bool) else None
