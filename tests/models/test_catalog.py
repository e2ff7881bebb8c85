"""Tests of the built-in model catalog (memfit.models.catalog) and memfit.models.zoo.

The parameter counts recorded in the catalog come from published sources or hand formulas
(see memfit/models/_catalog_data.py); here every entry is built on the meta device and must match.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from memfit.errors import BadInputError
from memfit.models.catalog import (
    INPUT_KINDS,
    TASKS,
    CatalogModel,
    build_model,
    get_model,
    list_models,
    supported_tasks,
)

ENTRIES = list_models()


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------- catalog shape


def test_catalog_has_at_least_40_entries() -> None:
    assert len(ENTRIES) >= 40


def test_required_models_are_present() -> None:
    required = [
        "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl",
        "bert-base-uncased", "bert-base-cased", "bert-large-uncased", "bert-large-cased",
        "distilbert-base-uncased", "roberta-base", "roberta-large", "albert-base-v2",
        "t5-small", "t5-base", "t5-large",
        "opt-125m", "opt-350m", "opt-1.3b", "opt-2.7b", "opt-6.7b",
        "pythia-70m", "pythia-160m", "pythia-410m", "pythia-1b", "pythia-1.4b", "pythia-2.8b",
        "pythia-6.9b", "pythia-12b", "bloom-560m", "bloom-7b1", "falcon-7b", "tinyllama-1.1b",
        "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b",
        "llama-3.1-8b", "llama-3.1-70b", "llama-3.2-1b", "llama-3.2-3b",
        "mistral-7b", "mixtral-8x7b", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b",
        "gemma-2b", "gemma-7b", "phi-2", "phi-3-mini-4k",
        "vit-base-patch16-224", "vit-large-patch16-224", "beit-base-patch16-224",
        "whisper-small", "resnet-18", "resnet-50",
    ]  # fmt: skip
    for name in required:
        get_model(name)  # raises if missing


def test_entries_are_well_formed() -> None:
    names = [e.name for e in ENTRIES]
    assert len(names) == len(set(names))
    for e in ENTRIES:
        assert e.name == e.name.lower() and " " not in e.name
        assert e.task in TASKS and e.input_kind in INPUT_KINDS
        assert e.parameter_count > 0
        assert supported_tasks(e)[0] == e.task
        if e.repeated_layers_key is not None:
            assert isinstance(e.config[e.repeated_layers_key], int), e.name
        if e.model_type is None:
            assert e.hf_id is None and e.repeated_layers_key is None
        if e.input_kind == "image":
            assert e.image_size == 224 and e.max_positions is None
        if e.task in ("seq2seq-lm", "speech-seq2seq"):
            assert e.repeated_layers_key is None


def test_config_is_read_only() -> None:
    entry = get_model("llama-3.1-8b")
    with pytest.raises(TypeError):
        entry.config["num_hidden_layers"] = 2  # type: ignore[index]
    before = dict(entry.config["rope_scaling"])
    build_model(entry, num_layers=1)
    assert entry.config["rope_scaling"] == before
    assert entry.config["num_hidden_layers"] == 32


def test_importing_the_catalog_imports_neither_transformers_nor_torchvision() -> None:
    code = (
        "import sys, memfit.models.catalog as c; c.list_models(); c.get_model('gpt2');"
        "print('transformers' in sys.modules, 'torchvision' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


# ----------------------------------------------------------------------------- exact counts


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_parameter_count_matches_the_catalog(entry: CatalogModel) -> None:
    model = build_model(entry)
    assert n_params(model) == entry.parameter_count
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert all(b.device.type == "meta" for b in model.buffers())


def test_big_model_builds_fast() -> None:
    build_model(get_model("gpt2"))  # first build pays for transformers' lazy imports
    start = time.perf_counter()
    model = build_model(get_model("llama-2-70b"))
    assert time.perf_counter() - start < 5.0
    assert n_params(model) == 68_976_648_192


def test_dtype_is_applied() -> None:
    model = build_model(get_model("qwen2.5-0.5b"), dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    cnn = build_model(get_model("resnet-18"), dtype=torch.float16)
    assert {p.dtype for p in cnn.parameters()} == {torch.float16}
    with pytest.raises(BadInputError):
        build_model(get_model("gpt2"), dtype=torch.int8)


# ----------------------------------------------------------------------------- look-up


def test_unknown_name_suggests_close_names() -> None:
    with pytest.raises(BadInputError) as info:
        get_model("llama-2-7")
    msg = str(info.value)
    assert "'llama-2-7'" in msg
    assert "llama-2-7b" in msg


def test_unknown_name_far_from_everything() -> None:
    with pytest.raises(BadInputError, match="zzzz-not-a-model"):
        get_model("zzzz-not-a-model")


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("meta-llama/Llama-2-7b-hf", "llama-2-7b"),
        ("META-LLAMA/LLAMA-2-7B-HF", "llama-2-7b"),
        ("GPT2-XL", "gpt2-xl"),
        ("openai-community/gpt2", "gpt2"),
        ("google-bert/bert-base-uncased", "bert-base-uncased"),
        ("mistral-7b", "mistral-7b-v0.1"),
        ("phi-1_5", "phi-1.5"),
        ("microsoft/phi-1_5", "phi-1.5"),
        ("resnet50", "resnet-50"),
        ("  Qwen/Qwen2.5-7B ", "qwen2.5-7b"),
        ("tinyllama", "tinyllama-1.1b"),
    ],
)
def test_aliases_and_hub_ids_resolve(key: str, name: str) -> None:
    assert get_model(key).name == name


def test_every_alias_and_hub_id_resolves_to_its_entry() -> None:
    for e in ENTRIES:
        for key in (e.name, *e.aliases, *([e.hf_id] if e.hf_id else [])):
            assert get_model(key) is e


# ----------------------------------------------------------------------------- num_layers


def test_num_layers_override_gpt2() -> None:
    # GPT2LMHeadModel, tied head: V*h + P*h + L*(12h^2 + 13h) + 2h with L=2
    v, p, h, layers = 50257, 1024, 768, 2
    expected = v * h + p * h + layers * (12 * h * h + 13 * h) + 2 * h
    assert expected == 53_561_088
    assert n_params(build_model(get_model("gpt2"), num_layers=layers)) == expected


def test_num_layers_override_llama() -> None:
    # untied Llama: 2*V*h + L*(4h^2 + 3*h*ff + 2h) + h with L=3
    v, h, ff, layers = 32000, 4096, 11008, 3
    expected = 2 * v * h + layers * (4 * h * h + 3 * h * ff + 2 * h) + h
    model = build_model(get_model("llama-2-7b"), num_layers=layers)
    assert n_params(model) == expected
    assert len(model.model.layers) == layers


def test_num_layers_needs_a_repeated_stack() -> None:
    for name in ("t5-small", "whisper-small", "resnet-50"):
        with pytest.raises(BadInputError, match=get_model(name).name):
            build_model(get_model(name), num_layers=2)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_num_layers_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(BadInputError):
        build_model(get_model("gpt2"), num_layers=bad)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- tasks


def test_unsupported_task_lists_the_supported_ones() -> None:
    with pytest.raises(BadInputError) as info:
        build_model(get_model("vit-base-patch16-224"), task="causal-lm")
    msg = str(info.value)
    assert "'causal-lm'" in msg and "image-classification" in msg and "base" in msg
    with pytest.raises(BadInputError, match="not-a-task"):
        build_model(get_model("gpt2"), task="not-a-task")


def test_supported_tasks_match_transformers_auto_mappings() -> None:
    from transformers.models.auto import modeling_auto as ma

    mapping = {
        "causal-lm": ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        "masked-lm": ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        "seq-classification": ma.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
        "token-classification": ma.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
        "base": ma.MODEL_MAPPING_NAMES,
        "seq2seq-lm": ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
        "image-classification": ma.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
        "speech-seq2seq": ma.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES,
    }
    for e in ENTRIES:
        if e.model_type is None:
            assert supported_tasks(e) == ("image-classification",)
            continue
        for task in supported_tasks(e):
            assert e.model_type in mapping[task], (e.name, task)


def _smallest_per_model_type() -> list[CatalogModel]:
    best: dict[str | None, CatalogModel] = {}
    for e in ENTRIES:
        if e.model_type not in best or e.parameter_count < best[e.model_type].parameter_count:
            best[e.model_type] = e
    return list(best.values())


@pytest.mark.parametrize("entry", _smallest_per_model_type(), ids=lambda e: e.name)
def test_every_supported_task_builds(entry: CatalogModel) -> None:
    for task in supported_tasks(entry):
        model = build_model(entry, task=task, num_layers=1 if entry.repeated_layers_key else None)
        assert {p.device.type for p in model.parameters()} == {"meta"}, task


def test_classification_heads_have_two_labels() -> None:
    # GPT2ForSequenceClassification = GPT2Model (same count as the tied LM) + score h*2, no bias
    model = build_model(get_model("gpt2"), task="seq-classification")
    assert n_params(model) == 124_439_808 + 768 * 2
    # BertForTokenClassification = BertModel without pooler + classifier h*2 + 2
    v, p, t, h, layers, ff = 30522, 512, 2, 768, 12, 3072
    body = v * h + p * h + t * h + 2 * h + layers * (4 * h * h + 2 * h * ff + 9 * h + ff)
    model = build_model(get_model("bert-base-uncased"), task="token-classification")
    assert n_params(model) == body + h * 2 + 2


# ----------------------------------------------------------------------------- attention


def test_sdpa_falls_back_to_eager_where_missing() -> None:
    model = build_model(get_model("bloom-560m"))
    assert model.config._attn_implementation == "eager"
    model = build_model(get_model("gpt2"), attn_implementation="eager")
    assert model.config._attn_implementation == "eager"
    assert build_model(get_model("gpt2")).config._attn_implementation == "sdpa"


def test_unknown_attention_implementation_is_bad_input() -> None:
    with pytest.raises(BadInputError, match="no-such-attention"):
        build_model(get_model("gpt2"), attn_implementation="no-such-attention")


# ----------------------------------------------------------------------------- zoo


def test_zoo_resnets_run_on_real_tensors() -> None:
    from memfit.models.zoo import resnet18, resnet50

    for ctor, count in ((resnet18, 11_689_512), (resnet50, 25_557_032)):
        model = ctor().eval()
        assert n_params(model) == count
        with torch.no_grad():
            out = model(torch.randn(1, 3, 64, 64))
        assert out.shape == (1, 1000)
    assert n_params(resnet18(num_classes=10)) == 11_689_512 - 513 * 990
