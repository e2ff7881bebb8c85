"""An estimate with each optimizer row counts exactly the row's state as optimizer state, and
the CLI and the Trainer integration name the new rows."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

import memfit
from memfit.cli.app import app
from memfit.events import Category
from memfit.optimizers import SPECS
from tests.conftest import tiny_gpt2

#: Rows added for the optimizers a Trainer user can name (issue 30), and two old ones.
NEW = ["rmsprop", "adagrad", "torchao-adamw-8bit", "torchao-adamw-4bit", "lion-8bit",
       "ademamix", "ademamix-8bit", "schedule-free-adamw", "adamw", "adamw-8bit"]  # fmt: skip


def _device_state(est: memfit.Estimate) -> int:
    records = est.profile.records.values()
    return sum(r.nbytes for r in records if r.category == Category.OPTIMIZER_STATE and not r.host)


@pytest.mark.parametrize("name", NEW)
def test_estimate_counts_the_rows_state(name: str) -> None:
    model = tiny_gpt2(2, n_embd=64, vocab=256, n_positions=64)
    w = memfit.Workload(batch_size=2, seq_len=32, optimizer=name)
    est = memfit.estimate(model, w)
    spec = SPECS[name]
    # Each trainable parameter once (GPT-2 ties lm_head to wte).
    shapes = [tuple(p.shape) for p in model.parameters() if p.requires_grad]
    want = sum(spec.state_bytes(s, torch.float32) for s in shapes)
    want += spec.shared_bytes(shapes, torch.float32)
    assert _device_state(est) == want


def test_the_cli_takes_a_new_row_and_names_them_all() -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["estimate", "gpt2", "--seq", "64", "--optimizer", "adagrad"])
    assert res.exit_code == 0, res.output
    assert "optimizer adagrad" in res.output
    bad = runner.invoke(app, ["estimate", "gpt2", "--optimizer", "adamx"])
    assert bad.exit_code == 2
    assert "schedule-free-adamw" in bad.output


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda ps: torch.optim.RMSprop(ps), "rmsprop"),
        (lambda ps: torch.optim.Adagrad(ps), "adagrad"),
        (lambda ps: __import__("torchao.optim").optim.AdamW8bit(ps), "torchao-adamw-8bit"),
        (lambda ps: __import__("torchao.optim").optim.AdamW4bit(ps), "torchao-adamw-4bit"),
        (lambda ps: __import__("bitsandbytes").optim.Lion8bit(ps), "lion-8bit"),
        (lambda ps: __import__("bitsandbytes").optim.Lion(ps), "lion-32bit"),
        (lambda ps: __import__("bitsandbytes").optim.AdEMAMix(ps), "ademamix"),
        (lambda ps: __import__("bitsandbytes").optim.AdEMAMix8bit(ps), "ademamix-8bit"),
    ],
)
def test_trainer_integration_reads_the_new_rows(make, name) -> None:
    from memfit.integrations._reading import optimizer_layout

    params = [torch.nn.Parameter(torch.zeros(64, 64))]
    assert optimizer_layout(make(params)) == name
