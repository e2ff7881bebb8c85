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
