"""`memfit data` on the command line: the 100,000-space line named among 100,000 samples with the
max length and the share it truncates; JSON; bad input refused with exit 2 and the fix."""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from memfit.cli.app import app

runner = CliRunner()

WORDS = ("the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "ran", "far", "away")


@pytest.fixture(scope="module")
def big_jsonl(tmp_path_factory):
    """100,000 samples of 4 to 40 words, and at line 61,803 one with a 100,000-space word."""
    rng = random.Random(0)
    p = tmp_path_factory.mktemp("big") / "train.jsonl"
    with p.open("w") as f:
        for i in range(1, 100_001):
            n = rng.randint(4, 40)
            text = "x" + " " * 100_000 + "y" if i == 61_803 else " ".join(rng.choices(WORDS, k=n))
            f.write(json.dumps({"text": text}) + "\n")
    return p


def _run(*args):
    return runner.invoke(app, ["data", *map(str, args)])


def test_the_space_word_line_and_the_max_length(big_jsonl, tiny_config):
    res = _run(big_jsonl, "--model", tiny_config, "--gpu", "rtx-4090", "--batch", "2")
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "100,000 samples" in out and "approximate" in out and "estimates" in out
    # The space "word" is 100,002 characters: ceil(100,002 / 4) = 25,001 approximate tokens.
    assert "line 61,803      25,001 tokens  'x⟨100,000 spaces⟩y'" in out
    assert "line 61,803     100,000 characters" in out  # longest whitespace run
    assert "max length: 64 (every position the model has) tokens" in out
    # Samples over 64 approximate tokens: only the space line (40 words are at most 40).
    assert "truncated: 1 of 100,000 samples (0.001 %)" in out
    assert "vocabulary coverage: needs token ids; pass --tokenizer DIR" in out


def test_json_with_a_tokenizer(tmp_path, words_tok, tiny_config):
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["the cat", "the dog sat"]))
    res = _run(p, "--model", tiny_config, "--tokenizer", words_tok, "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["tokens"]["max"] == 3 and out["longest"][0] == {
        "line": 2, "value": 3, "tokens": 3, "preview": "the dog sat"
    }  # fmt: skip
    # ids the 2, cat 1, dog 1, sat 1 (of 5 tokens): 95 % needs all 4; 300 rows - 4 = 296.
    voc = out["vocabulary"]
    assert voc["ids_seen"] == 4 and voc["needed"]["0.95"] == 4
    # 296 rows x hidden 32, tied, fp32 AdamW: 37,888 B weights, as much gradient, twice state.
    assert voc["savings"][0]["removed"] == 296 and voc["savings"][0]["parameters"] == 37_888
    assert voc["savings"][0]["optimizer_state"] == 75_776
    assert "fit" not in out


def test_the_tokenizer_beside_the_model_config(tmp_path, words_tok):
    from tests.data.conftest import tiny_gpt2_config

    config = tiny_gpt2_config(words_tok)  # the folder now holds config.json and tokenizer.json
    p = tmp_path / "d.txt"
    p.write_text("the cat\n")
    res = _run(p, "--model", config)
    assert res.exit_code == 0, res.output
    assert f"tokenizer: {words_tok}" in res.stdout and "2 of 8 ids occur" in res.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{d}/missing.jsonl"], "'{d}/missing.jsonl' does not exist"),
        (
            ["{d}/d.jsonl", "--field", "body"],
            "no column 'body' (in line 1); the columns present are 'text', 'id'",
        ),
        (["{d}/d.jsonl", "--tokenizer", "{d}"], "has no tokenizer.json (it holds d.jsonl"),
        (
            ["{d}/d.jsonl", "--batch", "4"],
            "--batch size the max length and the vocabulary savings, which need --gpu",
        ),
        (["{d}/d.jsonl", "--alloc-conf", "expandable_segments:True"], "--alloc-conf"),
        (["{d}/d.jsonl", "--format", "csv"], "empty: a CSV file needs a header row"),
        (["{d}/d.jsonl", "--gpu", "rtx-9999"], "rtx-9999"),
        (["{d}/d.jsonl", "--top", "-1"], "top=-1 must be a whole number"),
    ],
)
def test_bad_input_exits_2(tmp_path, tiny_config, args, message):
    (tmp_path / "d.jsonl").write_text('{"text": "the cat", "id": 1}\n')
    if "csv" in args:
        (tmp_path / "d.jsonl").write_text("")
    d = str(tmp_path)
    res = _run(*[a.format(d=d) for a in args], "--model", tiny_config)
    assert res.exit_code == 2, res.output
    assert message.format(d=d) in res.output and "Traceback" not in res.output


def test_checkpointing_needs_the_gpu_even_with_a_tokenizer(tmp_path, words_tok, tiny_config):
    (tmp_path / "d.txt").write_text("the cat\n")
    res = _run(tmp_path / "d.txt", "--model", tiny_config, "--tokenizer", words_tok,
               "--checkpointing", "blocks", "--precision", "bf16-mixed")  # fmt: skip
    assert res.exit_code == 2
    assert "--checkpointing size the max length, which need --gpu (max length)" in res.output


def test_nothing_fits_exits_1(tmp_path, tiny_config):
    (tmp_path / "d.jsonl").write_text('{"text": "the cat"}\n')
    # 520 MiB is less than the CUDA context and workspaces alone: not one token fits.
    res = _run(tmp_path / "d.jsonl", "--model", tiny_config, "--gpu", "rtx-4090@520MiB")
    assert res.exit_code == 1, res.output
    assert "no sequence length fits: every sample would be cut" in res.stdout
