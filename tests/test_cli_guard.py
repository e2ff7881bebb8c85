"""`memfit find-batch` on a simulated GPU."""

from __future__ import annotations

import json
import textwrap

from typer.testing import CliRunner

from memfit.cli import app

runner = CliRunner()

TRIAL = textwrap.dedent(
    """
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.0)

    def make_batch(b):
        return torch.randn(b, 1024)

    def trial(x):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    """
)


def test_find_batch_agrees_with_the_library(tmp_path):
    from memfit.batch_search import find_batch_size
    from memfit.gpu_simulation import simulate
    from memfit.sources import load_functions

    f = tmp_path / "trial.py"
    f.write_text(TRIAL)
    res = runner.invoke(app, ["find-batch", f"{f}:trial", "--gpu", "t4@400MiB", "--json",
                              "--target-batch", "96"])  # fmt: skip
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    trial, make_batch = load_functions(f"{f}:trial")
    g = trial.__globals__
    with simulate("t4@400MiB", model=g["model"], optimizer=g["opt"]):
        want = find_batch_size(trial, make_batch=make_batch, target_batch=96, progress=False)
    assert got["batch_size"] == want.batch_size > 0
    assert got["micro_batch_size"] * got["grad_accum"] == 96 == got["effective_batch_size"]


def test_find_batch_nothing_fits_and_bad_input(tmp_path):
    from memfit.device_overhead import device_overhead
    from memfit.gpus import get_gpu

    f = tmp_path / "trial.py"
    f.write_text(TRIAL)
    # 1 MiB above the CUDA context: not even the 16 MiB first weight fits.
    budget = device_overhead(get_gpu("t4")).outside_allocator_bytes() + 2**20
    res = runner.invoke(app, ["find-batch", f"{f}:trial", "--gpu", f"t4@{budget}B",
                              "--no-progress"])  # fmt: skip
    assert res.exit_code == 1 and "out of memory" in res.output
    res = runner.invoke(app, ["find-batch", f"{f}:nope", "--gpu", "t4"])
    assert res.exit_code == 2 and "has no function 'nope'" in res.output
    res = runner.invoke(app, ["find-batch", f"{f}:trial", "--gpu", "t5"])
    assert res.exit_code == 2 and "Unknown GPU 't5'" in res.output
