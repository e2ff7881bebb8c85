"""`memfit.measure` on CPU: the tracker over real tensors gives the same profile as the fake
trace of the same workload, category by category."""

from __future__ import annotations

import sys

import pytest
import torch

import memfit
from memfit.measurement.measure import measure
from memfit.techniques.apply import apply_
from tests.conftest import MEASURED_BASE as BASE
from tests.conftest import MEASURED_SEQ as SEQ
from tests.conftest import MEASURED_VOCAB as VOCAB
from tests.conftest import measured_gpt2 as gpt2
from tests.conftest import run_measured


def test_measured_equals_estimate_by_category():
    m, model = run_measured(BASE)
    est = memfit.estimate(gpt2(), BASE).profile
    got, want = m.profile.breakdown, est.breakdown
    assert m.steps == 2
    for cat in ("parameters", "buffers", "gradients", "inputs"):
        assert got[cat] == want[cat], cat
    # On CUDA, foreach AdamW keeps its step counters in host memory (the estimate leaves them
    # out); on CPU they are tensors like the rest: one 512-byte block per parameter tensor.
    n_tensors = len(list(model.parameters()))
    assert got["optimizer_state"] - want["optimizer_state"] == 512 * n_tensors
    # The estimate adds the cuBLAS workspace CUDA allocates at the first matmul.
    assert got["workspaces"] == 0 and want["workspaces"] > 0
    # Forward allocations: the same bytes; one 512-byte block may be filed differently
    # between activations (outlive the forward) and temporaries.
    act_t = got["activations"] + got["temporaries"]
    assert act_t == want["activations"] + want["temporaries"]
    assert abs(got["activations"] - want["activations"]) <= 512
    assert m.profile.peak_phase == est.peak_phase == "backward"
    assert m.profile.peak_op == est.peak_op


def test_phases_and_steps_are_found():
    m, _ = run_measured(BASE.with_(grad_accum=2, batch_size=2))
    phases = {p for p in m.profile.timeline_phases}
    for step in (0, 1):
        for phase in ("forward", "backward", "optimizer"):
            assert (step, phase) in phases
    assert m.device == "cpu" and m.cuda_max_allocated is None


def test_hooks_are_removed_after_the_block():
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with measure(model, opt) as m:
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
    assert not model._forward_pre_hooks
    assert model.weight._post_accumulate_grad_hooks in (None, {})
    # Parameters: 4x8 and 4 floats, one block each; the gradient blocks likewise.
    assert m.profile.breakdown["parameters"] == 2 * 512


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tracker_equals_allocator_statistics():
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU()).cuda()
    opt = torch.optim.AdamW(model.parameters())
    with measure(model, opt) as m:
        for _ in range(2):
            model(torch.randn(64, 1024, device="cuda")).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert m.cuda_max_allocated is not None
    # cuBLAS's workspace is allocated through the caching allocator but not by an aten op.
    assert abs(m.profile.peak_allocated_bytes - m.cuda_max_allocated) <= 64 * 2**20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_script_without_model_records_the_allocator_history():
    model = torch.nn.Linear(1024, 1024).cuda()
    with measure(record_history=True) as m:
        model(torch.randn(64, 1024, device="cuda")).sum().backward()
    assert m.device.startswith("cuda")
    assert m.cuda_snapshot is not None and m.cuda_snapshot["device_traces"]
    assert m.profile.breakdown["parameters"] == 1024 * 1024 * 4 + 4096


def test_without_a_model_the_outermost_module_is_found():
    """A script's loop measured with no model named gives the same profile as naming it."""

    def loop(model, opt):
        g = torch.Generator().manual_seed(0)
        for _ in range(2):
            ids = torch.randint(0, VOCAB, (2, SEQ), generator=g)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    profiles = []
    for named in (True, False):
        model = gpt2()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with measure(model if named else None, opt if named else None) as m:
            loop(model, opt)
        profiles.append(m.profile)
    a, b = profiles
    assert a.peak_allocated_bytes == b.peak_allocated_bytes
    assert a.breakdown == b.breakdown
    assert a.peak_module == b.peak_module
    assert {k: v for k, v in a.by_module.items()} == b.by_module


def test_an_oom_in_a_measured_loop_is_explained():
    """A simulated OOM escaping `measure`: the report says what held the memory."""
    from memfit.simulation.simulated_gpu import simulate

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 512))  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gpu = simulate(budget_bytes=40 * 2**20, model=model, optimizer=opt)
    m = measure(model, opt)
    with pytest.raises(torch.OutOfMemoryError) as info, gpu, m:
        for _ in range(2):
            model(torch.randn(4096, 512)).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert m.oom_report is not None
    if sys.version_info >= (3, 11):  # the report rides on the error, under its traceback
        assert info.value.__notes__ == [m.oom_report]
    assert "activations" in m.oom_report and "parameters" in m.oom_report


def test_explain_live_without_simulation():
    """A real-GPU OOM carries no allocator state: the tracker's live set is reported."""
    from memfit.events import ALLOC, FREE, Event, StorageRecord
    from memfit.simulation.oom_live import explain_live

    recs = {
        0: StorageRecord(0, 4096, "parameters", "setup", 0, "<parameters>", "fc", -1, 0),
        1: StorageRecord(1, 10_000, "activations", "forward", 0, "addmm", "fc", -1, 1),
        2: StorageRecord(2, 100, "temporaries", "forward", 0, "relu", "act", -1, 1),
    }
    events = [
        Event(ALLOC, 0, "setup", 0, "", "", -1),
        Event(ALLOC, 1, "forward", 0, "addmm", "fc", -1),
        Event(ALLOC, 2, "forward", 0, "relu", "act", -1),
        Event(FREE, 2, "forward", 0, "relu", "act", -1),
    ]
    text = explain_live(torch.OutOfMemoryError("CUDA out of memory"), recs, events)
    # 4096 B + 10,000 B rounded up to 10,240 B = 14,336 B = 14.00 KiB alive.
    assert "out of memory with 14.00 KiB of tensors alive" in text
    assert "activations" in text and "temporaries" not in text


def test_micro_batches_offload_and_recompute_are_phased_right():
    """Accumulation: the second micro-batch's forward is a forward; an offloaded optimizer
    (an optimizer stepping another) is one step; a script's checkpointed blocks recomputed in
    backward are not taken for new models."""
    from memfit.techniques import AccumulationConfig, CheckpointConfig, OptimizerConfig

    def run(named: bool):
        model = gpt2()
        setup = apply_(
            model,
            [CheckpointConfig(), AccumulationConfig(steps=2),
             OptimizerConfig(name="adamw", offload=True)],
        )  # fmt: skip
        ids = torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(0))
        with measure(model if named else None, setup.optimizer if named else None) as m:
            for _ in range(2):
                setup.step({"input_ids": ids, "labels": ids.clone()})
        return m

    named, script = run(True), run(False)
    assert named.steps == script.steps == 2
    forwards = [i for i, ph in enumerate(named.profile.timeline_phases) if ph == (0, "forward")]
    backwards = [i for i, ph in enumerate(named.profile.timeline_phases) if ph == (0, "backward")]
    # forward, backward, forward, backward within step 0: forward events after a backward one.
    assert max(forwards) > min(backwards)
    assert named.profile.peak_module == script.profile.peak_module
    assert named.profile.by_module == script.profile.by_module
