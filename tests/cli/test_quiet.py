"""What the `memfit` command prints: its own output only (issue: with the dev extras installed,
every traced command printed four log lines of torchao and torch's pytree on stderr)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from memfit.cli.app import FAST_EXIT


def test_a_traced_command_prints_nothing_on_stderr():
    pytest.importorskip("torchao")  # installed with the dev extras: what made the noise
    done = subprocess.run(
        [sys.executable, "-m", "memfit.cli", "estimate", "gpt2", "--seq", "16"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.startswith("gpt2: 124,439,808 parameters")


def test_version_names_memfit_torch_and_transformers():
    done = subprocess.run(
        [sys.executable, "-m", "memfit.cli", "--version"], capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    import torch

    assert done.stdout.startswith("memfit ")
    assert f"torch {torch.__version__}" in done.stdout and "transformers " in done.stdout


def test_the_user_s_code_is_not_quieted():
    # doctor, profile and find-batch run the user's script: their log lines are the user's.
    assert not {"doctor", "profile", "find-batch"} & FAST_EXIT
