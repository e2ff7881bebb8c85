"""`memfit.simulate`: which storages count (views, in-place ops, resizes), the phase after an
OOM, and the OOM notes. Hand numbers: the CUDA caching allocator rounds requests up to 512 B,
packs requests <= 1 MiB into 2 MiB segments and gives 1-10 MiB requests a 20 MiB segment."""

from __future__ import annotations

import contextlib
import gc

import pytest
import torch
from torch import nn

from memfit.simulation.oom import explain_oom
from memfit.simulation.simulated_gpu import simulate

MiB = 1 << 20


def test_views_and_in_place_ops_of_tensors_not_passed_cost_nothing():
    host = torch.randn(4096, 256)  # 4 MiB of host data, not passed to simulate
    with simulate(workspaces=False) as gpu:
        batch = host[0:32]  # a view: no allocation
        host.add_(1)  # in place
        torch.add(host[:2], 1, out=host[2:4])  # out= into a view of it
        assert gpu.allocated_bytes == 0
        copy = host[0:32].clone()  # 32 x 256 x 4 B = 32 KiB, a new storage
        half = batch.to(torch.float16)  # 16 KiB
        cols = host[:, :8].contiguous()  # a copy: 4096 x 8 x 4 B = 128 KiB
        assert gpu.allocated_bytes == 32 * 1024 + 16 * 1024 + 128 * 1024
        view_of_copy = copy[:4]  # a view of a counted storage: nothing more
        assert gpu.allocated_bytes == 32 * 1024 + 16 * 1024 + 128 * 1024
    ops = sorted((t.op, t.nbytes, t.category) for t in gpu.live_tensors())
    assert ops == [
        ("_to_copy.default", 16 * 1024, "inputs"),
        ("clone.default", 32 * 1024, "inputs"),
        ("clone.default", 128 * 1024, "inputs"),
    ]
    del batch, copy, half, cols, view_of_copy


def test_a_storage_an_op_resizes_is_malloced_at_its_new_size():
    with simulate(workspaces=False) as gpu:
        a = torch.zeros(1000)  # 4000 B -> a 4096-B block
        a.resize_(1_000_000)  # 4,000,000 B -> 7813 x 512 = 4,000,256 B
        assert gpu.allocated_bytes == 4_000_256
        # CUDA allocates the new size and copies before it frees the old block.
        assert gpu.peak_allocated_bytes == 4096 + 4_000_256
        out = torch.empty(0)
        torch.cat([a, a], out=out)  # out= grows it to 8,000,000 B (a multiple of 512)
        assert gpu.allocated_bytes == 4_000_256 + 8_000_000
    grown = {t.op: t.nbytes for t in gpu.live_tensors()}
    assert grown == {"resize_.default": 4_000_000, "cat.out": 8_000_000}
    del a, out


def test_a_resize_that_does_not_fit_is_an_oom_and_keeps_the_old_block():
    with simulate(budget_bytes=4 * MiB, workspaces=False) as gpu:
        a = torch.zeros(1000)  # in a 2 MiB small segment
        # 4,000,256 B is a 1-10 MiB request: a 20 MiB segment, more than the 4 MiB budget.
        with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 20\.00 MiB"):
            a.resize_(1_000_000)
        assert gpu.allocated_bytes == 4096
    assert gpu.oom is not None and gpu.oom.op == "resize_.default"
    del a


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 512, bias=False), nn.ReLU(), nn.Linear(512, 512, bias=False), nn.ReLU(),
        nn.Linear(512, 16, bias=False),
    )  # fmt: skip


@pytest.mark.parametrize(("budget_mib", "phase"), [(22, "forward"), (24, "backward")])
def test_after_an_oom_the_next_batch_is_an_input(budget_mib, phase):
    # The budgets of test_simulate.test_oom_at_the_op_the_estimate_predicts: an OOM at relu in
    # the forward, and at an mm in the backward, of a batch of 256.
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with simulate(budget_bytes=budget_mib * MiB, model=model, optimizer=opt) as gpu:
        with contextlib.suppress(torch.OutOfMemoryError):  # as a guard would, then go on
            model(torch.randn(256, 64)).sum().backward()
        gc.collect()  # the failed step's tensors
        assert gpu.oom is not None and gpu.oom.phase == phase
        small = torch.randn(8, 64)
        assert [(t.category, t.phase) for t in gpu.live_tensors() if t.shape == (8, 64)] == [
            ("inputs", "inputs")
        ]
        if phase == "backward":  # room for a whole step of 8 samples (not at 22 MiB)
            model(small).sum().backward()
            assert gpu.oom.phase == "backward"  # no second OOM: gpu.oom is the first one
            after = torch.randn(8, 64)  # the backward ended: the next batch is an input again
            assert [t.category for t in gpu.live_tensors() if t.shape == (8, 64)] == [
                "inputs", "inputs",
            ]  # fmt: skip
            del after
    del small


def test_oom_notes_tell_no_model_from_a_model_without_repeated_blocks():
    notes = []
    for model in (None, nn.Linear(4, 4)):
        with simulate(budget_bytes=4 * MiB, model=model, workspaces=False):
            try:
                torch.empty(MiB)  # 4 MiB: a 20 MiB segment
            except torch.OutOfMemoryError as e:
                notes.append(explain_oom(e).notes)
    assert notes == [
        ("No model given (pass model= to simulate): checkpointing not priced.",),
        (
            "The Linear model has no repeated blocks "
            "(memfit.models.structure.find_repeated_blocks finds "
            "none): checkpointing not priced.",
        ),
    ]
