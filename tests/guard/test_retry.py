"""`oom_guard` and `find_batch_size`, on CPU: OOMs come from `memfit.simulate` (a budget) or are
injected (a step that raises `torch.OutOfMemoryError`)."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import memfit
from memfit.cuda.allocator_replay import simulate as replay
from memfit.errors import BadInputError
from memfit.guard.batch_search import find_batch_size
from memfit.guard.retry import TrainStep, oom_guard
from memfit.simulation.simulated_gpu import simulate
from memfit.techniques.optimizer import optimizer_for_trace
from memfit.techniques.train_setup import TrainSetup
from tests.conftest import module_spec

MiB = 1 << 20


class MiniSetup:
    """The TrainStep protocol (what memfit.apply_ returns), for a tensor pair (x, y)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, grad_accum: int = 1):
        self.model, self.optimizer, self.grad_accum = model, optimizer, grad_accum
        self.optimizer_steps = 0

    def step(self, batch):
        x, y = batch
        total = 0.0
        for xm, ym in zip(x.chunk(self.grad_accum), y.chunk(self.grad_accum), strict=True):
            loss = F.mse_loss(self.model(xm), ym) / self.grad_accum
            loss.backward()
            total += loss.item()
            del loss
        self.optimizer.step()
        self.optimizer_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        return total


def wide_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1))


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(512, 64, generator=g), torch.randn(512, 1, generator=g)) for _ in range(3)]


def train(grad_accum: int, *, budget: int | None = None, guard: bool = False):
    model = wide_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # no momentum: exact comparison
    setup = MiniSetup(model, opt, grad_accum)
    with simulate(budget_bytes=budget, model=model, optimizer=opt) as gpu:
        runner = oom_guard(setup) if guard else setup
        for b in batches():
            runner.step(b)
    return model, gpu, runner, setup


def test_protocol_is_recognised():
    assert isinstance(
        MiniSetup(wide_model(), torch.optim.SGD(wide_model().parameters())), TrainStep
    )


def test_oom_guard_recovers_with_the_same_weights(caplog):
    reference, two, _, _ = train(2)  # never OOMs, same effective batch, same micro-batches
    whole, one, _, _ = train(1)  # one micro-batch of 512
    # A budget that fits micro-batches of 256 and not 512: activations of 512 x 1024 fp32
    # (2 MiB) take a 20 MiB large-pool segment; 256 x 1024 (1 MiB) fit 2 MiB small segments.
    budget = two.peak_reserved_bytes
    assert one.peak_reserved_bytes > budget
    model, gpu, guarded, setup = train(1, budget=budget, guard=True)
    assert guarded.retries == 1 and setup.grad_accum == 2
    assert setup.optimizer_steps == 3  # one update per batch: none lost, none applied twice
    assert gpu.peak_reserved_bytes <= budget
    assert "retrying the step with micro-batch 256 and gradient accumulation 2" in caplog.text
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q)
    # Against one micro-batch of 512: equal up to the order of float summation.
    for p, q in zip(model.parameters(), whole.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


class FailingOptimizer(torch.optim.SGD):
    def step(self, closure=None):
        raise torch.OutOfMemoryError("injected: out of memory in the update")


def test_oom_in_or_after_optimizer_step_is_not_retried():
    model = wide_model()
    setup = MiniSetup(model, FailingOptimizer(model.parameters(), lr=0.1), grad_accum=1)
    with pytest.raises(torch.OutOfMemoryError, match=r"in or after optimizer.step\(\): not"):
        oom_guard(setup).step(batches()[0])
    assert setup.grad_accum == 1

    class OomAfterStep(MiniSetup):
        def step(self, batch):
            super().step(batch)
            raise torch.OutOfMemoryError("injected: logging after the update")

    model = wide_model()
    before = [p.detach().clone() for p in model.parameters()]
    setup = OomAfterStep(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(torch.OutOfMemoryError, match="not retried"):
        oom_guard(setup).step(batches()[0])
    assert setup.optimizer_steps == 1 and setup.grad_accum == 1  # applied once, not redone
    assert not torch.equal(before[0], model[0].weight)


def test_oom_guard_stops_when_the_micro_batch_cannot_shrink():
    calls = []

    class AlwaysOom(MiniSetup):
        def step(self, batch):
            calls.append(self.grad_accum)
            raise torch.OutOfMemoryError("injected")

    x = (torch.randn(6, 4), torch.randn(6, 1))
    setup = AlwaysOom(nn.Linear(4, 1), torch.optim.SGD(nn.Linear(4, 1).parameters()))
    with pytest.raises(
        torch.OutOfMemoryError, match=r"micro-batch 1 \(batch 6 in 6 micro-batches\)"
    ):
        oom_guard(setup).step(x)
    assert calls == [1, 2, 3, 6]  # micro-batches of 6, 3, 2 (half of 3, rounded up), 1
    setup2 = AlwaysOom(nn.Linear(4, 1), torch.optim.SGD(nn.Linear(4, 1).parameters()))
    calls.clear()
    with pytest.raises(torch.OutOfMemoryError, match="min_micro_batch=3"):
        oom_guard(setup2, min_micro_batch=3).step(x)
    assert calls == [1, 2]


class OomAbove(nn.Module):
    """A model that runs out of memory above `limit` samples per micro-batch (injected), or at
    the forward calls numbered in `fail_at`."""

    def __init__(self, limit: int = 1 << 30, fail_at: tuple[int, ...] = ()) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(8, 1)
        self.limit, self.fail_at, self.calls = limit, fail_at, 0

    def forward(self, x):
        self.calls += 1
        if x.shape[0] > self.limit or self.calls in self.fail_at:
            raise torch.OutOfMemoryError("injected")
        return self.fc(x)


def train_setup(model: nn.Module) -> TrainSetup:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return TrainSetup(
        model=model, optimizer=opt, scaler=None, autocast_dtype=None, grad_accum=1,
        device=torch.device("cpu"), loss_fn=lambda out, mb: F.mse_loss(out, mb[1]),
    )  # fmt: skip


def loader(*sizes: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)) for n in sizes]


def test_the_micro_batch_that_ran_is_kept_for_batches_of_any_size():
    # 62 samples: 62 and 2 x 31 do not fit, 4 micro-batches (16, 16, 15, 15) do. Later batches
    # keep micro-batches of at most 16: 64 in 4, and the loader's last batch of 5 in one.
    setup = train_setup(OomAbove(limit=16))
    guarded = oom_guard(setup)
    accums = []
    for batch in loader(62, 64, 5):
        guarded.step(batch)
        accums.append(setup.grad_accum)
    assert accums == [4, 4, 1]
    assert (guarded.micro_batch_size, guarded.retries) == (16, 2)
    reference = train_setup(OomAbove())  # never OOMs; the same micro-batches, set by hand
    for batch, k in zip(loader(62, 64, 5), accums, strict=True):
        reference.grad_accum = k
        reference.step(batch)
    for p, q in zip(setup.model.parameters(), reference.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_an_oom_mid_accumulation_loses_no_update_and_applies_none_twice():
    # 10 samples: one micro-batch fails (call 1); 2 x 5 fails in the second (call 3), after the
    # first one's backward; 4 micro-batches (3, 3, 2, 2) run.
    setup = train_setup(OomAbove(fail_at=(1, 3)))
    steps = []
    setup.optimizer.register_step_post_hook(lambda *_: steps.append(1))
    guarded = oom_guard(setup)
    (batch,) = loader(10)
    guarded.step(batch)
    assert (setup.grad_accum, guarded.retries, len(steps)) == (4, 2, 1)
    reference = train_setup(OomAbove())
    reference.grad_accum = 4
    reference.step(batch)
    for p, q in zip(setup.model.parameters(), reference.model.parameters(), strict=True):
        assert torch.equal(p, q)


def scaled_step(model, opt, scaler, clip):
    def train_step(batch, micro_batch_size):
        x, y = batch
        for xm, ym in zip(x.split(micro_batch_size), y.split(micro_batch_size), strict=True):
            scaler.scale(F.mse_loss(model(xm), ym) * len(xm) / len(x)).backward()
        scaler.unscale_(opt)
        clip(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    return train_step


def test_an_oom_after_unscale_is_retried_with_the_scaler_reset():
    calls = []

    def clip_that_ooms_once(params, max_norm):
        calls.append(1)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("injected: out of memory in clip_grad_norm_")
        return nn.utils.clip_grad_norm_(params, max_norm)

    results = []
    for clip, micro in ((clip_that_ooms_once, None), (nn.utils.clip_grad_norm_, 4)):
        model = OomAbove()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        step = scaled_step(model, opt, scaler, clip)
        (batch,) = loader(8)
        if micro is None:  # guarded: the OOM comes after scaler.unscale_(opt)
            guarded = oom_guard(step, model=model, optimizer=opt, scaler=scaler)
            guarded(batch)
            assert (guarded.retries, guarded.micro_batch_size) == (1, 4)
        else:  # the reference never OOMs: micro-batches of 4 from the start
            step(batch, micro_batch_size=micro)
        results.append((list(model.parameters()), scaler.state_dict()))
    (got, got_scaler), (want, want_scaler) = results
    assert all(torch.equal(p, q) for p, q in zip(got, want, strict=True))
    assert got_scaler == want_scaler  # scale 1024, growth tracker 1: one update, no backoff


def test_an_oom_after_the_scaler_skipped_the_step_is_not_retried():
    model = OomAbove()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")

    @oom_guard(model=model, optimizer=opt, scaler=scaler)
    def train_step(batch, micro_batch_size):
        scaler.scale(model(batch[0]).sum() * float("inf")).backward()
        scaler.step(opt)  # inf gradients: optimizer.step() is skipped, the iteration is done
        raise torch.OutOfMemoryError("injected: logging after the step")

    with pytest.raises(torch.OutOfMemoryError, match="not retried"):
        train_step(loader(8)[0])
    assert train_step.retries == 0


def test_function_form_halves_micro_batch_and_keeps_it():
    model = wide_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []

    @oom_guard(optimizer=opt)
    def train_step(batch, micro_batch_size):
        seen.append(micro_batch_size)
        if micro_batch_size > 128:
            # The failed attempt leaves gradients behind; the guard must clear them.
            F.mse_loss(model(batch[0][:8]), batch[1][:8]).backward()
            raise torch.OutOfMemoryError("injected")
        x, y = batch
        for xm, ym in zip(x.split(micro_batch_size), y.split(micro_batch_size), strict=True):
            (F.mse_loss(model(xm), ym, reduction="sum") / len(x)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    data = batches()
    train_step(data[0])
    train_step(data[1])
    assert seen == [512, 256, 128, 128]
    assert train_step.micro_batch_size == 128 and train_step.retries == 2
    ref = wide_model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for x, y in data[:2]:
        F.mse_loss(ref(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_oom_guard_bad_input():
    with pytest.raises(BadInputError, match="needs a training setup"):
        oom_guard(42)
    with pytest.raises(BadInputError, match="min_micro_batch must be >= 1"):
        oom_guard(lambda b, micro_batch_size: None, min_micro_batch=0)


# ------------------------------------------------------------------------ find_batch_size


def injected(limit: int):
    def trial(batch_size: int) -> None:
        if batch_size > limit:
            raise torch.OutOfMemoryError("injected")

    return trial


def test_search_doubles_then_bisects():
    r = find_batch_size(injected(37), progress=False)
    assert r.batch_size == 37
    assert r.tries == (
        (1, True), (2, True), (4, True), (8, True), (16, True), (32, True), (64, False),
        (48, False), (40, False), (36, True), (38, False), (37, True),
    )  # fmt: skip
    assert (r.micro_batch_size, r.grad_accum, r.effective_batch_size) == (37, 1, 37)


def test_search_keeps_the_effective_batch():
    r = find_batch_size(injected(37), target_batch=96, progress=False)
    assert r.batch_size == 37
    # The largest divisor of 96 that ran: 32, accumulated 3 times.
    assert (r.micro_batch_size, r.grad_accum, r.effective_batch_size) == (32, 3, 96)
    everything = find_batch_size(injected(10_000), target_batch=96, progress=False)
    assert everything.tries[-1] == (96, True)  # no need to go past the target
    assert (everything.micro_batch_size, everything.grad_accum) == (96, 1)


def test_search_below_start_and_nothing_fits():
    r = find_batch_size(injected(5), start=16, progress=False)
    assert r.batch_size == 5
    assert [b for b, _ in r.tries] == [16, 8, 4, 6, 5]
    with pytest.raises(torch.OutOfMemoryError, match="Even a batch of 1"):
        find_batch_size(injected(0), progress=False)
    with pytest.raises(BadInputError, match="start must be a whole number >= 1"):
        find_batch_size(injected(3), start=0)


def test_progress_bar_is_drawn(capsys):
    find_batch_size(injected(3), progress=True)
    assert "batch 3: runs (largest so far 3)" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ranks_agree_on_the_smallest():
    dist = torch.distributed
    dist.init_process_group(
        "gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{_free_port()}"
    )
    try:
        r = find_batch_size(injected(21), target_batch=64, progress=False)
    finally:
        dist.destroy_process_group()
    assert (r.batch_size, r.world_size, r.micro_batch_size, r.grad_accum) == (21, 1, 16, 4)


# ---------------------------------------------- find_batch_size agrees with memfit.estimate


def deep_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 512, bias=False), nn.ReLU(), nn.Linear(512, 512, bias=False), nn.ReLU(),
        nn.Linear(512, 16, bias=False),
    )  # fmt: skip


def test_find_batch_size_matches_the_estimate():
    budget = 24 * MiB
    model = deep_model()
    opt = optimizer_for_trace("sgd", list(model.parameters()))

    def trial(batch: torch.Tensor) -> None:  # the step memfit.estimator.trace.step_runner traces
        out = model(batch)
        loss = out.float().sum()
        del out
        loss.backward()
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)

    with simulate(budget_bytes=budget, model=model, optimizer=opt):
        r = find_batch_size(
            trial, make_batch=lambda b: torch.randn(b, 64), optimizer=opt, start=32,
            target_batch=384, progress=False,
        )  # fmt: skip
    spec = module_spec(deep_model(), lambda b: torch.randn(b, 64))

    def estimate_fits(b: int) -> bool:
        est = memfit.estimate(spec, memfit.Workload(batch_size=b, optimizer="sgd"))
        recs, events = est.profile.records, est.profile.events
        stream = [(e[0], e[1], 0 if recs[e[1]].host else recs[e[1]].nbytes) for e in events]
        return replay(stream, capacity_bytes=budget).oom is None

    # The estimate's largest batch is the one found: it fits, one more does not.
    assert r.batch_size == 192
    assert estimate_fits(r.batch_size) and not estimate_fits(r.batch_size + 1)
    assert (r.micro_batch_size, r.grad_accum, r.effective_batch_size) == (192, 2, 384)
