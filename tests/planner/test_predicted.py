"""Searches that predict micro-batches (memfit.estimator.predict.MicroBatchLine): `max_batch`
and the planner's traces give what they give on real traces alone, trace fewer, and fall back
to real traces when a prediction differs."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest

import memfit
from memfit.estimator import predict
from memfit.estimator.estimation import trace_spec
from memfit.estimator.trace.cache import session
from memfit.models.sources import resolve_model
from memfit.planner import limits
from memfit.planner.composed import Composer
from memfit.planner.limits import max_batch
from memfit.planner.plan_text import limit_to_json
from memfit.planner.shapes import Shape

W = memfit.Workload(seq_len=512, precision="fp16-mixed", optimizer="sgd")


class _Counting(predict.MicroBatchLine):
    lines: ClassVar[list[_Counting]] = []

    def __init__(self, trace) -> None:  # type: ignore[no-untyped-def]
        super().__init__(trace)
        _Counting.lines.append(self)


class _NeverPredicts(predict.MicroBatchLine):
    def _predict(self, mb: int) -> None:
        return None


def _doc(limit: limits.Limit) -> dict:
    doc = limit_to_json(limit)
    doc.pop("seconds")
    return doc


def _real_only(monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setattr(limits, "MicroBatchLine", _NeverPredicts)
    return _doc(max_batch("gpt2", W, gpu="t4"))


def test_max_batch_predicted_equals_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _real_only(monkeypatch)
    _Counting.lines.clear()
    monkeypatch.setattr(limits, "MicroBatchLine", _Counting)
    got = _doc(max_batch("gpt2", W, gpu="t4"))
    assert got == real
    (line,) = _Counting.lines
    assert line.checked is True
    # Real: 1, 2, 4, the check at 8, and the answer and the next one confirmed; the rest
    # of the search's tries were predicted.
    tried = [p["value"] for p in got["curve"]]
    assert {1, 2, 4, 8} <= set(line.real) and len(tried) > len(line.real) <= 6
    assert {real["largest"], real["largest"] + 1} <= set(line.real)


def test_a_prediction_that_differs_at_the_answer_is_searched_again(monkeypatch) -> None:
    """Right at the check, wrong afterwards: the confirmation of the answer catches it and
    the search runs again on real traces."""
    real = _real_only(monkeypatch)
    calls = []
    right = predict.predict_micro_batch

    def wrong_after_the_check(a, mb_a, b, mb_b, mb):  # type: ignore[no-untyped-def]
        out = right(a, mb_a, b, mb_b, mb)
        calls.append(mb)
        if len(calls) == 1:
            return out
        bigger = {s: dataclasses.replace(r, nbytes=r.nbytes * 3) for s, r in out.records.items()}
        return dataclasses.replace(out, records=bigger)

    _Counting.lines.clear()
    monkeypatch.setattr(limits, "MicroBatchLine", _Counting)
    monkeypatch.setattr(predict, "predict_micro_batch", wrong_after_the_check)
    got = _doc(max_batch("gpt2", W, gpu="t4"))
    (line,) = _Counting.lines
    assert line.checked is False and not line.predicted
    # The same answer; the curve keeps only real traces (of both searches), each as real.
    assert got["largest"] == real["largest"]
    assert {p["value"] for p in got["curve"]} == set(line.real)
    truth = {p["value"]: p for p in real["curve"]}
    assert all(truth[p["value"]] == p for p in got["curve"] if p["value"] in truth)


def test_the_planner_predicts_the_fourth_micro_batch(tmp_path) -> None:
    from tests.conftest import tiny_llama_config

    spec = resolve_model(tiny_llama_config(tmp_path))
    shape = Shape("bf16-mixed", "adamw", "off", False, False)
    composer = Composer(spec, (8, 9))
    traced: dict = {}

    def workload_of(s: Shape, mb: int) -> memfit.Workload:
        return memfit.Workload(batch_size=mb, grad_accum=32 // mb, seq_len=16,
                               precision=s.precision, optimizer=s.optimizer)  # fmt: skip

    with session():
        for mb in (2, 4, 8, 16):
            traced[(shape, mb)] = composer.trace(shape, mb, workload_of(shape, mb), traced,
                                                 workload_of)  # fmt: skip
        expected = trace_spec(spec, workload_of(shape, 16), (8, 9), verify=False)
    assert composer.predicted == {(shape, 16)}
    assert [m for s, m in composer.real] == [2, 4, 8]
    assert predict.same_trace(traced[(shape, 16)], expected)
