"""memfit.doctor: each anti-pattern found at the right line with hand-computed bytes; clean loops
give nothing; the script runner and the `doctor` command.

The scripts in tests/doctor_scripts share one tiny MLP (fp32, 4 bytes per element):
B=4 rows, IN=16 -> H=32 -> OUT=8, trained for STEPS=6 optimizer steps. So one batch of outputs
is B*OUT*4 = 128 B and one batch of hidden activations is B*H*4 = 512 B.
"""

from __future__ import annotations

import dataclasses
import inspect
import runpy
from pathlib import Path

import pytest
import torch
from torch import nn

from memfit.diagnosis.doctor import (
    EVAL_WITHOUT_NO_GRAD,
    GRAPH_KEPT_ALIVE,
    GROWTH,
    RETAIN_GRAPH_IN_LOOP,
    doctor,
)
from memfit.diagnosis.findings import Finding
from memfit.diagnosis.sites import describe_holder
from memfit.measurement.script_runner import run_script

SCRIPTS = Path(__file__).parents[1] / "doctor_scripts"
B, IN, H, OUT, STEPS = 4, 16, 32, 8, 6
F32 = 4
OUT_BYTES = B * OUT * F32  # 128: one batch of model outputs
HIDDEN_BYTES = B * H * F32  # 512: one batch of ReLU outputs (saved by ReLU and by fc2)

# (script, kind, bytes by hand, holder)
LEAKS = [
    # `last_loss` holds the previous loss: a 0-d fp32 tensor; backward already freed what its
    # graph saved, so the loss itself is all it pins.
    ("leak_loss_held.py", GRAPH_KEPT_ALIVE, F32, "last_loss"),
    # `total_loss` (one fp32 scalar) chains every step's graph; their saved tensors were freed.
    ("leak_total_loss.py", GRAPH_KEPT_ALIVE, F32, "total_loss"),
    # At the last boundary the list holds the outputs of the STEPS-1 earlier steps.
    ("leak_outputs_list.py", GRAPH_KEPT_ALIVE, (STEPS - 1) * OUT_BYTES, "outputs (list)"),
    # The graph of one validation pass alone keeps the hidden activations (saved by ReLU and fc2)
    # and the batch xv (saved by fc1 for its weight gradient) alive until the next pass
    # rebinds `out`; the output and the target are held by variables anyway (mse_loss's node
    # dies at `.item()`), the weights are parameters.
    ("eval_without_no_grad.py", EVAL_WITHOUT_NO_GRAD, HIDDEN_BYTES + B * IN * F32, None),
    # A retained graph, once the next step rebinds `out` and `loss`, is all that keeps the
    # hidden activations and the output; x and y stay alive in their variables.
    ("retain_graph_loop.py", RETAIN_GRAPH_IN_LOOP, HIDDEN_BYTES + OUT_BYTES, None),
    # `history` gains one batch of outputs per step; growth is measured from boundary 2
    # (boundaries 0 and 1 are warm-up) to boundary STEPS-1.
    ("growth.py", GROWTH, (STEPS - 3) * OUT_BYTES, "history"),
]


def marker_line(path: Path) -> int:
    lines = path.read_text().splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if line.rstrip().endswith("# LEAK")]
    assert len(hits) == 1, path
    return hits[0]


def diagnose(name: str) -> tuple[list[Finding], int]:
    dr = doctor()
    run_script(SCRIPTS / name, [], wrap=dr)
    return dr.findings, dr.steps


def test_scripts_share_the_sizes_used_here():
    for path in SCRIPTS.glob("*.py"):
        assert f"B, IN, H, OUT, STEPS = {B}, {IN}, {H}, {OUT}, {STEPS}" in path.read_text(), path


def test_scripts_run_as_plain_python(capsys):
    for path in sorted(SCRIPTS.glob("*.py")):
        runpy.run_path(str(path), run_name="__main__")  # what `python path` does


@pytest.mark.parametrize(("name", "kind", "nbytes", "holder"), LEAKS, ids=[x[0] for x in LEAKS])
def test_each_anti_pattern_is_found_at_its_line(name, kind, nbytes, holder):
    findings, steps = diagnose(name)
    assert steps == STEPS
    assert [f.kind for f in findings] == [kind], findings
    f = findings[0]
    assert Path(f.filename) == SCRIPTS / name
    assert f.lineno == marker_line(SCRIPTS / name)
    assert abs(f.bytes - nbytes) <= 0.01 * nbytes, (f.bytes, nbytes)
    assert f.holder == holder
    assert f.message and f.fix


def test_fixes_name_the_remedy():
    fixes = {name: diagnose(name)[0][0].fix for name, *_ in LEAKS}
    assert "total_loss += loss.item()" in fixes["leak_total_loss.py"]
    assert "last_loss = loss.item()" in fixes["leak_loss_held.py"]
    assert ".detach()" in fixes["leak_outputs_list.py"]
    assert "torch.no_grad()" in fixes["eval_without_no_grad.py"]
    assert "retain_graph=True" in fixes["retain_graph_loop.py"]


@pytest.mark.parametrize("name", sorted(p.name for p in SCRIPTS.glob("clean_*.py")))
def test_clean_loops_have_no_finding(name):
    findings, steps = diagnose(name)
    assert findings == []
    assert steps == STEPS


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, H), nn.ReLU(), nn.Linear(H, OUT))


def test_gradients_are_unchanged_under_the_doctor():
    x = torch.randn(B, IN)
    grads = []
    for watched in (False, True):
        model = _mlp()
        if watched:
            with doctor():
                model(x).pow(2).mean().backward()
        else:
            model(x).pow(2).mean().backward()
        grads.append([p.grad for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_manual_steps_and_a_local_holder():
    model, x = _mlp(), torch.randn(B, IN)
    history = []
    with doctor() as dr:
        for _ in range(4):
            out, line = model(x), inspect.currentframe().f_lineno
            out.sum().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
                    p.grad = None
            history.append(out)
            dr.step()
    (f,) = dr.findings
    assert (f.kind, f.lineno, f.holder) == (GRAPH_KEPT_ALIVE, line, "history (list)")
    assert f.bytes == 3 * OUT_BYTES  # at the last of 4 boundaries, 3 outputs are a step old
    assert dr.steps == 4


def test_a_graph_never_backpropagated_pins_its_activations():
    model, x = _mlp(), torch.randn(B, IN)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept = []
    with doctor() as dr:
        for _ in range(STEPS):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            out, line = model(x), inspect.currentframe().f_lineno
            kept.append(out)
    unused, leak = sorted(dr.findings, key=lambda f: f.kind)
    assert (leak.kind, leak.lineno, leak.holder) == (GRAPH_KEPT_ALIVE, line, "kept (list)")
    # At the last boundary, STEPS-2 entries are a whole step old (each is appended after a
    # boundary); each pins its output and the hidden activations its graph saved, and all of
    # them pin x (saved by fc1 for its weight gradient), counted once.
    assert leak.bytes == (STEPS - 2) * (OUT_BYTES + HIDDEN_BYTES) + B * IN * F32
    # No backward ever ran through these graphs: at exit all STEPS of them are still alive and
    # alone hold their hidden activations (x and the outputs are held by variables).
    assert (unused.kind, unused.lineno) == (EVAL_WITHOUT_NO_GRAD, line)
    assert unused.bytes == STEPS * HIDDEN_BYTES


def test_a_recurrent_state_not_detached_is_reported_once():
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(IN, H))
    u = nn.Parameter(torch.randn(H, H) / H)
    opt = torch.optim.SGD([w, u], lr=1e-3)
    with doctor() as dr:
        h = torch.zeros(B, H)
        for _ in range(STEPS):
            h, line = torch.tanh(torch.randn(B, IN) @ w + h @ u), inspect.currentframe().f_lineno
            loss = h.pow(2).mean()  # reaches the old graph only through `h`: not reported
            loss.backward(retain_graph=True)  # needed here, and used by the next backward
            opt.step()
            opt.zero_grad()
    (f,) = dr.findings
    assert (f.kind, f.lineno, f.holder) == (GRAPH_KEPT_ALIVE, line, "h")
    assert "h = h.detach()" in f.fix
    # At the last boundary h is from step STEPS-1; the old graph (steps 0..STEPS-2) saved each
    # step's input x (B*IN) and tanh output (B*H), and the first step saved the zeros h0 (B*H);
    # h itself is B*H.
    old = STEPS - 1
    assert f.bytes == old * (B * IN + B * H) * F32 + B * H * F32 + B * H * F32


def test_holders_are_named_through_containers_and_attributes():
    class Trainer:
        pass

    # Names are computed outside `assert`: pytest's rewriting adds locals that would name them.
    def holder(obj, exclude=()):
        return describe_holder(obj, [frame], exclude)

    frame = inspect.currentframe()
    loss = torch.ones(())
    pair = [torch.ones(2)]
    table = {"acc": torch.ones(3)}
    trainer = Trainer()
    trainer.last = torch.ones(4)
    trainer.cache = {"x": torch.ones(5)}
    # Tensor keys, as in optimizer.state: a parameter of a module is named, another shown by
    # its type and shape, never by its values.
    net = nn.Linear(64, 1)
    state = {net.weight: {"exp_avg": torch.ones(6)}}
    loose = {nn.Parameter(torch.zeros(1, 64)): torch.ones(7)}
    names = [
        holder(loss),
        holder(pair[0]),
        holder(table["acc"]),
        holder(trainer.last),
        holder(trainer.cache["x"]),
        holder(state[net.weight]["exp_avg"]),
        holder(next(iter(loose.values()))),
    ]
    assert names == [
        "loss", "pair (list)", "table['acc']", "trainer.last", "trainer.cache['x']",
        "state[<net.weight>]['exp_avg']", "loose[<Parameter (1, 64)>]",
    ]  # fmt: skip


def test_a_varying_batch_size_is_not_growth():
    # Live bytes at the boundaries go 8, 4, 5, 6, 7 rows of outputs: three rises in a row, but
    # below the first sample, so no new high: a varying shape, not a leak.
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with doctor() as dr:
        for rows in (4, 8, 4, 5, 6, 7):
            out = model(torch.randn(rows, IN))
            out.pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert dr.findings == []


def test_after_a_manual_step_optimizer_steps_are_not_boundaries():
    model, x = _mlp(), torch.randn(B, IN)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with doctor() as dr:
        for _ in range(3):
            dr.step()
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    assert dr.steps == 3


def test_two_optimizers_count_one_boundary_per_iteration():
    torch.manual_seed(0)
    gen, disc = nn.Linear(4, IN), nn.Linear(IN, 1)
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
    opt_d = torch.optim.SGD(disc.parameters(), lr=0.1)
    for chosen in (None, opt_g):
        with doctor(optimizer=chosen) as dr:
            for _ in range(5):
                fake = gen(torch.randn(B, 4))  # used after the discriminator's step
                disc(fake.detach()).mean().backward()
                opt_d.step()
                opt_d.zero_grad()
                (-disc(fake).mean()).backward()
                opt_g.step()
                opt_g.zero_grad()
        assert dr.steps == 5
        assert dr.findings == []


def test_doctor_leaves_nothing_installed():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with doctor() as dr:
        pass
    assert torch._C._len_torch_function_stack() == 0
    assert torch._C._len_torch_dispatch_stack() == 0
    model(torch.randn(B, IN)).sum().backward()
    opt.step()
    assert dr.steps == 0


def test_finding_is_frozen():
    f = Finding(kind=GROWTH, message="m", fix="f", bytes=1, filename=None, lineno=None, holder=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.bytes = 2  # type: ignore[misc]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_same_leaks_are_found():
    model = _mlp().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(B, IN, device="cuda")
    outputs = []
    with doctor(model=model) as dr:
        for _ in range(STEPS):
            out = model(x)
            out.pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            outputs.append(out)
    (f,) = dr.findings
    assert (f.kind, f.holder, f.bytes) == (GRAPH_KEPT_ALIVE, "outputs (list)", 5 * OUT_BYTES)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_growth_is_measured_with_memory_allocated():
    rows, width = 256, 1024  # one batch of outputs: 256 * 1024 * 4 B = 1 MiB, no rounding
    model = nn.Linear(IN, width).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(rows, IN, device="cuda")
    history = torch.zeros(0, width, device="cuda")
    with doctor(model=model) as dr:
        for _ in range(STEPS):
            out = model(x)
            out.pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            history = torch.cat([history, out.detach()])
    (f,) = dr.findings
    # Boundaries 0 and 1 are warm-up: growth from boundary 2 to STEPS-1.
    assert (f.kind, f.holder, f.bytes) == (GROWTH, "history", (STEPS - 3) * rows * width * 4)
