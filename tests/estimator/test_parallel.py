"""Traces side by side in forked children (memfit.estimator.parallel): the same results as one
after another, and a failing job raises here as it would without children."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import memfit
from memfit.errors import BadInputError
from memfit.estimator import parallel
from memfit.estimator.trace import cache as trace_cache

CFG = dict(
    model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=128, hidden_size=64,
    intermediate_size=128, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=64,
)  # fmt: skip

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")


@pytest.fixture
def jobs2(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers, even if an earlier test left a thread running (workers() then says 1)."""
    monkeypatch.setenv("MEMFIT_JOBS", "2")
    monkeypatch.setattr(parallel.threading, "active_count", lambda: 1)


def _pid() -> int:
    return os.getpid()


@needs_fork
def test_jobs_run_in_children_and_come_back_in_order(monkeypatch) -> None:
    monkeypatch.setenv("MEMFIT_JOBS", "3")
    monkeypatch.setattr(parallel.threading, "active_count", lambda: 1)
    jobs = [lambda i=i: (i * i, os.getpid()) for i in range(7)]
    out = parallel.run_all(jobs)
    assert [v for v, _ in out] == [i * i for i in range(7)]
    assert len({pid for _, pid in out}) > 1  # some ran in children
    assert out[-1][1] == os.getpid()  # this process takes from the back


def test_off_by_default_and_sequential_with_one_job(monkeypatch) -> None:
    monkeypatch.delenv("MEMFIT_JOBS", raising=False)
    assert parallel.workers() == 1
    assert {pid for pid in parallel.run_all([_pid, _pid, _pid])} == {os.getpid()}
    monkeypatch.setenv("MEMFIT_JOBS", "")
    assert parallel.workers() == 1


@pytest.mark.parametrize("value", ["not a number", "0", "-2", "2.5", "\u00b2"])
def test_a_number_of_jobs_that_is_not_one_or_more_is_refused(monkeypatch, value) -> None:
    monkeypatch.setenv("MEMFIT_JOBS", value)
    with pytest.raises(BadInputError, match=f"MEMFIT_JOBS='{value}' is not a number of proc"):
        parallel.workers()
    with pytest.raises(BadInputError):
        parallel.run_all([_pid, _pid])


@needs_fork
def test_a_failing_job_raises_here(jobs2) -> None:
    def bad() -> int:
        raise BadInputError("the job's own error")

    with pytest.raises(BadInputError, match="the job's own error"):
        parallel.run_all([bad, lambda: 1])


@needs_fork
def test_a_child_that_hangs_is_killed_and_its_job_runs_here(jobs2, monkeypatch) -> None:
    monkeypatch.setattr(parallel, "CHILD_SECONDS", 0.5)

    def hangs_in_a_child() -> int:
        if parallel._in_child:
            time.sleep(60)
        return os.getpid()

    t0 = time.monotonic()
    assert parallel.run_all([hangs_in_a_child, _pid]) == [os.getpid(), os.getpid()]
    assert time.monotonic() - t0 < 30


@needs_fork
def test_other_children_of_the_program_keep_their_exit_status(jobs2) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(1); sys.exit(7)"])
    parallel.run_all([lambda: time.sleep(1.5) or 1, lambda: 2])
    assert other.wait(timeout=30) == 7


def test_more_threads_mean_no_children(monkeypatch) -> None:
    monkeypatch.setenv("MEMFIT_JOBS", "2")
    monkeypatch.setattr(parallel.threading, "active_count", lambda: 2)
    assert parallel.workers() == 1


@needs_fork
def test_an_estimate_with_children_equals_one_without(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CFG))
    w = memfit.Workload(batch_size=2, seq_len=16, precision="bf16-mixed", grad_accum=2)
    monkeypatch.setenv("MEMFIT_JOBS", "1")
    alone = memfit.estimate(str(path), w, gpu="rtx-4090")
    monkeypatch.setenv("MEMFIT_JOBS", "2")
    monkeypatch.setattr(parallel.threading, "active_count", lambda: 1)
    side_by_side = memfit.estimate(str(path), w, gpu="rtx-4090")
    assert alone.replayed and side_by_side.replayed
    a, b = alone.profile, side_by_side.profile
    assert a.timeline == b.timeline and a.breakdown == b.breakdown and a.by_module == b.by_module
    assert a.device_total_bytes == b.device_total_bytes and alone.flops == side_by_side.flops


def test_the_cli_says_a_bad_number_of_jobs_and_exits_2(tmp_path: Path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from memfit.cli.app import app

    path = tmp_path / "config.json"
    path.write_text(json.dumps(CFG))
    monkeypatch.setenv("MEMFIT_JOBS", "many")
    for args in (
        ["estimate", str(path), "--seq", "16"],
        ["plan", str(path), "--gpu", "rtx-4090", "--global-batch", "2", "--seq", "16"],
    ):
        try:
            done = CliRunner().invoke(app, [*args, "--no-cache"])
        finally:
            trace_cache.set_enabled(None)  # --no-cache holds for the rest of a process
        assert done.exit_code == 2, done.output
        assert "MEMFIT_JOBS='many' is not a number of processes" in done.output


@needs_fork
def test_a_shape_the_workload_refuses_is_left_to_the_search(tmp_path: Path, jobs2) -> None:
    """QLoRA over two GPUs is refused by the Workload; asked to be traced ahead, it is left to
    the search, which rules the shape out and plans on (before, the refusal ended the plan)."""
    from memfit.cuda.target import get_gpu
    from memfit.models.sources import resolve_model
    from memfit.planner import search
    from memfit.planner.shapes import Shape

    path = tmp_path / "config.json"
    path.write_text(json.dumps(CFG))
    goal = search.Goal(global_batch=2, seq_len=16)
    s = search._Search(resolve_model(str(path)), goal, get_gpu("rtx-4090"), n_gpus=2)
    qlora = Shape("bf16-true", "adamw", "blocks", True, False, quantize="nf4-dq")
    with pytest.raises(BadInputError):  # what `evaluate` reports for it
        s.workload(qlora, 1, False, False)
    s.prefetch([(qlora, 1)])
    assert s.traces == {} and s.evaluate(qlora, 1, [(False, False)]) == []
    assert qlora in s.untraceable
