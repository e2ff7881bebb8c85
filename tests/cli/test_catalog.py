"""`memfit models` and `memfit gpus`: the built-in catalogs, as JSON for scripts."""

from __future__ import annotations

import json

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
