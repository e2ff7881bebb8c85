"""Optimizers composed onto a traced step (memfit.estimator.compose) against real traces.

Across the replay test matrix's axes (precision, optimizer, checkpointing, LoRA) on a tiny
llama and a tiny GPT-2 (config files, so memfit shortens them to 3 blocks as for any catalog
model): the step of optimizer B composed from the step traced with optimizer A and an
optimizer-only trace of B must equal the real trace of B, as the replay check compares them
(live bytes event for event, breakdown, bytes per module, per-phase peaks) and in FLOPs. By
default a subset that takes every value of every axis runs; MEMFIT_SLOW_TESTS=1 runs all.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

import memfit
from memfit.estimator import compose, parallel
from memfit.estimator.compose import ComposeMismatch, compose_optimizer, composition_matches
from memfit.estimator.estimation import _short_trace, trace_spec
from memfit.estimator.trace.cache import session
from memfit.models.sources import resolve_model
from memfit.planner import composed as composed_module
from memfit.planner import search as search_module
from memfit.planner.plan_text import plan_to_json
from memfit.planner.search import Goal, plan
from memfit.profile import MemoryProfile
from memfit.workload import LoraConfig
from tests.conftest import record_instances

CAP = (8, 9)
LLAMA = dict(
    model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=128, hidden_size=64,
    intermediate_size=128, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=64, tie_word_embeddings=True,
)  # fmt: skip
GPT2 = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], vocab_size=128, n_embd=64,
            n_layer=6, n_head=4, n_positions=64)  # fmt: skip
PRECISIONS = ("fp32", "bf16-mixed", "bf16-true", "fp16-mixed")
PAIRS = (("adamw", "adamw-8bit"), ("adamw-8bit", "adafactor"), ("sgd", "sgd-momentum"),
         ("adafactor", "lion"), ("lion", "adamw"), ("adamw", "paged-adamw-8bit"))  # fmt: skip
MATRIX = list(itertools.product(("llama", "gpt2"), PRECISIONS, PAIRS, ("off", "blocks"),
                                (False, True)))  # fmt: skip
# Every value of every axis at least once.
FAST = [
    ("llama", "bf16-mixed", PAIRS[0], "blocks", False),
    ("llama", "fp16-mixed", PAIRS[1], "off", False),
    ("llama", "fp32", PAIRS[2], "blocks", True),
    ("gpt2", "bf16-true", PAIRS[3], "off", False),
    ("gpt2", "bf16-mixed", PAIRS[4], "off", True),
    ("gpt2", "fp32", PAIRS[5], "blocks", False),
]
CASES = MATRIX if os.environ.get("MEMFIT_SLOW_TESTS") else FAST


def write_configs(root: Path) -> dict[str, str]:
    """The tiny llama and GPT-2 config files in `root`, by name."""
    out = {}
    for name, cfg in (("llama", LLAMA), ("gpt2", GPT2)):
        path = root / f"{name}.json"
        path.write_text(json.dumps(cfg))
        out[name] = str(path)
    return out


@pytest.fixture(scope="module")
def configs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return write_configs(tmp_path_factory.mktemp("compose"))


def _workload(precision: str, checkpointing: str, lora: bool) -> memfit.Workload:
    return memfit.Workload(batch_size=2, seq_len=16, grad_accum=2, precision=precision,
                           checkpointing=checkpointing,
                           lora=LoraConfig(rank=4) if lora else None)  # fmt: skip


@pytest.mark.parametrize(("model", "precision", "pair", "checkpointing", "lora"), CASES)
def test_composed_equals_the_real_trace(configs, model, precision, pair, checkpointing, lora):
    spec = resolve_model(configs[model])
    w = _workload(precision, checkpointing, lora)
    donor, target = (w.with_(optimizer=o) for o in pair)
    with session():
        assert composition_matches(spec, target, donor, CAP)
        # And replayed to all 6 blocks, as the planner uses it: equal to the real trace; or
        # None where the real trace cannot be replayed either (it is then traced whole).
        got = compose.composed_trace_spec(spec, target, donor, CAP)
        real, n2, replayed2 = trace_spec(spec, target, CAP, verify=False)
    if not replayed2:
        assert got is None
        return
    assert got is not None
    composed, n, replayed = got
    assert (n, replayed) == (n2, replayed2) == (6, True)
    a = MemoryProfile.from_events(composed.records, composed.events)
    b = MemoryProfile.from_events(real.records, real.events)
    assert a.timeline == b.timeline and a.breakdown == b.breakdown and a.by_module == b.by_module
    assert a.peak_allocated_bytes == b.peak_allocated_bytes and composed.flops == real.flops


def test_traces_of_different_models_do_not_compose(configs) -> None:
    spec = resolve_model(configs["llama"])
    w = _workload("bf16-mixed", "off", False)
    with session():
        full = _short_trace(spec, w, CAP, 3)
        lora = _short_trace(spec, w.with_(lora=LoraConfig(rank=4)), CAP, 3)
    with pytest.raises(ComposeMismatch, match="different parameters"):
        compose_optimizer(full, lora)


def test_what_cannot_be_composed_is_not(configs) -> None:
    spec = resolve_model(configs["llama"])
    w = _workload("bf16-mixed", "off", False)
    for other in (w.with_(optimizer_in_backward=True, grad_accum=1), w.with_(gpus=2)):
        assert compose.composable(spec, other) is None
    assert compose.composable(resolve_model(configs["llama"]), w) == 6
    assert compose.composable(spec, w.with_(checkpointing="blocks", checkpoint_first=2)) is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")
def test_a_plan_with_composed_optimizers_equals_one_without(configs, monkeypatch) -> None:
    """The same plan composed, traced for real, and composed with traces made side by side
    (MEMFIT_JOBS=2). Those are real traces: a composition is checked against them as against
    the search's own, and the children trace only what the search would have traced."""
    goal = Goal(global_batch=8, seq_len=32)
    made = record_instances(monkeypatch, composed_module.Composer)
    monkeypatch.setattr(parallel.threading, "active_count", lambda: 1)
    ahead: list[int] = []  # jobs per call of run_all from the search
    run_all = search_module.run_all
    monkeypatch.setattr(
        search_module,
        "run_all",
        lambda jobs, **kw: (ahead.append(len(jobs)), run_all(jobs, **kw))[1],
    )
    docs = []
    for jobs in ("1", "2"):
        monkeypatch.setenv("MEMFIT_JOBS", jobs)
        docs.append(plan_to_json(plan(configs["llama"], gpu="rtx-4060", goal=goal)))
    alone, side_by_side = made
    assert alone.composed > 0
    assert max(ahead) > 1  # traces were made side by side (none with MEMFIT_JOBS=1)
    # The same real traces or fewer: a shape's largest micro-batch made beside its donor's
    # can be composed where the search alone reached it first.
    assert side_by_side.composed >= alone.composed
    assert set(side_by_side.real) <= set(alone.real)
    monkeypatch.setenv("MEMFIT_JOBS", "1")
    monkeypatch.setattr(composed_module, "composable", lambda *a: None)
    docs.append(plan_to_json(plan(configs["llama"], gpu="rtx-4060", goal=goal)))
    for doc in docs:
        doc.pop("seconds")
    assert docs[0] == docs[1] == docs[2]


def test_a_composition_that_differs_is_not_used(configs, monkeypatch) -> None:
    """If the check finds a difference, every micro-batch of the shape is traced for real."""
    monkeypatch.setattr(composed_module, "composition_matches", lambda *a: False)
    goal = Goal(global_batch=8, seq_len=32)
    seen = []
    real = composed_module.Composer.trace

    def spy(self, *a, **k):
        out = real(self, *a, **k)
        seen.append(self.composed)
        return out

    monkeypatch.setattr(composed_module.Composer, "trace", spy)
    plan(configs["llama"], gpu="rtx-4060", goal=goal)
    assert seen and max(seen) == 0


def test_the_matrix_covers_every_value() -> None:
    for axis, values in enumerate((("llama", "gpt2"), PRECISIONS, PAIRS, ("off", "blocks"),
                                   (False, True))):  # fmt: skip
        assert {c[axis] for c in FAST} == set(values)
