"""`memfit serve` on the command line: the figures as printed, the JSON, the exit codes, and the
flags in its messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memfit.cli import serve
from memfit.cli.app import app
from memfit.planner.serving import DEFAULT_BLOCK_SIZE, DEFAULT_GPU_MEMORY_UTILIZATION
from tests.conftest import tiny_llama_config

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_llama_config(tmp_path_factory.mktemp("serve"))


def test_cli_defaults_are_the_library_constants() -> None:
    assert serve._UTILIZATION == DEFAULT_GPU_MEMORY_UTILIZATION
    assert serve._BLOCK_SIZE == DEFAULT_BLOCK_SIZE


def test_serve_prints_blocks_tokens_and_sequences(tiny: str) -> None:
    res = runner.invoke(app, ["serve", tiny, "--gpu", "rtx-2060", "--context-len", "50"])
    assert res.exit_code == 0, res.output
    doc = json.loads(
        runner.invoke(
            app, ["serve", tiny, "--gpu", "rtx-2060", "--context-len", "50", "--json"]
        ).output
    )
    assert f"  KV blocks                 {doc['num_blocks']:>12,}" in res.output
    assert f"  KV tokens                 {doc['kv_tokens']:>12,}" in res.output
    assert f"sequences of 50 tokens at once: {doc['num_blocks'] // 4:,}" in res.output
    assert "longest sequence that fits: 64 tokens (the model has 64)" in res.output


def test_serve_exit_codes(tiny: str) -> None:
    res = runner.invoke(app, ["serve", tiny, "--gpu", "rtx-2060", "--block-size", "10"])
    assert res.exit_code == 2
    assert "--block-size 10 is not one vLLM accepts" in res.output
    res = runner.invoke(app, ["serve", tiny, "--gpu", "rtx-2060", "--context-len", "65"])
    assert res.exit_code == 2 and "--context-len 65 is longer than" in res.output


def test_a_context_that_does_not_fit_exits_1(tmp_path: Path) -> None:
    wide = dict(
        model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=128,
        hidden_size=4096, intermediate_size=256, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=131072, bos_token_id=None,
        eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(wide))
    args = ["serve", str(path), "--gpu", "rtx-2060", "--gpu-memory-utilization", "0.2"]
    res = runner.invoke(app, args)
    assert res.exit_code == 1, res.output
    assert "DOES NOT FIT: one sequence of 131072 tokens" in res.output


def test_weights_beyond_the_engine_memory_say_so(tmp_path: Path) -> None:
    # Issue: with weights larger than the card, serve said "Use --context-len 0 or less".
    path = tiny_llama_config(
        tmp_path, vocab_size=128000, hidden_size=4096, intermediate_size=256,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
    )  # fmt: skip
    args = ["serve", str(path), "--gpu", "rtx-2060", "--gpu-memory-utilization", "0.2"]
    res = runner.invoke(app, args)
    assert res.exit_code == 1, res.output
    text = " ".join(res.output.split())
    assert "DOES NOT FIT: the weights alone leave no room for one KV block" in text
    assert "--context-len" not in text.split("DOES NOT FIT")[1]
