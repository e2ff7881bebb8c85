"""Never break the user's run (DESIGN.md): a failure of memfit's own work inside a training loop
is reported once and the loop trains exactly as it would without memfit.

Each fault is injected into one of memfit's internal functions (it raises
`RuntimeError("injected")`) while a tiny GPT-2 trains for a few seeded steps under `measure`,
`doctor`, `oom_guard` or `apply_`; the trained weights must equal (torch.equal) those of the
same loop without memfit. FLOP counts are estimates: grouped-query attention is counted as
attention over K/V expanded to the query's heads on every torch, and a formula that raises
leaves its op uncounted. Callbacks: tests/integrations/test_never_break.py.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import memfit
from memfit._compat import torch_at_least
from memfit.diagnosis import saved_tensors, tracking
from memfit.diagnosis.findings import Findings
from memfit.errors import MemfitFailureWarning
from memfit.estimator import flops
from memfit.estimator.flops import count_flops
from memfit.estimator.trace.tracker import Tracker
from memfit.guard import retry
from memfit.measurement import measure as measure_module
from memfit.measurement import phases
from memfit.profile import MemoryProfile
from tests.conftest import tiny_gpt2

aten = torch.ops.aten
SEQ, BATCH, VOCAB, STEPS = 16, 4, 100, 3


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone()}


def _train(watch: Callable[[Any, Any], Any] | None = None) -> tuple[list[torch.Tensor], Any]:
    """STEPS steps of AdamW on a seeded 2-layer GPT-2 inside `watch(model, optimizer)` (a
    context manager) or alone; the trained weights and what the context gave."""
    model = tiny_gpt2(2, n_positions=SEQ)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = _batch()
    ctx = watch(model, opt) if watch is not None else contextlib.nullcontext()
    with ctx as got:
        for _ in range(STEPS):
            loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in model.parameters()], got


@pytest.fixture(scope="module")
def reference() -> list[torch.Tensor]:
    return _train()[0]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _injected(*_: Any, **__: Any) -> Any:
    raise RuntimeError("injected")


@contextlib.contextmanager
def _failure_warnings() -> Iterator[list[warnings.WarningMessage]]:
    """The MemfitFailureWarnings raised inside the block (every one, not once per place)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got: list[warnings.WarningMessage] = []
        yield got
    got += [w for w in caught if issubclass(w.category, MemfitFailureWarning)]


# -- memfit.measure ------------------------------------------------------------------------

#: (object, attribute) of each part of the measurement that runs inside the user's loop.
MEASURE_FAULTS = {
    "after-op bookkeeping": (measure_module._LiveTracker, "_record_op"),
    "new storage": (measure_module._LiveTracker, "_track"),
    "module pre-hook": (Tracker, "_enter_module"),
    "module hook": (Tracker, "_leave_module"),
    "free finalizer": (Tracker, "_freed"),
    "gradient hook and phase marks": (Tracker, "mark"),
    "forward hook": (phases.PhaseHooks, "on_forward"),
    "optimizer step hook": (phases.PhaseHooks, "on_step_post"),
    "start": (measure_module, "_register_start"),
    "collect": (MemoryProfile, "from_events"),
}


@pytest.mark.parametrize("fault", list(MEASURE_FAULTS))
def test_measure_steps_aside_and_the_loop_trains_the_same(monkeypatch, reference, fault):
    owner, name = MEASURE_FAULTS[fault]
    monkeypatch.setattr(owner, name, _injected)
    with _failure_warnings() as reports:
        weights, m = _train(lambda model, opt: memfit.measure(model, opt))
    assert _same(weights, reference)
    assert m.failed is not None and "RuntimeError: injected" in m.failed
    assert m.profile is None  # incomplete: not reported as if it were the run
    assert len(reports) == 1
    assert "memfit: memfit.measure stopped after its own error in" in str(reports[0].message)


def test_measure_stepped_aside_removes_its_hooks(monkeypatch):
    monkeypatch.setattr(Tracker, "_enter_module", _injected)
    model = torch.nn.Linear(8, 4)
    with _failure_warnings(), memfit.measure(model) as m:
        model(torch.randn(2, 8)).sum().backward()
    assert m.failed is not None
    assert not model._forward_pre_hooks
    assert model.weight._post_accumulate_grad_hooks in (None, {})


def test_the_users_own_error_propagates_unchanged():
    """The user's op runs outside memfit's guard: its error (a real OutOfMemoryError here)
    reaches the user as the same object, and the measurement is not a failure of memfit's."""
    error = torch.OutOfMemoryError("injected by the user's model")

    class Failing(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise error

    with pytest.raises(torch.OutOfMemoryError) as info, memfit.measure(Failing()) as m:
        Failing()(torch.ones(2))
    assert info.value is error
    assert m.failed is None and m.oom_report is not None


# -- memfit.doctor -------------------------------------------------------------------------

DOCTOR_FAULTS = {
    "storage recorder": (tracking.StorageTracker, "_record"),
    "graph recorder": (tracking.GradTracker, "_remember"),
    "saved-tensor pack": (saved_tensors.SavedBook, "_handle"),
    "saved-tensor release": (saved_tensors.SavedBook, "_released"),
    "step boundary analysis": (Findings, "boundary"),
    "exit analysis": (saved_tensors.SavedBook, "close"),
}


@pytest.mark.parametrize("fault", list(DOCTOR_FAULTS))
def test_doctor_stops_and_the_loop_trains_the_same(monkeypatch, reference, fault):
    owner, name = DOCTOR_FAULTS[fault]
    monkeypatch.setattr(owner, name, _injected)
    with _failure_warnings() as reports:
        weights, dr = _train(lambda model, opt: memfit.doctor(optimizer=opt, model=model))
    assert _same(weights, reference)
    assert dr.failed is not None and "RuntimeError: injected" in dr.failed
    assert isinstance(dr.findings, list)
    assert len(reports) == 1
    assert "memfit: memfit.doctor stopped after its own error in" in str(reports[0].message)


def test_doctor_without_failure_trains_the_same(reference):
    weights, dr = _train(lambda model, opt: memfit.doctor(optimizer=opt, model=model))
    assert _same(weights, reference) and dr.failed is None and dr.steps == STEPS


# -- oom_guard -----------------------------------------------------------------------------


def _applied() -> tuple[torch.nn.Module, Any]:
    model = tiny_gpt2(2, n_positions=SEQ)
    return model, memfit.apply_(model, memfit.Workload(batch_size=BATCH, seq_len=SEQ), lr=1e-2)


def _steps(run: Callable[[dict[str, torch.Tensor]], Any]) -> None:
    for _ in range(STEPS):
        run(_batch())


def test_oom_guard_that_fails_runs_the_step_unguarded(monkeypatch):
    model, setup = _applied()
    _steps(setup.step)
    want = [p.detach().clone() for p in model.parameters()]
    monkeypatch.setattr(retry._OptimizerWatch, "__enter__", _injected)
    model, setup = _applied()
    guarded = memfit.oom_guard(setup)
    with _failure_warnings() as reports:
        _steps(guarded.step)
    assert _same([p.detach().clone() for p in model.parameters()], want)
    assert guarded.failed is not None and "injected" in guarded.failed
    assert len(reports) == 1


@pytest.mark.parametrize("fault", ["_more_accumulation", "free_memory"])
def test_oom_guard_that_fails_after_an_oom_raises_the_oom(monkeypatch, fault):
    """A step that runs out of memory: without the guard the OOM reaches the user; a guard
    whose own retry work fails lets it reach the user too (not its own error)."""
    _model, setup = _applied()
    step = setup.step

    def oom_at_full_batch(batch: Any) -> Any:
        if setup.grad_accum == 1:
            raise torch.OutOfMemoryError("injected out of memory")
        return step(batch)

    monkeypatch.setattr(setup, "step", oom_at_full_batch)
    monkeypatch.setattr(retry, fault, _injected)
    guarded = memfit.oom_guard(setup)
    with _failure_warnings() as reports, pytest.raises(torch.OutOfMemoryError) as info:
        guarded.step(_batch())
    assert "injected out of memory" in str(info.value)
    assert guarded.failed is not None and len(reports) == 1


def test_oom_guard_function_form_that_fails_runs_unguarded(monkeypatch):
    model = tiny_gpt2(2, n_positions=SEQ)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sizes: list[int] = []

    def train_step(batch: dict[str, torch.Tensor], micro_batch_size: int) -> None:
        sizes.append(micro_batch_size)
        model(**batch).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    monkeypatch.setattr(retry._OptimizerWatch, "__enter__", _injected)
    guarded = memfit.oom_guard(train_step, optimizer=opt)
    with _failure_warnings() as reports:
        _steps(guarded)
    assert sizes == [BATCH] * STEPS and guarded.failed is not None and len(reports) == 1


# -- apply_'s hooks ------------------------------------------------------------------------


def test_checkpointed_blocks_train_the_same_when_the_region_listener_fails(monkeypatch):
    """apply_'s checkpointed blocks tell the measuring tracker where a recomputation starts
    (memfit.techniques.checkpointing.region_listeners); that listener failing inside the
    user's backward stops the measurement, not the recomputation."""
    w = memfit.Workload(batch_size=BATCH, seq_len=SEQ, checkpointing="blocks")

    def trained(measured: bool) -> tuple[list[torch.Tensor], Any]:
        model = tiny_gpt2(2, n_positions=SEQ)
        setup = memfit.apply_(model, w, lr=1e-2)
        ctx = memfit.measure(model, setup.optimizer) if measured else contextlib.nullcontext()
        with ctx as m:
            _steps(setup.step)
        return [p.detach().clone() for p in model.parameters()], m

    want, _ = trained(False)
    monkeypatch.setattr(Tracker, "_block_region", _injected)
    with _failure_warnings() as reports:
        got, m = trained(True)
    assert _same(got, want)
    assert m.failed is not None and "checkpointed-region listener" in m.failed
    assert len(reports) == 1


# -- FLOP counting -------------------------------------------------------------------------

Q = (1, 8, 16, 32)  # (B, H, S, D): 8 query heads
KV = (1, 2, 16, 32)  # 2 key/value heads: groups of 4


def _meta(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.empty(shape, device="meta", dtype=torch.bfloat16)


def _repeated(t: torch.Tensor, heads_dim: int = 1) -> torch.Tensor:
    return t.repeat_interleave(Q[1] // KV[1], dim=heads_dim)


#: Attention ops of the CUDA kernels, as SDPA calls them: (op, args before q/k/v, args after).
def _attention_calls() -> list[tuple[Any, tuple, tuple]]:
    q = _meta(Q)
    out, lse = _meta(Q), torch.empty(Q[:3], device="meta")
    return [
        (aten._scaled_dot_product_flash_attention.default, (), (0.0, False, False)),
        (aten._scaled_dot_product_efficient_attention.default, (), (None, True, 0.0, False)),
        (aten._scaled_dot_product_cudnn_attention.default, (), (None, True, 0.0, False, False)),
        (aten._scaled_dot_product_flash_attention_backward.default, (q,),
         (out, lse, None, None, Q[2], KV[2], 0.0, False, None, None)),
        (aten._scaled_dot_product_efficient_attention_backward.default, (q,),
         (None, out, lse, None, None, 0.0, [True, True, True, False], False)),
    ]  # fmt: skip


@pytest.mark.parametrize("call", range(5))
def test_grouped_query_attention_flops_equal_those_of_repeated_kv(call):
    """transformers calls SDPA with `enable_gqa=True` when there is no mask: K/V with fewer
    heads reach the CUDA kernels, whose FLOPs are those of K/V expanded to the query's heads."""
    op, before, after = _attention_calls()[call]
    q, k, v = _meta(Q), _meta(KV), _meta(KV)
    grouped = count_flops(op, (*before, q, k, v, *after), {}, None)
    repeated = count_flops(op, (*before, q, _repeated(k), _repeated(v), *after), {}, None)
    assert grouped == repeated
    # Hand count: the 2 matmuls of forward (QK^T, PV) or the 5 of backward, 2 * B*H*S*S*D each.
    b, h, s, d = Q
    assert grouped == (5 if before else 2) * 2 * b * h * s * s * d


def test_torch_before_2_12_asserts_on_grouped_kv_and_memfit_counts_it():
    """The bug met on a GPU (torch 2.11): PyTorch's own formula raises AssertionError on
    grouped K/V; memfit's count does not."""
    op = aten._scaled_dot_product_flash_attention
    args = (_meta(Q), _meta(KV), _meta(KV), 0.0, False, False)
    if not torch_at_least("2.12"):
        with pytest.raises(AssertionError):  # 2.11 names the shapes, 2.8 is a bare `assert`
            flops.flop_registry[op](*args, out_val=None)
    assert count_flops(op.default, args, {}, None) == 2 * 2 * 1 * 8 * 16 * 16 * 32


def test_raw_kernels_count_grouped_kv_as_expanded():
    """`_flash_attention_forward` takes (B, S, H, D): the heads are dimension 2."""
    op = aten._flash_attention_forward.default
    q, k = torch.empty(1, 16, 8, 32, device="meta"), torch.empty(1, 16, 2, 32, device="meta")
    rest = (None, None, 16, 16, 0.0, False, False)
    assert count_flops(op, (q, k, k, *rest), {}, None) == count_flops(
        op, (q, _repeated(k, 2), _repeated(k, 2), *rest), {}, None
    )


def test_a_tracker_over_grouped_attention_counts_and_does_not_raise():
    q, k, v = _meta(Q), _meta(KV), _meta(KV)
    with Tracker(torch.nn.Module()) as tr:
        aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False)
    tr.close()
    assert tr.flops == {(0, "setup", -1): 2 * 2 * 1 * 8 * 16 * 16 * 32}
    assert tr.uncounted_flops == {}
    # The path of the failure met on a GPU: memfit.measure's tracker over the CUDA kernel.
    with memfit.measure() as m:
        aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False)
    assert m.failed is None


def test_a_formula_that_raises_leaves_its_op_uncounted(monkeypatch, reference):
    """A FLOP formula is an estimate: when it raises, measure and estimate go on without the
    op's FLOPs, said once per op in a warning."""
    monkeypatch.setitem(flops._FLOP_FORMULAS, aten.mm, _injected)
    monkeypatch.setattr(flops, "_UNCOUNTED_REPORTED", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        weights, m = _train(lambda model, opt: memfit.measure(model, opt))
        est = memfit.estimate(tiny_gpt2(2, n_positions=SEQ),
                              memfit.Workload(batch_size=BATCH, seq_len=SEQ))  # fmt: skip
    assert _same(weights, reference)
    assert m.failed is None and m.profile is not None
    said = [str(w.message) for w in caught if "FLOP formula for mm.default" in str(w.message)]
    assert len(said) == 1 and "RuntimeError: injected" in said[0]
    assert est.flops["forward"] > 0  # addmm and bmm are still counted
