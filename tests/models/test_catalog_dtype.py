"""precision="auto" for built-in models: the catalog records the `torch_dtype` of each checked
model's hub config.json (memfit/models/_catalog_data.py says where each was read), so "auto"
picks what transformers 5 loads by default (from_pretrained(dtype="auto"))."""

from __future__ import annotations

import pytest
import torch

import memfit
from memfit.estimator.auto_precision import resolve_precision
from memfit.models.catalog import build_model, get_model, list_models
from memfit.models.sources import resolve_model
from memfit.precision import PRECISIONS, precision_of

GEN = memfit.Workload(mode="generate", precision="auto", prompt_len=8, new_tokens=2)


@pytest.mark.parametrize(
    ("name", "precision", "note"),
    [
        # config.json: "torch_dtype": "bfloat16"
        ("llama-3.1-8b", "bf16-true", "precision 'auto' is bf16-true: the checkpoint's dtype "
         "(bfloat16, config torch_dtype)."),
        ("qwen2.5-7b", "bf16-true", "(bfloat16, config torch_dtype)"),
        # config.json: "torch_dtype": "float16"
        ("llama-2-7b", "fp16-true", "precision 'auto' is fp16-true: the checkpoint's dtype "
         "(float16, config torch_dtype)."),
        ("phi-2", "fp16-true", "(float16, config torch_dtype)"),
        # GPT-2's and BERT's config.json name no dtype: transformers loads float32.
        ("gpt2", "fp32", "precision 'auto' is fp32: the config names no dtype, and transformers "
         "then loads float32."),
        ("bert-base-uncased", "fp32", "the config names no dtype"),
    ],
)  # fmt: skip
def test_auto_is_the_dtype_the_hub_config_names(name: str, precision: str, note: str) -> None:
    spec, w = resolve_precision(resolve_model(name), GEN)
    assert w.precision == precision
    assert any(note in n for n in spec.notes), spec.notes


def test_llama_3_1_8b_estimate_with_auto_is_bf16() -> None:
    est = memfit.estimate("llama-3.1-8b", GEN, gpu="l4")
    assert est.workload.precision == "bf16-true"


def test_every_recorded_dtype_maps_to_a_precision() -> None:
    """A dtype "auto" could not run (a typo, float8) would make it refuse the model."""
    for entry in list_models():
        dtype = entry.config.get("torch_dtype")
        assert dtype is None or dtype in {precision_of(p).dtype_name for p in PRECISIONS}, (
            entry.name,
            dtype,
        )
        assert "dtype" not in entry.config, entry.name  # the catalog uses the older name only


def test_the_recorded_dtype_does_not_change_the_build_dtype() -> None:
    """`torch_dtype` says how the checkpoint is stored; the model is still built in the dtype
    memfit asks for (a precision other than "auto" keeps its meaning)."""
    entry = get_model("llama-2-7b")
    assert entry.config["torch_dtype"] == "float16"
    assert {p.dtype for p in build_model(entry, num_layers=1).parameters()} == {torch.float32}
    bf16 = build_model(entry, num_layers=1, dtype=torch.bfloat16)
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
