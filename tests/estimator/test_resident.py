"""The floor of a training step (memfit.estimator.trace.resident) against whole-model traces.

On a tiny llama and a tiny GPT-2 of 6 blocks (traced whole here, shortened to 3 blocks by the
floor): the floor must equal the weights the whole trace registers plus the gradients of its
last step, byte for byte, and lie below the step's peak; by hand for one case.
"""

from __future__ import annotations

import json

import pytest

from memfit.estimator.device_memory import place_on_host
from memfit.estimator.estimation import _short_trace, trace_spec
from memfit.estimator.trace.cache import caching
from memfit.estimator.trace.resident import got_gradient, resident_floor_bytes
from memfit.estimator.trace.step_runner import run_trace
from memfit.models.sources import resolve_model
from memfit.profile import MemoryProfile
from memfit.workload import LoraConfig, Workload

from .test_compose import CAP, GPT2, LLAMA


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("configs")
    out = {}
    untied = dict(LLAMA, tie_word_embeddings=False)
    for name, cfg in (("llama", LLAMA), ("gpt2", GPT2), ("llama-untied", untied)):
        path = root / f"{name}.json"
        path.write_text(json.dumps(cfg))
        out[name] = resolve_model(str(path))
    return out


def _whole(spec, w):
    """The whole model's trace, its weights and the gradients of its last step, and those of
    them a placement of the input embedding on the CPU leaves on the GPU."""
    with caching(False):
        tr = run_trace(spec, w, CAP)
    weights = [
        s for s, r in tr.records.items()
        if r.phase == "setup" and r.category in ("parameters", "buffers") and not r.host
    ]  # fmt: skip
    kept = [*weights, *(s for s in tr.grad_sids[max(tr.grad_sids)] if s is not None)]
    placed = place_on_host(tr.records, optimizer_on_cpu=False, embedding_path=tr.embedding_path)
    return (
        tr,
        sum(tr.records[s].nbytes for s in kept),
        sum(placed[s].nbytes for s in kept if not placed[s].host),
    )


@pytest.mark.parametrize(
    ("model", "precision", "lora"),
    [("llama", "fp32", False), ("llama", "bf16-true", True), ("gpt2", "bf16-mixed", False),
     ("gpt2", "fp16-true", True), ("llama-untied", "bf16-mixed", False)],
)  # fmt: skip
def test_floor_is_the_whole_traces_weights_and_gradients(models, model, precision, lora):
    spec = models[model]
    w = Workload(batch_size=2, seq_len=32, precision=precision, optimizer="adamw", grad_accum=2,
                 lora=LoraConfig(rank=4) if lora else None)  # fmt: skip
    tr, want, on_gpu = _whole(spec, w)
    with caching(False):
        got = got_gradient(_short_trace(spec, w, CAP, 3))
    assert got is not None and all(got)
    assert resident_floor_bytes(spec, w, got, embedding_movable=False) == want
    peak = MemoryProfile.from_events(tr.records, tr.events).peak_allocated_bytes
    assert want < peak
    # Where a placement may move the input embedding to the CPU: what it leaves on the GPU,
    # at most (exactly when the embedding is not tied to the head, which keeps its weight).
    movable = resident_floor_bytes(spec, w, got, embedding_movable=True)
    assert movable < want
    assert movable == on_gpu if model == "llama-untied" else movable <= on_gpu
    # Without a trace to say which parameters get a gradient: the weights alone.
    grads = sum(tr.records[s].nbytes for s in tr.grad_sids[max(tr.grad_sids)] if s is not None)
    assert resident_floor_bytes(spec, w, None, embedding_movable=False) == want - grads


def test_floor_by_hand(models):
    # The tiny llama: 6 blocks of q 64x64, k and v 64x32, o 64x64, gate, up and down 64x128,
    # two norms of 64 (36,992 parameters), the tied embedding 128x64 and the final norm 64:
    # 230,208 parameters, fp32; the rotary embedding's inv_freq and original_inv_freq, 8 fp32
    # each. Weights and gradients: 2 x 920,832 + 64 B. The 3-block model the floor builds
    # trains 29 parameters (9 a block, the embedding, the final norm), each with a gradient.
    w = Workload(batch_size=1, seq_len=16, precision="fp32", optimizer="sgd")
    assert resident_floor_bytes(models["llama"], w, [True] * 29, embedding_movable=False) == (
        2 * 230_208 * 4 + 64
    )
    # The highest floor any trace can give (every parameter with a gradient), before one.
    for got in (None, [False] * 29, [True] * 29):
        assert resident_floor_bytes(
            models["llama"], w, got, embedding_movable=False, every_gradient=True
        ) == (2 * 230_208 * 4 + 64)
    half = [i % 2 == 0 for i in range(29)]
    assert resident_floor_bytes(models["llama"], w, half, embedding_movable=False) < (
        2 * 230_208 * 4 + 64
    )


def test_no_floor_where_the_step_does_not_hold_whole_weights_and_gradients(models):
    spec = models["llama"]
    base = Workload(batch_size=1, seq_len=16, precision="bf16-true", optimizer="adamw")
    for w in (
        base.with_(mode="inference", optimizer="none"),
        base.with_(optimizer_in_backward=True),
        base.with_(gpus=2),  # FSDP2 shards them
        base.with_(fsdp_cpu_offload=True),
    ):
        assert resident_floor_bytes(spec, w, None, embedding_movable=False) is None


@pytest.mark.parametrize("name", ["gpt2", "bloom-560m", "mixtral-8x7b"])
def test_floor_is_the_replayed_traces_weights_and_gradients(name):
    # Catalog models at full depth (12, 24 and 32 blocks; Mixtral's experts): the floor equals
    # the weights and last-step gradients of the trace the estimator replays to all blocks.
    spec = resolve_model(name)
    w = Workload(batch_size=1, seq_len=64, precision="bf16-mixed", optimizer="adamw", grad_accum=2)
    with caching(False):
        tr, _, replayed = trace_spec(spec, w, CAP, verify=False)
    assert replayed
    last = max(tr.grad_sids)
    want = sum(
        r.nbytes for r in tr.records.values()
        if (r.phase == "setup" and r.category in ("parameters", "buffers") and not r.host)
        or (r.category == "gradients" and r.step == last)
    )  # fmt: skip
    assert resident_floor_bytes(spec, w, got_gradient(tr), embedding_movable=False) == want
