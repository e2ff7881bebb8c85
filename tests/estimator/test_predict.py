"""Traces predicted at another micro-batch (memfit.estimator.predict) against real traces.

Across the replay test matrix's axes (precision, optimizer, checkpointing, LoRA) and the
accumulation (one traced micro-batch or two), on a tiny llama and a tiny GPT-2 (config files,
so memfit shortens them to 3 blocks and replays them to 6 as for any catalog model), and for
the lean techniques: the step at micro-batch 7 predicted from the steps at 2 and 3 must equal
its real trace event for event, storage for storage and in FLOPs. By default a subset that
takes every value of every axis runs; MEMFIT_SLOW_TESTS=1 runs all.
"""

from __future__ import annotations

import dataclasses
import itertools
import os

import pytest

import memfit
from memfit.estimator.estimation import trace_spec
from memfit.estimator.predict import PredictMismatch, predict_micro_batch
from memfit.estimator.trace.cache import session
from memfit.models.sources import resolve_model
from memfit.profile import MemoryProfile
from memfit.workload import LoraConfig
from tests.estimator.test_compose import PRECISIONS, write_configs

CAP = (8, 9)
OPTIMIZERS = ("adamw", "adamw-8bit", "adafactor", "sgd-momentum", "lion")
MATRIX = list(itertools.product(("llama", "gpt2"), PRECISIONS, OPTIMIZERS, ("off", "blocks"),
                                (False, True), (1, 2)))  # fmt: skip
# Every value of every axis at least once.
FAST = [
    ("llama", "bf16-mixed", "adamw", "blocks", False, 2),
    ("llama", "fp16-mixed", "adamw-8bit", "off", True, 1),
    ("llama", "fp32", "sgd-momentum", "blocks", True, 2),
    ("gpt2", "bf16-true", "lion", "off", False, 2),
    ("gpt2", "bf16-mixed", "adafactor", "blocks", True, 1),
]
CASES = MATRIX if os.environ.get("MEMFIT_SLOW_TESTS") else FAST
#: The lean techniques, on the llama in bf16-mixed with AdamW, accumulating.
TECHNIQUES = {
    "offload-activations": dict(offload_activations=True),
    "chunked-loss": dict(chunked_loss=4),
    "in-backward": dict(optimizer_in_backward=True),
    "qlora": dict(quantize="nf4", lora=LoraConfig(rank=4)),
    "offload-optimizer": dict(offload_optimizer=True),
}


@pytest.fixture(scope="module")
def configs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return write_configs(tmp_path_factory.mktemp("predict"))


def _key(tr: memfit.estimator.trace.step_runner.Trace) -> tuple:
    p = MemoryProfile.from_events(tr.records, tr.events)
    phases = sorted((ph.step, ph.phase, ph.peak_bytes) for ph in p.phases)
    return (p.peak_allocated_bytes, p.breakdown, p.by_module, phases, p.timeline)


def _predicted_equals_real(spec, w: memfit.Workload, mbs=(2, 3), target=7) -> None:
    accumulating = w.grad_accum > 1
    with session():
        traces = {
            mb: trace_spec(spec, w.with_(batch_size=mb, grad_accum=2 if accumulating else 1),
                           CAP, verify=False)
            for mb in (*mbs, target)
        }  # fmt: skip
    (a, _, _), (b, _, _), (real, n, _) = (traces[m] for m in (*mbs, target))
    assert n == 6  # replayed, or traced whole where the blocks do not replay
    got = predict_micro_batch(a, mbs[0], b, mbs[1], target)
    assert got.events == real.events
    assert got.records == real.records
    assert got.flops == real.flops
    assert _key(got) == _key(real)
    # The sizes did change: the prediction is not a copy of a source.
    assert _key(got) != _key(b)


@pytest.mark.parametrize(("model", "precision", "optimizer", "checkpointing", "lora", "accum"),
                         CASES)  # fmt: skip
def test_predicted_equals_the_real_trace(configs, model, precision, optimizer, checkpointing,
                                         lora, accum) -> None:  # fmt: skip
    w = memfit.Workload(
        seq_len=16,
        grad_accum=accum,
        precision=precision,
        optimizer=optimizer,
        checkpointing=checkpointing,
        lora=LoraConfig(rank=4) if lora else None,
    )
    _predicted_equals_real(resolve_model(configs[model]), w)


@pytest.mark.parametrize("technique", list(TECHNIQUES))
def test_lean_techniques_predict_exactly(configs, technique) -> None:
    accum = 1 if technique == "in-backward" else 2
    w = memfit.Workload(seq_len=16, grad_accum=accum, precision="bf16-mixed",
                        **TECHNIQUES[technique])  # fmt: skip
    _predicted_equals_real(resolve_model(configs["llama"]), w)


def test_inference_predicts_exactly(configs) -> None:
    w = memfit.Workload(seq_len=16, mode="inference", precision="bf16-true")
    _predicted_equals_real(resolve_model(configs["gpt2"]), w, mbs=(2, 5), target=3)


def test_what_the_line_cannot_give_is_refused(configs) -> None:
    spec = resolve_model(configs["llama"])
    w = memfit.Workload(seq_len=16, grad_accum=2, precision="bf16-mixed")
    with session():
        one, two, three = (trace_spec(spec, w.with_(batch_size=m), CAP, verify=False)[0]
                           for m in (1, 2, 3))  # fmt: skip
        alone = trace_spec(spec, w.with_(batch_size=3, grad_accum=1), CAP, verify=False)[0]
    # Micro-batch 1 allocates other storages (it is neither a source nor a target).
    with pytest.raises(PredictMismatch, match="two different sources of 2 or more"):
        predict_micro_batch(two, 2, three, 3, 1)
    with pytest.raises(PredictMismatch, match="two different sources"):
        predict_micro_batch(one, 1, three, 3, 5)
    with pytest.raises(PredictMismatch, match="two different sources"):
        predict_micro_batch(two, 2, two, 2, 5)
    # One traced micro-batch against two: another stream.
    with pytest.raises(PredictMismatch, match="different storages"):
        predict_micro_batch(two, 2, alone, 3, 5)
    # A size off the line of whole numbers: 2 -> 3 grows a storage by 5 bytes, 4 -> 5 by 7.
    sid = next(s for s, r in two.records.items() if r.nbytes != three.records[s].nbytes)
    bent = dataclasses.replace(
        three, records={**three.records, sid: dataclasses.replace(
            three.records[sid], nbytes=two.records[sid].nbytes + 1)},
    )  # fmt: skip
    with pytest.raises(PredictMismatch, match="is not a whole number"):
        predict_micro_batch(two, 2, bent, 4, 5)
    shrunk = dataclasses.replace(
        three, records={**three.records, sid: dataclasses.replace(three.records[sid], nbytes=0)}
    )
    with pytest.raises(PredictMismatch, match="below zero"):
        predict_micro_batch(two, 2, shrunk, 3, 40)
    other = dataclasses.replace(three, records={**three.records, sid: dataclasses.replace(
        three.records[sid], category="gradients")})  # fmt: skip
    with pytest.raises(PredictMismatch, match=f"storage {sid} differs in more than its size"):
        predict_micro_batch(two, 2, other, 3, 5)


def test_the_matrix_covers_every_value() -> None:
    axes = (("llama", "gpt2"), PRECISIONS, OPTIMIZERS, ("off", "blocks"), (False, True), (1, 2))
    for axis, values in enumerate(axes):
        assert {c[axis] for c in FAST} == set(values)
