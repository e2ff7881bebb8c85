"""`memfit find-batch` on a simulated GPU."""

from __future__ import annotations

import json
import textwrap

import torch
from typer.testing import CliRunner

from memfit.cli.app import app

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
    from memfit.guard.batch_search import find_batch_size
    from memfit.models.sources import load_functions
    from memfit.simulation.simulated_gpu import simulate

    f = tmp_path / "trial.py"
    f.write_text(TRIAL)
    res = runner.invoke(app, ["find-batch", f"{f}:trial", "--gpu", "t4@400MiB", "--json",
                              "--target-batch", "96"])  # fmt: skip
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    trial, make_batch = load_functions(f"{f}:trial")
    g = trial.__globals__
    with simulate("t4@400MiB", model=g["model"], optimizer=g["opt"]):
        want = find_batch_size(
            trial,
            make_batch=make_batch,
            target_batch=96,
            model=g["model"],
            optimizer=g["opt"],
            progress=False,
        )
    assert got["batch_size"] == want.batch_size > 0
    assert got["micro_batch_size"] * got["grad_accum"] == 96 == got["effective_batch_size"]


def test_find_batch_nothing_fits_and_bad_input(tmp_path):
    from memfit.cuda.overhead import device_overhead
    from memfit.cuda.target import get_gpu

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


GAN_TRIAL = textwrap.dedent(
    """
    import torch
    from torch import nn

    torch.manual_seed(0)
    body = nn.Linear(256, 1024)  # inside G: counted once, with G
    G = nn.Sequential(body, nn.ReLU())
    D = nn.Linear(1024, 1024)
    loss_fn = nn.BCEWithLogitsLoss()  # no parameters: not a model
    opt = torch.optim.SGD(list(G.parameters()) + list(D.parameters()), lr=0.0)

    def make_batch(b):
        return torch.randn(b, 256)

    def trial(x):
        loss_fn(D(G(x)), torch.ones(x.shape[0], 1024)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    """
)


def test_find_batch_counts_every_model_and_ignores_parameterless_modules(tmp_path):
    from memfit.guard.batch_search import find_batch_size
    from memfit.models.sources import load_functions
    from memfit.simulation.simulated_gpu import simulate

    f = tmp_path / "gan.py"
    f.write_text(GAN_TRIAL)
    res = runner.invoke(app, ["find-batch", f"{f}:trial", "--gpu", "t4@400MiB", "--json"])
    assert res.exit_code == 0, res.output
    trial, make_batch = load_functions(f"{f}:trial")
    g = trial.__globals__
    found = {}
    for name, model in (("both", torch.nn.ModuleList([g["G"], g["D"]])), ("G", g["G"])):
        with simulate("t4@400MiB", model=model, optimizer=g["opt"]):
            found[name] = find_batch_size(
                trial, make_batch=make_batch, model=model, optimizer=g["opt"], progress=False
            ).batch_size
    # D's 4 MiB of weights (1024 x 1024 fp32) and their gradients cost batches: counting both
    # models gives the smaller answer, and the command counts both.
    assert found == {"both": 1008, "G": 1024}
    assert json.loads(res.stdout)["batch_size"] == found["both"]


def test_find_batch_without_gpu_on_a_cpu_only_machine_is_bad_input(tmp_path, monkeypatch):
    f = tmp_path / "trial.py"
    f.write_text(TRIAL)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    res = runner.invoke(app, ["find-batch", f"{f}:trial", "--no-progress"])
    assert res.exit_code == 2
    assert "Pass --gpu NAME to simulate a GPU on the CPU" in res.output


def test_find_batch_a_trial_error_is_shown_with_its_own_exit_code(tmp_path):
    f = tmp_path / "trial.py"
    f.write_text(
        "import torch\n"
        "from memfit.errors import BadInputError\n"
        "model = torch.nn.Linear(4, 4)\n"
        "def trial(b):\n"
        "    model(torch.randn(b, 5))\n"
        "def refuses(b):\n"
        "    raise BadInputError('batch must be even')\n"
    )
    res = runner.invoke(app, ["find-batch", f"{f}:trial", "--gpu", "t4", "--no-progress"])
    assert res.exit_code == 3
    assert f'File "{f}", line 5, in trial' in res.stderr
    assert "(raised by the trial at batch size 1, in memfit's find_batch_size)" in res.stderr
    # On fake tensors (the default with --gpu) the shape check is the meta kernel's.
    assert "error: the trial raised RuntimeError: a and b must have same reduction dim" in (
        res.stderr
    )
    real = ["find-batch", f"{f}:trial", "--gpu", "t4", "--real", "--no-progress"]
    res = runner.invoke(app, real)
    assert res.exit_code == 3
    assert "error: the trial raised RuntimeError: mat1 and mat2 shapes" in res.stderr
    res = runner.invoke(app, ["find-batch", f"{f}:refuses", "--gpu", "t4", "--no-progress"])
    assert res.exit_code == 2 and "batch must be even" in res.stderr
