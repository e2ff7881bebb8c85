"""The fake trace against real tensors, on CPU.

1. memfit's Tracker, run around the same training loop on real CPU tensors and on FakeTensors,
   records the same allocations and frees in the same order, with the same sizes and ops:
   fake tensors allocate (and autograd frees) exactly what real ones do.
2. memfit's estimate (a fake trace) agrees with torch.distributed._tools.mem_tracker.MemTracker
   run on real tensors, category by category where the categories correspond.

Mapping between MemTracker's categories and memfit's:
- PARAM <-> parameters, GRAD <-> gradients: the same storages.
- OPT is everything allocated inside `optimizer.step()`: the state, the step counters (host
  memory on CUDA, which memfit does not count; on a CPU run host and device are the same) and
  the step's temporaries (foreach Adam's `_foreach_sqrt` outputs), which memfit files under
  temporaries. So OPT <-> optimizer_state + host step counters + optimizer-phase temporaries.
- ACT/TEMP (forward / backward allocations) have no counterpart: memfit splits by lifetime
  (activations outlive the forward, temporaries do not) and has an inputs category.
- MemTracker rounds to 512 B only for CUDA tensors; on CPU it reports raw bytes, so memfit's
  raw (unrounded) storage sizes are compared.
"""

from __future__ import annotations

import contextlib
import copy
from collections import defaultdict

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from memfit import Workload
from memfit.estimator.trace.step_runner import materialize_fake, run_trace
from memfit.estimator.trace.tracker import Tracker
from memfit.events import ALLOC, FREE
from memfit.models.sources import resolve_model
from memfit.profile import MemoryProfile
from tests.conftest import module_spec, tiny_gpt2

BATCH, SEQ, VOCAB = 2, 16, 100


@pytest.fixture(autouse=True)
def _no_packed_sequences(monkeypatch):
    # As memfit's own trace does (trace._unpacked_synthetic_inputs): transformers would read
    # position_ids to detect packed sequences, which fake tensors cannot do; the batches here
    # have one sequence per row, for which the detection answers None on real tensors too.
    import transformers.masking_utils as mu

    monkeypatch.setattr(mu, "find_packed_sequence_indices", lambda position_ids: None)


def tiny_sequential() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32, bias=False), nn.ReLU(), nn.Linear(32, 16, bias=False))


def tiny_gpt2_dropout() -> nn.Module:
    # GPT2Config's default dropout (0.1): dropout masks are part of what is compared.
    return tiny_gpt2(vocab=VOCAB, dropout=0.1).train()


def seq_batch():
    return torch.randn(8, 64)


def seq_loss(model, batch):
    return model(batch).sum()


def gpt2_batch():
    return {
        "input_ids": torch.randint(0, VOCAB, (BATCH, SEQ)),
        "labels": torch.randint(0, VOCAB, (BATCH, SEQ)),
    }


def gpt2_loss(model, batch):
    return model(**batch).loss


CASES = {
    "sequential": (tiny_sequential, seq_batch, seq_loss),
    "gpt2-eager": (tiny_gpt2_dropout, gpt2_batch, gpt2_loss),
}


def train(model, optimizer, make_batch, loss_fn, steps: int = 2, after_step=None) -> None:
    """The clean loop memfit models (see memfit.estimator.trace.step_runner)."""
    for _ in range(steps):
        batch = make_batch()
        loss = loss_fn(model, batch)
        loss.backward()
        del loss, batch
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if after_step is not None:
            after_step()


def tracked_events(model: nn.Module, make_batch, loss_fn, *, fake: bool) -> list[tuple]:
    fake_mode = FakeTensorMode() if fake else None
    if fake:
        model = materialize_fake(model, fake_mode, None, True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    tracker = Tracker(model)
    with fake_mode or contextlib.nullcontext(), tracker:
        for p in model.parameters():
            tracker.register(p, "parameters")
        train(model, optimizer, make_batch, loss_fn)
    tracker.close()
    return [(ev[0], tracker.records[ev[1]].nbytes, ev[4]) for ev in tracker.events]


# -------------------------------------------------------------- 1. real == fake, per event


@pytest.mark.parametrize("case", list(CASES))
def test_tracker_real_equals_fake_event_for_event(case: str) -> None:
    build, make_batch, loss_fn = CASES[case]
    model = build()
    real = tracked_events(copy.deepcopy(model), make_batch, loss_fn, fake=False)
    fake = tracked_events(copy.deepcopy(model), make_batch, loss_fn, fake=True)
    assert len(real) > 50
    # (kind, bytes, op) of every allocation and free, in order.
    assert [(k, n) for k, n, _ in real] == [(k, n) for k, n, _ in fake]
    assert real == fake
    # Everything allocated in the loop (not the parameters) is freed or is optimizer state.
    assert sum(1 for k, _, _ in real if k == ALLOC) > sum(1 for k, _, _ in real if k == FREE)


# --------------------------------------------------------------- 2. memfit vs MemTracker


def memtracker_peak(model: nn.Module, make_batch, loss_fn) -> dict[str, int]:
    MemTracker = pytest.importorskip("torch.distributed._tools.mem_tracker").MemTracker

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    mt = MemTracker()
    mt.track_external(model, optimizer)
    with mt:
        # MemTracker refuses a second forward of a module unless its stats are reset.
        train(model, optimizer, make_batch, loss_fn, after_step=mt.reset_mod_stats)
    snap = mt.get_tracker_snapshot("peak")[torch.device("cpu")]
    return {str(getattr(k, "value", k)): v for k, v in snap.items()}


def memfit_raw_peak(spec, w: Workload) -> tuple[MemoryProfile, dict[str, int]]:
    """memfit's fake trace; raw bytes per category of the storages alive at its peak."""
    tr = run_trace(spec, w, (8, 0))
    prof = MemoryProfile.from_events(tr.records, tr.events)
    alive: dict[int, None] = {}
    for ev in tr.events[: prof.peak_index + 1]:
        if ev[0] == ALLOC:
            alive[ev[1]] = None
        else:
            alive.pop(ev[1], None)
    raw: dict[str, int] = defaultdict(int)
    for sid in alive:
        r = tr.records[sid]
        key = "host_" + r.category if r.host else r.category
        if r.phase == "optimizer" and r.category == "temporaries":
            key = "optimizer_temporaries"
        raw[key] += r.nbytes
    return prof, dict(raw)


def close(a: int, b: int, rel: float = 0.01) -> bool:
    return abs(a - b) <= rel * max(a, b)


def test_memtracker_sequential_adamw() -> None:
    mt = memtracker_peak(tiny_sequential(), seq_batch, seq_loss)
    spec = module_spec(tiny_sequential(), lambda b: seq_batch())
    prof, raw = memfit_raw_peak(spec, Workload(batch_size=8, optimizer="adamw"))
    # Hand sizes: W1 32x64 fp32 = 8192 B, W2 16x32 fp32 = 2048 B; P = 10240.
    P = 8192 + 2048
    assert mt["Parameter"] == raw["parameters"] == P
    assert mt["Gradient"] == raw["gradients"] == P
    # OPT: exp_avg + exp_avg_sq (2 P) + _foreach_sqrt temporaries (P) + two fp32 step
    # counters (2 * 4 B, host memory on CUDA).
    assert mt["Optstate"] == 2 * P + P + 2 * 4
    assert raw["optimizer_state"] == 2 * P
    assert raw["optimizer_temporaries"] == P
    assert raw["host_optimizer_state"] == 2 * 4
    assert mt["Activation"] == mt["Temp"] == 0
    # Totals: MemTracker counts the 8 host bytes; memfit's device peak does not.
    assert mt["Total"] == 5 * P + 8
    assert prof.peak_allocated_bytes == 5 * P
    assert prof.peak_phase == "optimizer"


def test_memtracker_gpt2_eager_adamw() -> None:
    mt = memtracker_peak(tiny_gpt2(), gpt2_batch, gpt2_loss)
    # task="causal-lm" so memfit makes labels and uses the model's cross-entropy loss, as the
    # loop above does (an nn.Module alone gets task "custom": no labels, loss = logits.sum()).
    spec = resolve_model(tiny_gpt2(), task="causal-lm")
    w = Workload(batch_size=BATCH, seq_len=SEQ, optimizer="adamw", attention="eager")
    _, raw = memfit_raw_peak(spec, w)

    assert close(raw["parameters"], mt["Parameter"])
    assert close(raw.get("gradients", 0), mt["Gradient"])
    opt = (
        raw.get("optimizer_state", 0)
        + raw.get("host_optimizer_state", 0)
        + raw.get("optimizer_temporaries", 0)
    )
    assert close(opt, mt["Optstate"])
    memfit_total = sum(raw.values())
    assert close(memfit_total, mt["Total"])
    # Exact, in fact: same storages at the same moment.
    assert raw["parameters"] == mt["Parameter"]
    assert raw.get("gradients", 0) == mt["Gradient"]
    assert opt == mt["Optstate"]
    assert memfit_total == mt["Total"]
