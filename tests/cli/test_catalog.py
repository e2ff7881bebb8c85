"""`memfit models` and `memfit gpus`: the built-in catalogs, as JSON for scripts."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from memfit.cli.app import app


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_models_and_gpus_list():
    result = run("models", "--json")
    assert result.exit_code == 0
    names = {m["name"] for m in json.loads(result.output)}
    assert {"gpt2", "llama-2-7b", "resnet-50", "whisper-small"} <= names
    result = run("gpus", "--json")
    assert result.exit_code == 0
    gpus = {g["name"]: g for g in json.loads(result.output)}
    assert gpus["t4"]["flash_attention"] is False and gpus["h100-sxm"]["bf16"] is True


@pytest.mark.parametrize("width", ["60", "80"])
def test_gpu_and_model_names_are_never_cut(monkeypatch, width):
    # Issue 29: `memfit gpus` truncated the names users type at 80 columns.
    from memfit.cuda.target import list_gpus
    from memfit.models.catalog import list_models

    monkeypatch.setenv("COLUMNS", width)
    gpus = CliRunner().invoke(app, ["gpus"]).output
    models = CliRunner().invoke(app, ["models"]).output
    cells = {line.split("│")[1].strip() for line in (gpus + models).splitlines() if "│" in line}
    assert {g.name for g in list_gpus()} <= cells
    assert {m.name for m in list_models()} <= cells
