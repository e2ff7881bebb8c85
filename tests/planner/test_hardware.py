"""`choose_gpu` (memfit.planner.gpus.ranking, `memfit gpus --for`): every GPU planned with
`memfit.plan`, sorted by predicted tokens per second, costs from the user's price list."""

from __future__ import annotations

import gc
import json

import pytest
from typer.testing import CliRunner

from memfit.cli.app import app
from memfit.errors import BadInputError
from memfit.planner import search as search_module
from memfit.planner.gpus.ranking import choose_gpu, read_prices
from memfit.planner.search import Goal, plan
from tests.conftest import record_instances

#: A 2-layer GPT-2 (hidden 64): planned in seconds on every GPU it is asked for.
TINY = {
    "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_embd": 64,
    "n_head": 4, "vocab_size": 256, "n_positions": 128,
}  # fmt: skip
GOAL = Goal(global_batch=8, seq_len=128)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny") / "config.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def test_sorted_fastest_first_and_fits_as_memfit_plan_says(tiny):
    choices = choose_gpu(tiny, GOAL, among=["t4", "h100-sxm"], prices={"h100-sxm": 2.5})
    assert [c.gpu.name for c in choices] == ["h100-sxm", "t4"]
    speeds = [c.tokens_per_second for c in choices]
    assert speeds == sorted(speeds, reverse=True)
    for c in choices:
        p = plan(tiny, gpu=c.gpu.name, goal=GOAL)
        assert c.fits == (p.best is not None)
        assert c.tokens_per_second == p.best.cost.tokens_per_second
        assert c.plan.best.workload == p.best.workload
    h100, t4 = choices
    # n GPUs x price per hour / 3600 / tokens per second x 1e6, by hand.
    assert h100.usd_per_hour == 2.5
    assert h100.usd_per_million_tokens == pytest.approx(2.5 / 3600 / h100.tokens_per_second * 1e6)
    assert t4.usd_per_million_tokens is None  # no price given for it


def test_rocm_cards_are_skipped_with_a_note(tiny):
    (c,) = choose_gpu(tiny, GOAL, among=["mi300x"])
    assert c.fits is None and c.plan is None and "ROCm" in c.note


def test_a_job_that_fits_nowhere_sorts_after_the_fitting_ones(tiny):
    big = Goal(global_batch=8, seq_len=128)
    choices = choose_gpu(tiny, big, among=["t4@360MiB", "t4"])
    assert [c.fits for c in choices] == [True, False]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu,usd_per_hour\nh100-sxn,2.49\n", r"line 2: Unknown GPU 'h100-sxn'.*h100-sxm"),
        ("h100-sxm,cheap\n", r"line 1: .*'cheap', not a number"),
        ("gpu,price\nh100-sxm,abc\n", r"line 2: the price of 'h100-sxm' is 'abc'"),
        ("h100-sxm,-1\n", "non-negative"),
        ("h100-sxm\n", "expected two fields"),
        ("h100-sxm,2\nh100,3\n", "h100-sxm is priced twice"),
        ("rtx-4090@12GiB,0.3\n", "is a budget, not a GPU"),
        ("# only a comment\n", "has no prices"),
    ],
)
def test_price_list_errors_name_the_line_and_the_fix(tmp_path, text, message):
    path = tmp_path / "prices.csv"
    path.write_text(text)
    with pytest.raises(BadInputError, match=message):
        read_prices(path)


def test_price_list_reads_aliases_under_catalog_names(tmp_path):
    path = tmp_path / "prices.csv"
    path.write_text("gpu,usd_per_hour\n# my cloud\n4090,0.34\nh100,2.49\n")
    assert read_prices(path) == {"rtx-4090": 0.34, "h100-sxm": 2.49}


def test_cli_options_without_for_are_errors():
    result = CliRunner().invoke(app, ["gpus", "--prices", "p.csv", "--seq", "128"])
    assert result.exit_code == 2
    assert "--seq, --prices only apply with --for MODEL" in result.output


def test_cli_for_prints_the_table(tiny, tmp_path, monkeypatch):
    import memfit.planner.gpus.ranking as hw

    real = hw.list_gpus
    monkeypatch.setattr(hw, "list_gpus", lambda: [g for g in real() if g.name in ("t4", "l4")])
    prices = tmp_path / "p.csv"
    prices.write_text("l4,0.44\n")
    result = CliRunner().invoke(
        app, ["gpus", "--for", tiny, "--global-batch", "8", "--seq", "128", "--prices", str(prices)]
    )
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.output.splitlines() if "│" in ln]
    assert [ln.split("│")[1].strip() for ln in lines] == ["l4", "t4"]


def test_cli_for_plans_the_distillation_with_the_teacher(tiny, monkeypatch):
    import memfit.planner.gpus.ranking as hw

    goals = []
    monkeypatch.setattr(hw, "choose_gpu", lambda model, goal, **kw: goals.append(goal) or [])
    result = CliRunner().invoke(app, ["gpus", "--for", tiny, "--teacher", tiny, "--json"])
    assert result.exit_code == 1  # nothing planned: fits nowhere
    assert [g.teacher for g in goals] == [tiny]
    alone = CliRunner().invoke(app, ["gpus", "--teacher", tiny])
    assert alone.exit_code == 2 and "--teacher only apply with --for MODEL" in alone.output


def test_gpus_whose_kernels_trace_alike_share_one_composer_and_allocator_runs(tiny, monkeypatch):
    """The traces, what the composer learnt of them (real traces, checked compositions,
    micro-batch lines) and the allocator's runs (memfit.cuda.allocator_replay.shared_runs)
    serve every GPU of an attention class; no plan's search is kept."""
    from memfit.cuda import allocator_replay
    from memfit.planner import composed

    made = record_instances(monkeypatch, composed.Composer)
    searches = record_instances(monkeypatch, search_module._Search, weak=True)
    replayed: list[int] = []
    shared, real = allocator_replay.simulate_shared, allocator_replay.simulate
    read_back = 0

    def checked(stream, **kw):  # a run read back equals a replay of its own
        nonlocal read_back
        before = len(replayed)
        run = shared(stream, **kw)
        if len(replayed) == before:
            read_back += 1
            assert run == real(stream, **kw)
        return run

    monkeypatch.setattr("memfit.estimator.device_memory.simulate_shared", checked)
    monkeypatch.setattr(
        allocator_replay, "simulate", lambda *a, **kw: replayed.append(1) or real(*a, **kw)
    )
    choose_gpu(tiny, GOAL, among=["rtx-4090", "l40s"])  # both sm89: 24 and 48 GB
    assert len(made) == 1 and made[0].lines
    gc.collect()
    # The composer is alive (`made` holds it); no plan's search is, through it or else.
    assert len(searches) == 2 and all(ref() is None for ref in searches)
    assert read_back > 0  # the second GPU read runs back
