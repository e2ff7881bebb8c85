"""precision="auto": the checkpoint's dtype (the config's `dtype`, else `torch_dtype`; a built
model's parameters), resolved once before tracing; inference and generation only."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import memfit
from memfit.errors import BadInputError
from memfit.estimator.auto_precision import resolve_precision
from memfit.estimator.generation.figures import trace_generation
from memfit.models.sources import resolve_model
from memfit.planner.limits import max_batch
from memfit.planner.serving import serving_capacity
from tests.conftest import tiny_llama_config

GEN = memfit.Workload(mode="generate", precision="auto", prompt_len=8, new_tokens=2)


def _config(tmp: Path, **over: object) -> str:
    return tiny_llama_config(tmp, **over)


@pytest.mark.parametrize(
    ("fields", "precision", "said"),
    [
        ({"torch_dtype": "bfloat16"}, "bf16-true", "(bfloat16, config torch_dtype)"),
        ({"dtype": "float16"}, "fp16-true", "(float16, config dtype)"),
        # transformers 5 reads `dtype` before the older `torch_dtype`.
        ({"dtype": "bfloat16", "torch_dtype": "float32"}, "bf16-true", "config dtype"),
        ({"torch_dtype": "float32"}, "fp32", "(float32, config torch_dtype)"),
        ({}, "fp32", "the config names no dtype, and transformers then loads float32"),
    ],
)
def test_config_dtype(tmp_path: Path, fields: dict, precision: str, said: str) -> None:
    spec, w = resolve_precision(resolve_model(_config(tmp_path, **fields)), GEN)
    assert w.precision == precision
    assert w.with_(precision="auto") == GEN  # nothing else changed
    assert said in spec.notes[-1] and spec.notes[-1].startswith(f"precision 'auto' is {precision}")


def test_a_given_precision_is_left_alone(tmp_path: Path) -> None:
    spec = resolve_model(_config(tmp_path, torch_dtype="bfloat16"))
    w = GEN.with_(precision="fp16-true")
    assert resolve_precision(spec, w) == (spec, w)


def test_a_built_model_says_by_its_parameters() -> None:
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg)
    assert resolve_precision(resolve_model(model), GEN)[1].precision == "fp32"
    model.to(torch.bfloat16)
    spec, w = resolve_precision(resolve_model(model), GEN)
    assert w.precision == "bf16-true" and "(bfloat16, the model's parameters)" in spec.notes[-1]


def test_refusals_name_the_value_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match=r"precision='auto' .* training step needs a recipe"):
        memfit.Workload(precision="auto")
    memfit.Workload(mode="inference", precision="auto")  # inference and generation take it
    fp8 = resolve_model(_config(tmp_path, torch_dtype="float8_e4m3fn"))
    with pytest.raises(BadInputError, match=r"stored in float8_e4m3fn .* Give the precision"):
        resolve_precision(fp8, GEN)
    # Nothing downstream of the resolution takes "auto".
    with pytest.raises(BadInputError, match=r"precision='auto' names the checkpoint's dtype"):
        trace_generation(resolve_model(_config(tmp_path)), GEN, None)


def test_limits_and_serving_resolve_it(tmp_path: Path) -> None:
    bf16 = _config(tmp_path, torch_dtype="bfloat16")
    w = GEN.with_(prompt_len=32)
    auto = max_batch(bf16, w, gpu="rtx-2060")
    given = max_batch(bf16, w.with_(precision="bf16-true"), gpu="rtx-2060")
    assert auto.workload is not None and auto.workload.precision == "bf16-true"
    assert (auto.largest, auto.curve) == (given.largest, given.curve)
    cap = serving_capacity(bf16, "rtx-2060", precision="auto", context_len=50)
    assert cap.precision == "bf16-true"
    assert cap.kv_tokens == serving_capacity(bf16, "rtx-2060", context_len=50).kv_tokens
    with pytest.raises(BadInputError, match=r"float32 checkpoint, which vLLM's dtype='auto'"):
        serving_capacity(_config(tmp_path), "rtx-2060", precision="auto", context_len=50)
