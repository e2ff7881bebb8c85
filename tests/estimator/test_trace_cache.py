"""The trace and plan cache (memfit.estimator.trace.cache, memfit.planner.plan_cache).

The suite runs with the cache off (tests/conftest.py); these tests turn it on, each with its own
folder. "A new process" is simulated by `forget()` (the memory copies dropped, the disk kept).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import memfit
from memfit.cli.app import app
from memfit.errors import BadInputError
from memfit.estimator import estimation as estimate_module
from memfit.estimator.estimation import trace_key, trace_spec
from memfit.estimator.trace import cache as trace_cache
from memfit.models.sources import resolve_model
from memfit.planner import search as search_module
from memfit.planner.plan_text import plan_to_json, render_plan
from memfit.planner.search import Goal
from memfit.profile import MemoryProfile
from tests.conftest import tiny_gpt2

CFG = dict(
    model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=128, hidden_size=64,
    intermediate_size=128, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=64,
)  # fmt: skip
W = memfit.Workload(batch_size=2, seq_len=16, precision="bf16-mixed")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(root))
    trace_cache.forget()
    with trace_cache.caching(True):
        yield root
    trace_cache.forget()


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CFG))
    return str(path)


def _no_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_a, **_k):
        raise AssertionError("traced although the trace was cached")

    monkeypatch.setattr(estimate_module, "_trace_spec", refuse)


def _same(a: memfit.Estimate, b: memfit.Estimate) -> None:
    pa, pb = a.profile, b.profile
    assert (pa.peak_allocated_bytes, pa.peak_reserved_bytes, pa.device_total_bytes) == (
        pb.peak_allocated_bytes, pb.peak_reserved_bytes, pb.device_total_bytes
    )  # fmt: skip
    assert pa.breakdown == pb.breakdown and pa.by_module == pb.by_module
    assert pa.timeline == pb.timeline and a.flops == b.flops
    assert (a.parameter_count, a.num_blocks, a.replayed) == (
        b.parameter_count,
        b.num_blocks,
        b.replayed,
    )


def test_a_new_process_reads_the_trace_back_and_estimates_the_same(
    cache: Path, config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = memfit.estimate(config, W, gpu="rtx-4090")
    # The estimate, and the 3- and 4-block traces of its replay check.
    assert first.replayed and len(list((cache / "traces").glob("*.pkl"))) == 3
    trace_cache.forget()  # a new process: only the disk is left
    _no_tracing(monkeypatch)
    _same(memfit.estimate(config, W, gpu="rtx-4090"), first)
    # Another GPU of the same compute capability reads the same trace.
    assert memfit.estimate(config, W, gpu="l4").profile.peak_allocated_bytes == (
        first.profile.peak_allocated_bytes
    )


def test_the_stored_form_gives_back_the_trace_exactly(cache: Path, config: str) -> None:
    spec = resolve_model(config)
    tr, n, replayed = trace_spec(spec, W, (8, 0))
    back, n2, replayed2 = trace_cache.unpack_trace(trace_cache.pack_trace((tr, n, replayed)))
    assert (n2, replayed2) == (n, replayed)
    assert back.events == tr.events and back.records == tr.records
    assert {k: v for k, v in vars(back).items() if k not in ("events", "records")} == {
        k: v for k, v in vars(tr).items() if k not in ("events", "records")
    }
    assert all(type(r.category) is type(tr.records[s].category) for s, r in back.records.items())
    # What a caller changes does not reach the cache.
    back.events.clear()
    again, _, _ = trace_spec(spec, W, (8, 0))
    assert again.events == tr.events


def test_the_key_follows_everything_that_changes_a_trace(config: str, tmp_path: Path) -> None:
    spec = resolve_model(config)
    base = trace_key(spec, W, (8, 0), True)
    assert base == trace_key(resolve_model(config), W.with_(gpu="rtx-4090"), (8, 0), True)
    assert base == trace_key(spec, W.with_(host_memory="64GiB"), (8, 0), True)
    # GPUs whose capabilities pick the same attention kernels (attention.attention_class)
    # share their traces; no GPU named is (8, 0).
    assert base == trace_key(spec, W, (9, 0), True) == trace_key(spec, W, None, True)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**CFG, "intermediate_size": 256}))
    changed = [
        trace_key(spec, W.with_(batch_size=3), (8, 0), True),
        trace_key(spec, W.with_(checkpointing="blocks"), (8, 0), True),
        trace_key(spec, W, (7, 5), True),  # another attention class (before 8.0)
        trace_key(spec, W, (8, 9), True),  # and sm86/sm89's
        trace_key(spec, W, (8, 0), False),
        trace_key(resolve_model(other), W, (8, 0), True),
        trace_key(resolve_model(config, task="seq-classification"), W, (8, 0), True),
    ]
    assert base not in changed and len(set(changed)) == len(changed)


def test_a_change_to_the_code_misses(config: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = resolve_model(config)
    before = trace_key(spec, W, (8, 0), True)
    monkeypatch.setattr(trace_cache, "_code_digest", "memfit edited")
    assert trace_key(spec, W, (8, 0), True) != before


def test_models_memfit_cannot_name_are_not_cached(cache: Path) -> None:
    spec = resolve_model(tiny_gpt2())
    assert spec.cache_key is None and trace_key(spec, W, (8, 0), True) is None
    memfit.estimate(tiny_gpt2(), memfit.Workload(batch_size=1, seq_len=8))
    assert not (cache / "traces").exists()


def test_off_stores_and_reads_nothing(tmp_path: Path, config: str, monkeypatch) -> None:
    root = tmp_path / "off"
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(root))
    monkeypatch.setenv("MEMFIT_NO_CACHE", "1")
    trace_cache.forget()
    assert not trace_cache.enabled()
    memfit.estimate(config, W)
    assert not root.exists()


def test_a_damaged_file_is_a_miss_and_is_removed(
    cache: Path, config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = memfit.estimate(config, W)
    paths = list((cache / "traces").glob("*.pkl"))
    for path in paths:
        path.write_bytes(path.read_bytes()[:100])  # cut short
    trace_cache.forget()
    _same(memfit.estimate(config, W), first)  # traced again
    assert all(p.exists() and p.stat().st_size > 100 for p in paths)  # and stored again


def test_the_oldest_files_go_first_above_the_limit(cache: Path, monkeypatch) -> None:
    folder = cache / "traces"
    for i, size in enumerate((300, 300, 300)):
        trace_cache.store("trace", f"k{i}", b"x" * size)
    assert len(list(folder.glob("*.pkl"))) == 3
    monkeypatch.setenv("MEMFIT_CACHE_MAX_BYTES", "700")
    trace_cache.store("trace", "k3", b"y" * 300)
    left = {p.stem for p in folder.glob("*.pkl")}
    assert len(left) == 2 and "k3" in left


def test_a_plan_asked_again_is_read_back(
    cache: Path, config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    goal = Goal(global_batch=4, seq_len=16)
    first = memfit.plan(config, gpu="rtx-4090", goal=goal)
    assert not first.from_cache and first.best is not None
    trace_cache.forget()

    def refuse(*_a, **_k):
        raise AssertionError("searched although the plan was cached")

    monkeypatch.setattr(search_module, "_search_plan", refuse)
    again = memfit.plan(config, gpu="rtx-4090", goal=goal)
    assert again.from_cache and again.search_seconds == pytest.approx(first.seconds)
    assert again.best.workload == first.best.workload
    assert again.best.device_total_bytes == first.best.device_total_bytes
    assert "read back from memfit's cache in" in render_plan(again)
    assert plan_to_json(again)["from_cache"] is True and plan_to_json(first)["from_cache"] is False
    # Another input is another plan.
    with pytest.raises(AssertionError, match="searched although"):
        memfit.plan(config, gpu="rtx-4090", goal=Goal(global_batch=8, seq_len=16))


def test_no_cache_plans_again_and_memfit_cache_shows_and_clears(
    cache: Path, config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    args = ["plan", config, "--gpu", "rtx-4090", "--global-batch", "4", "--seq", "16"]
    assert runner.invoke(app, args).exit_code == 0
    shown = runner.invoke(app, ["cache"])
    assert shown.exit_code == 0 and str(cache) in shown.output
    assert "plans       1 files" in shown.output
    calls = []
    real = search_module._search_plan
    monkeypatch.setattr(search_module, "_search_plan", lambda *a: calls.append(1) or real(*a))
    try:
        assert runner.invoke(app, [*args, "--no-cache"]).exit_code == 0
    finally:
        trace_cache.set_enabled(None)
    assert calls == [1]
    cleared = runner.invoke(app, ["cache", "--clear"])
    assert cleared.exit_code == 0 and "removed" in cleared.output
    assert trace_cache.entries(cache) == []


@pytest.mark.parametrize("value", ["2GiB", "-1", "1e9", "\u00b9"])
def test_a_cache_limit_that_is_not_a_number_of_bytes_is_refused(
    cache: Path, config: str, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("MEMFIT_CACHE_MAX_BYTES", value)
    with pytest.raises(BadInputError, match=f"MEMFIT_CACHE_MAX_BYTES='{value}'"):
        trace_cache.store("trace", "k", b"x")
    shown = CliRunner().invoke(app, ["cache"])
    assert shown.exit_code == 2
    assert f"MEMFIT_CACHE_MAX_BYTES='{value}' is not a number of bytes" in shown.output
    assert "Traceback" not in shown.output
    monkeypatch.setenv("MEMFIT_CACHE_MAX_BYTES", " 0 ")  # nothing kept on disk
    trace_cache.store("trace", "k", b"x")
    assert trace_cache.entries(cache) == []


def test_memfit_no_cache_says_on_or_off_or_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    trace_cache.set_enabled(None)  # the variable decides
    for value, on in (("1", False), ("true", False), ("YES", False), ("0", True),
                      ("", True), ("false", True), ("off", True)):  # fmt: skip
        monkeypatch.setenv("MEMFIT_NO_CACHE", value)
        assert trace_cache.enabled() is on, value
    monkeypatch.setenv("MEMFIT_NO_CACHE", "please")
    with pytest.raises(BadInputError, match="MEMFIT_NO_CACHE='please' is neither on nor off"):
        trace_cache.enabled()
    shown = CliRunner().invoke(app, ["cache"])
    assert shown.exit_code == 2 and "MEMFIT_NO_CACHE='please'" in shown.output


@pytest.mark.parametrize(
    ("name", "value"),
    [("MEMFIT_CACHE_MAX_BYTES", "2G"), ("MEMFIT_JOBS", "all"), ("MEMFIT_NO_CACHE", "maybe")],
)
def test_a_bad_setting_is_refused_before_any_trace(config: str, monkeypatch, name, value):
    """Not when a trace is first stored or run side by side: by then a plan has searched, and
    a lean shape's refusal would have been taken for the shape's."""
    monkeypatch.setenv(name, value)
    monkeypatch.setattr(estimate_module, "run_trace", lambda *a, **k: pytest.fail("traced"))
    for call in (lambda: memfit.estimate(config, W),
                 lambda: memfit.plan(config, gpu="rtx-4090", goal=Goal(global_batch=2, seq_len=16)),
                 lambda: memfit.max_batch(config, W, gpu="rtx-4090")):  # fmt: skip
        with pytest.raises(BadInputError, match=f"{name}='{value}'"):
            call()


def test_profiles_from_a_cached_trace_equal_the_traced_ones(cache: Path, config: str) -> None:
    spec = resolve_model(config)
    w = W.with_(checkpointing="blocks", grad_accum=2)
    tr, _, _ = trace_spec(spec, w, (8, 0), verify=False)
    trace_cache.forget()
    back, _, _ = trace_spec(spec, w, (8, 0), verify=False)
    a = MemoryProfile.from_events(tr.records, tr.events)
    b = MemoryProfile.from_events(back.records, back.events)
    assert a.timeline == b.timeline and a.breakdown == b.breakdown


def test_the_compact_pickle_gives_back_equal_streams(config: str) -> None:
    import pickle

    est = memfit.estimate(config, W)
    nested = {"a": [est.profile], "b": (est.profile.events, est.profile.records)}
    back = pickle.loads(trace_cache.dumps_compact(nested))
    assert back["a"][0].events == est.profile.events and back["b"][0] == est.profile.events
    assert back["a"][0].records == est.profile.records and back["b"][1] == est.profile.records
    assert back["a"][0].timeline == est.profile.timeline


def test_a_plan_keeps_the_stream_of_its_recommendation_only(config: str) -> None:
    p = memfit.plan(config, gpu="rtx-4090", goal=Goal(global_batch=4, seq_len=16))
    assert p.best.estimate.profile.events and p.best.estimate.profile.records
    others = [c for c in (*p.pareto, p.baseline, p.closest_miss, p.other_optimizer)
              if c is not None and c is not p.best]  # fmt: skip
    assert others  # the tiny model's Pareto table has more than the recommendation
    for c in others:
        assert c.estimate.profile.events == [] and c.estimate.profile.records == {}
        assert c.device_total_bytes > 0 and c.estimate.profile.breakdown


def test_the_replay_check_reuses_the_searched_3_block_trace(
    cache: Path, config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = resolve_model(config)
    traced: list[int | None] = []
    real = estimate_module.run_trace

    def counting(*a, num_layers=None, **k):
        traced.append(num_layers)
        return real(*a, num_layers=num_layers, **k)

    monkeypatch.setattr(estimate_module, "run_trace", counting)
    searched, _, _ = trace_spec(spec, W, (8, 0), verify=False)  # as the planner traces
    checked, n, replayed = trace_spec(spec, W, (8, 0), verify=True)  # as its confirmation
    assert traced == [3, 4] and replayed and n == 6
    assert checked.events == searched.events and checked.records == searched.records
