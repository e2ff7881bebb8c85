"""`memfit max-batch` and `memfit max-seq` on the command line: every workload option, the
search cap said as a lower bound, and a memory curve that answers nothing refused."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from memfit.cli.app import app
from memfit.planner.limits import MAX_BATCH_UPPER

runner = CliRunner()

FACTORY = """
import torch

def build():
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

def make_batch(batch_size):
    return torch.randn(batch_size, 16)

def same_batch(batch_size):  # ignores the batch size: memory cannot depend on it
    return torch.randn(4, 16)
"""


@pytest.fixture
def factory(tmp_path):
    f = tmp_path / "tiny.py"
    f.write_text(FACTORY)
    return str(f)


def test_max_batch_at_the_cap_is_a_lower_bound(factory):
    # A 356-parameter MLP fits a T4 at every batch the search tries: the answer is the cap,
    # and that is "at least", not "the largest".
    res = runner.invoke(app, ["max-batch", f"{factory}:build", "--gpu", "t4", "--optimizer", "sgd"])
    assert res.exit_code == 0, res.output
    assert f"at least {MAX_BATCH_UPPER} (the search cap; more may fit)" in res.output
    res = runner.invoke(
        app, ["max-batch", f"{factory}:build", "--gpu", "t4", "--optimizer", "sgd", "--json"]
    )
    out = json.loads(res.stdout)
    assert out["largest"] == MAX_BATCH_UPPER and out["capped"] is True
    assert [p["value"] for p in out["curve"]] == [2**k for k in range(13)]


def test_max_batch_refuses_a_flat_curve(factory):
    res = runner.invoke(app, ["max-batch", f"{factory}:build:same_batch", "--gpu", "t4"])
    assert res.exit_code == 2
    assert "does not change with --batch: from --batch 1 to --batch 4096" in res.output
    assert "Traceback" not in res.output


def test_max_seq_needs_tokens_memfit_makes(factory):
    res = runner.invoke(app, ["max-seq", f"{factory}:build", "--gpu", "t4"])
    assert res.exit_code == 2
    assert "makes its own inputs (make_batch)" in res.output
    res = runner.invoke(app, ["max-seq", "vit-base-patch16-224", "--gpu", "t4"])
    assert res.exit_code == 2 and "is image, not tokens" in res.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        # The workload options estimate takes reach the search (and are checked as there).
        (["--lora-rank", "4", "--mode", "inference"], "--lora-rank 4: only a training step"),
        (["--grad-accum", "0"], "--grad-accum must be a positive integer"),
        (["--gpus", "2", "--offload-optimizer"], "(--gpus 2), memfit does not model"),
        (["--attention", "flash"], "Unknown attention 'flash'"),
        (["--embedding-on-cpu", "--tie-embeddings"], "conflict"),
        (["--lora-targets", "q_proj"], "--lora-targets needs --lora-rank"),
        (["--image-size", "224"], "--image-size 224 does not apply to 'gpt2', a text model"),
        (["--alloc-conf", "expandable_segmentz:True"], "expandable_segments"),
        (["--seq", "4096"], "Use --seq 1024 or less"),
    ],
)
def test_max_batch_takes_and_checks_every_workload_option(args, needle):
    res = runner.invoke(app, ["max-batch", "gpt2", "--gpu", "t4", *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output


def test_max_seq_with_workload_options_up_to_the_model_positions():
    # gpt2 has 1024 positions: LoRA inference options are refused, and a search that fits all
    # the way says the answer is the model's own limit, not memfit's cap.
    res = runner.invoke(
        app,
        ["max-seq", "gpt2", "--gpu", "h100", "--lora-rank", "8", "--grad-accum", "2",
         "--precision", "bf16-mixed", "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["largest"] == 1024 and out["upper"] == 1024 and out["capped"] is False
