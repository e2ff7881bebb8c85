"""Replay of repeated blocks (memfit.replay.expand) against a full trace of the same model.

A model of N identical blocks is traced twice: fully, and with 3 blocks whose event stream is
expanded to N. The profiles (peak, breakdown at the peak, bytes per module, per-phase peaks)
must be identical. For some configurations the two streams are identical event for event; for
others the replay emits a few frees in another order (see EXACT_TIMELINE and
`test_replay_matches_full_trace`). Where the replay refuses (ReplayMismatch), the estimate must
fall back to a full trace.

Cost: each trace of a tiny model takes about 0.7 s on a CPU, and the whole matrix (64 llama and
16 gpt2 configurations) about 2.5 minutes; by default a subset runs that takes every value of
every axis (FAST, GPT2_FAST). Set MEMFIT_SLOW_TESTS=1 to run the whole matrix.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections import Counter

import pytest
import transformers

from memfit import Workload
from memfit.profile import MemoryProfile
from memfit.replay import TRACED_BLOCKS, ReplayMismatch, expand
from memfit.sources import ModelSpec
from memfit.trace import run_trace

PRECISIONS = ("fp32", "bf16-mixed", "bf16-true", "fp16-mixed")
OPTIMIZERS = ("adamw", "sgd-momentum", "lion", "adamw-8bit")
CHECKPOINTING = ("off", "blocks")
NUM_LAYERS = (5, 7)
CAPABILITY = (8, 0)

RUN_SLOW = bool(os.environ.get("MEMFIT_SLOW_TESTS"))
slow = pytest.mark.skipif(not RUN_SLOW, reason="full replay matrix: set MEMFIT_SLOW_TESTS=1")


# ------------------------------------------------------------------------------- models


def _llama(n_layers: int, attention: str, vocab: int = 1000):
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=vocab,
        num_hidden_layers=n_layers,
        max_position_embeddings=128,
    )
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation=attention)


def _gpt2(n_layers: int, attention: str, vocab: int = 1000):
    cfg = transformers.GPT2Config(
        n_layer=n_layers,
        n_embd=64,
        n_head=4,
        vocab_size=vocab,
        n_positions=128,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation=attention)


FACTORIES = {"llama": _llama, "gpt2": _gpt2}


def make_spec(arch: str, n: int, vocab: int = 1000) -> ModelSpec:
    factory = FACTORIES[arch]

    def build(k: int | None = None, attention: str = "sdpa"):
        return factory(k or n, attention, vocab)

    return ModelSpec(
        name=f"tiny-{arch}",
        build=build,
        owns_model=True,
        input_kind="tokens",
        task="causal-lm",
        max_positions=128,
        num_layers=n,
        can_shorten=True,
    )


def workload(precision: str, optimizer: str, checkpointing: str) -> Workload:
    return Workload(
        batch_size=2,
        seq_len=16,
        precision=precision,
        optimizer=optimizer,
        checkpointing=checkpointing,
    )


# The trace of 3 blocks does not depend on N: shared between N = 5 and N = 7.
@functools.cache
def short_trace(arch: str, precision: str, optimizer: str, checkpointing: str):
    w = workload(precision, optimizer, checkpointing)
    return run_trace(make_spec(arch, 99), w, CAPABILITY, num_layers=TRACED_BLOCKS)


def full_trace(arch: str, n: int, precision: str, optimizer: str, checkpointing: str):
    return run_trace(make_spec(arch, n), workload(precision, optimizer, checkpointing), CAPABILITY)


# ---------------------------------------------------------------------------- comparison


def profile_key(p: MemoryProfile) -> dict:
    return {
        "peak": p.peak_allocated_bytes,
        "peak_step": p.peak_step,
        "peak_phase": p.peak_phase,
        "breakdown": p.breakdown,
        "by_module": p.by_module,
        "phases": sorted((x.step, x.phase, x.peak_bytes) for x in p.phases),
        "max_activation_bytes": getattr(p, "max_activation_bytes", None),
    }


def event_rows(records, events) -> list[tuple]:
    """Each event with its storage's size and category; storage ids differ and are left out."""
    return [(ev[0], records[ev[1]].nbytes, records[ev[1]].category, *ev[2:]) for ev in events]


def record_rows(records) -> Counter:
    return Counter(
        (r.nbytes, r.category, r.phase, r.step, r.op, r.module, r.owner, r.host)
        for r in records.values()
    )


def exact_timeline(arch: str, precision: str, optimizer: str, checkpointing: str) -> bool:
    """Configurations whose replayed stream equals the full trace event for event.

    Observed with torch 2.13 / transformers 5.x. Elsewhere only the order of some frees differs:
    - lion (per-parameter loop): the update temporary of a block's last parameter is freed while
      the next block's first parameter is processed. The run structure of `expand` then replays
      that next block's first-parameter run for every copy before the rest of the blocks.
    - 16-bit autocast with checkpointing: the cast weights released when the autocast cache is
      cleared are freed all at one point, in another order.
    - llama bf16-true without checkpointing: each decoder layer's output is freed by the parent
      (`hidden_states = layer(hidden_states)`) after the next layer returns; the replay frees
      the copies' outputs all after the last copy. (See test_replay_bug_* for when this and the
      lion reordering change the peak.)
    - gpt2 with 16-bit autocast: frees of cast weights at the same point, in another order.
    """
    if optimizer == "lion":
        return False
    mixed = precision.endswith("-mixed")
    if arch == "gpt2":
        return not mixed
    if precision == "fp32":
        return True
    if mixed:
        return checkpointing == "off"
    return checkpointing == "blocks"  # bf16-true


def _check(arch: str, n: int, precision: str, optimizer: str, checkpointing: str) -> None:
    short = short_trace(arch, precision, optimizer, checkpointing)
    assert len(short.block_paths) == TRACED_BLOCKS
    rec_r, ev_r = expand(short.records, short.events, n, short.block_paths)
    full = full_trace(arch, n, precision, optimizer, checkpointing)
    assert len(full.block_paths) == n

    # Same storages (sizes, categories, where allocated), and the same events as a multiset.
    assert record_rows(rec_r) == record_rows(full.records)
    rows_r, rows_f = event_rows(rec_r, ev_r), event_rows(full.records, full.events)
    assert Counter(rows_r) == Counter(rows_f)

    # The profile is identical.
    assert profile_key(MemoryProfile.from_events(rec_r, ev_r)) == profile_key(
        MemoryProfile.from_events(full.records, full.events)
    )

    if exact_timeline(arch, precision, optimizer, checkpointing):
        assert rows_r == rows_f
    else:
        assert rows_r != rows_f, (
            "the replay now reproduces this configuration event for event: "
            "add it to exact_timeline()"
        )


# Run by default: every value of every axis, exact and non-exact timelines alike.
FAST = {
    ("fp32", "adamw", "off", 5),
    ("bf16-mixed", "sgd-momentum", "blocks", 7),
    ("bf16-true", "adamw-8bit", "off", 7),
    ("fp16-mixed", "adamw", "off", 5),
    ("fp32", "lion", "blocks", 5),
    ("bf16-true", "adamw", "blocks", 7),
}
MATRIX = [
    pytest.param(*cfg, marks=() if cfg in FAST else slow, id="-".join(map(str, cfg)))
    for cfg in itertools.product(PRECISIONS, OPTIMIZERS, CHECKPOINTING, NUM_LAYERS)
]


def test_fast_subset_covers_every_value() -> None:
    axes = (PRECISIONS, OPTIMIZERS, CHECKPOINTING, NUM_LAYERS)
    for a, values in enumerate(axes):
        assert {c[a] for c in FAST} == set(values)
    kinds = {exact_timeline("llama", *c[:3]) for c in FAST}
    assert kinds == {True, False}


@pytest.mark.parametrize(("precision", "optimizer", "checkpointing", "n"), MATRIX)
def test_llama_replay_matches_full_trace(precision, optimizer, checkpointing, n) -> None:
    _check("llama", n, precision, optimizer, checkpointing)


GPT2_FAST = {("fp32", "blocks", 7), ("bf16-mixed", "off", 5)}
GPT2_MATRIX = [
    pytest.param(*cfg, marks=() if cfg in GPT2_FAST else slow, id="-".join(map(str, cfg)))
    for cfg in itertools.product(PRECISIONS, CHECKPOINTING, NUM_LAYERS)
]


@pytest.mark.parametrize(("precision", "checkpointing", "n"), GPT2_MATRIX)
def test_gpt2_replay_matches_full_trace(precision, checkpointing, n) -> None:
    _check("gpt2", n, precision, "adamw", checkpointing)


# ------------------------------------------------------------------ fallback to full trace


def test_adafactor_refuses_replay_and_estimate_traces_everything(monkeypatch) -> None:
    import memfit.estimator as estimator_mod

    n = 5
    spec = make_spec("llama", n)
    w = workload("fp32", "adafactor", "off")
    calls = []
    real_run_trace = estimator_mod.run_trace

    def spy(*args, **kwargs):
        tr = real_run_trace(*args, **kwargs)
        calls.append((kwargs.get("num_layers"), tr))
        return tr

    monkeypatch.setattr(estimator_mod, "run_trace", spy)
    tr, blocks, replayed = estimator_mod.trace_spec(spec, w, CAPABILITY)

    # It tried the 3-block trace first; its blocks do not replay (Adafactor's first block
    # differs: the step-0 state creation of the first block has fewer event runs).
    # 3 blocks, then the 4-block verification trace (whose expansion raises), then all.
    assert [c[0] for c in calls] == [TRACED_BLOCKS, TRACED_BLOCKS + 1, None]
    short = calls[0][1]
    with pytest.raises(ReplayMismatch):
        expand(short.records, short.events, n, short.block_paths)
    # ... so the estimate used the full trace.
    assert replayed is False
    assert blocks == n
    full = real_run_trace(spec, w, CAPABILITY)
    assert profile_key(MemoryProfile.from_events(tr.records, tr.events)) == profile_key(
        MemoryProfile.from_events(full.records, full.events)
    )
    assert event_rows(tr.records, tr.events) == event_rows(full.records, full.events)


# ------------------------------------------------------------------------- known bugs
#
# Two patterns `expand` does not model (both over-estimate):
# - inference: a decoder layer's output is freed by the parent loop
#   (`hidden_states = layer(hidden_states)`) after the NEXT layer returns, in a non-block run.
#   `expand` releases every copy's output at the one point where T1's was released (after
#   T2), so the outputs of blocks 1..N-3 stay alive until the last block: + (N-3) hidden
#   states while the last blocks run.
# - per-parameter optimizers (lion): the update temporary of a block's last parameter is freed
#   while the next block's first parameter is processed, which splits that block's run in two.
#   `expand` replays run by run, every copy in turn, so the first-parameter runs of all copies
#   come before the rest and their temporaries overlap.
# trace_spec verifies the replay on 4 blocks before using it (estimator._replay_verified); that
# guard catches the tiny cases below (CAUGHT), but not the GUARD_MISSES ones, where the excess
# of a single extra copy does not move any phase peak of the 4-block model while N-3 copies do.


def _inference(vocab: int, n: int):
    return make_spec("llama", n, vocab=vocab), Workload(
        batch_size=4, seq_len=64, mode="inference", steps=1
    )


def _lion(vocab: int, n: int):
    return make_spec("llama", n, vocab=vocab), Workload(batch_size=1, seq_len=8, optimizer="lion")


CAUGHT = {
    # vocab 16: the peak is inside the block stack.
    "inference": lambda: _inference(16, 7),
    "lion": lambda: _lion(16, 7),
}


@functools.cache
def _estimate_path(case: str):
    """trace_spec on a CAUGHT case, with every run_trace call it made: (3, 4, full)."""
    import memfit.estimator as estimator_mod

    spec, w = CAUGHT[case]()
    calls = []
    real_run_trace = estimator_mod.run_trace

    def spy(*args, **kwargs):
        tr = real_run_trace(*args, **kwargs)
        calls.append((kwargs.get("num_layers"), tr))
        return tr

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(estimator_mod, "run_trace", spy)
        tr, blocks, replayed = estimator_mod.trace_spec(spec, w, CAPABILITY)
    return spec, tr, blocks, replayed, calls


@pytest.mark.parametrize("case", list(CAUGHT))
def test_replay_guard_falls_back_to_full_trace(case: str) -> None:
    spec, tr, blocks, replayed, calls = _estimate_path(case)
    assert [c[0] for c in calls] == [TRACED_BLOCKS, TRACED_BLOCKS + 1, None]
    assert replayed is False
    assert blocks == spec.num_layers
    assert tr is calls[-1][1]


@pytest.mark.xfail(
    strict=True,
    reason=(
        "replay.expand: inference block outputs freed by the parent after the next block are "
        "all released after the last copy (+(N-3) hidden states); lion's split first-parameter "
        "runs are replayed for every copy before the rest (overlapping temporaries)"
    ),
)
@pytest.mark.parametrize("case", list(CAUGHT))
def test_replay_bug_expand_over_estimates(case: str) -> None:
    spec, _, _, _, calls = _estimate_path(case)
    short, full = calls[0][1], calls[-1][1]
    records, events = expand(short.records, short.events, spec.num_layers, short.block_paths)
    # Observed with N = 7: inference + (7 - 3) * (4 * 64 * 64 * 4 B) = 262144;
    # lion + (7 - 3) * 16384 (a 64 x 64 fp32 update temporary).
    assert profile_key(MemoryProfile.from_events(records, events)) == profile_key(
        MemoryProfile.from_events(full.records, full.events)
    )


GUARD_MISSES = {
    # vocab 384, 8 layers: the 4-block model peaks at the logits; 5 copies' extra outputs
    # move the 8-layer peak into the stack. Observed + 134144 B (2,512,896 vs 2,378,752).
    "inference": lambda: _inference(384, 8),
    # vocab 256, 8 layers: observed + 48640 B (4,532,736 vs 4,484,096).
    "lion": lambda: _lion(256, 8),
}


@pytest.mark.xfail(
    strict=True,
    reason=(
        "estimator.trace_spec: the 4-block replay guard passes, and the expansion to 8 blocks "
        "over-estimates the peak (see the replay.expand bugs above)"
    ),
)
@pytest.mark.parametrize("case", list(GUARD_MISSES))
def test_replay_bug_guard_misses(case: str) -> None:
    import memfit.estimator as estimator_mod

    spec, w = GUARD_MISSES[case]()
    tr, _, _ = estimator_mod.trace_spec(spec, w, CAPABILITY)
    full = run_trace(spec, w, CAPABILITY)
    assert (
        MemoryProfile.from_events(tr.records, tr.events).peak_allocated_bytes
        == MemoryProfile.from_events(full.records, full.events).peak_allocated_bytes
    )
