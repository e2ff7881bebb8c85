"""The examples run on CPU (as they would on a GPU, unchanged): plan, apply, train, measure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize(
    "script, gpu",
    [("gpt2_finetune.py", "t4"), ("bert_classifier.py", "rtx-3060"), ("small_cnn.py", "rtx-4060")],
)
def test_example_runs(script, gpu):
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--gpu", gpu, "--steps", "2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"plan for {gpu}:" in out.stdout
    assert "applied:" in out.stdout and "optimizer adamw" in out.stdout
    assert "step 1: loss" in out.stdout
    assert "measured peak allocated on cpu" in out.stdout


def test_the_readme_data_file_is_written_as_described(tmp_path):
    # The README's `memfit data` example reads this file: 100,000 samples, the planted
    # whitespace run on line 73,412 (the line the README's output names).
    out = tmp_path / "train.jsonl"
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "make_train_jsonl.py"), str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    lines = out.read_text().splitlines()
    assert len(lines) == 100_000
    assert lines[73_411] == '{"text": "def f():' + " " * 100_000 + 'return 0"}'
    assert sum(" " * 100 in line for line in lines) == 1
