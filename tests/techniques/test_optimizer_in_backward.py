"""Optimizer step in backward: the same training as the plain loop, and the memory the estimate
says it saves.

Equality: on the CPU, the per-parameter optimizers run the same kernels as one optimizer over
all parameters (torch.optim's per-tensor loop), so after two steps the parameters and the losses
are bit-equal to the plain loop's. Gradients cannot be compared: the step frees each one in
backward (that is the technique); `p.grad` is None after every step.

Memory: the measured CPU peak drop equals the estimated drop within 5 % (as
test_apply_memory.py checks for the other techniques). The model is the 4-layer GPT-2 shape of
conftest at batch 1 x 4 tokens, so that the plain loop's peak is at the optimizer step, where
all gradients are alive. The CPU would run AdamW's per-tensor loop, whose temporaries differ
from CUDA's foreach step that the estimate lays out, so both measured runs are given the
foreach implementation (`for_trace=True`), as a CUDA run has it.
"""

from __future__ import annotations

import pytest
import torch

import memfit
import memfit.techniques.optimizer as optimizer_mod
import memfit.techniques.optimizer_in_backward as oib
from memfit.errors import BadInputError
from memfit.techniques import (
    AccumulationConfig,
    OptimizerConfig,
    OptimizerInBackwardConfig,
    PrecisionConfig,
)
from tests.conftest import MEASURED_VOCAB, measured_gpt2, tiny_gpt2


def _batch(b: int, s: int, vocab: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, vocab, (b, s), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone()}


@pytest.mark.parametrize("name", ["adamw", "sgd-momentum", "lion"])
def test_same_parameters_and_losses_as_the_plain_loop(name: str) -> None:
    runs = []
    for in_backward in (False, True):
        model = tiny_gpt2(2)
        configs: list = [OptimizerConfig(name=name, lr=1e-2)]
        if in_backward:
            configs.append(OptimizerInBackwardConfig())
        setup = memfit.apply_(model, configs)
        losses = [setup.step(_batch(4, 16, 100)) for _ in range(3)]
        assert all(p.grad is None for p in model.parameters())
        runs.append((losses, [p.detach().clone() for p in model.parameters()]))
    (plain_losses, plain_params), (losses, params) = runs
    assert losses == plain_losses  # bit-equal floats
    assert all(torch.equal(a, b) for a, b in zip(plain_params, params, strict=True))


def test_wrapper_state_dict_and_scheduler() -> None:
    model = tiny_gpt2(2)
    setup = memfit.apply_(
        model, [OptimizerConfig(name="adamw", lr=1e-2), OptimizerInBackwardConfig()]
    )
    opt = setup.optimizer
    assert isinstance(opt, oib.OptimizerInBackward)
    n = len(list(model.parameters()))
    assert len(opt.param_groups) == n  # one group per parameter, the inner optimizers' own
    setup.step(_batch(2, 8, 100))
    sd = opt.state_dict()
    assert len(sd["state"]) == n and all(int(s["step"]) == 1 for s in sd["state"].values())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5)
    assert all(o.param_groups[0]["lr"] == 5e-3 for o in opt.optimizers.values())
    del sched
    model2 = tiny_gpt2(2)
    setup2 = memfit.apply_(
        model2, [OptimizerConfig(name="adamw", lr=1e-2), OptimizerInBackwardConfig()]
    )
    setup2.optimizer.load_state_dict(sd)
    p2 = next(iter(setup2.optimizer.optimizers))
    assert int(setup2.optimizer.optimizers[p2].state[p2]["step"]) == 1
    assert setup2.optimizer.state[p2] is setup2.optimizer.optimizers[p2].state[p2]
    # apply_ again replaces the hooks instead of adding a second step per gradient.
    memfit.apply_(model2, [OptimizerConfig(name="adamw", lr=1e-2), OptimizerInBackwardConfig()])
    assert len(getattr(model2, oib._HANDLES)) == n


@pytest.mark.parametrize(
    ("configs", "word"),
    [
        ([OptimizerInBackwardConfig()], "OptimizerConfig"),
        ([OptimizerConfig(offload=True), OptimizerInBackwardConfig()], "offload"),
        ([AccumulationConfig(steps=2), OptimizerConfig(), OptimizerInBackwardConfig()], "accum"),
        ([PrecisionConfig(precision="fp16-mixed"), OptimizerConfig(), OptimizerInBackwardConfig()],
         "fp16-mixed"),
    ],
)  # fmt: skip
def test_refused_combinations(configs: list, word: str) -> None:
    with pytest.raises(BadInputError, match=word):
        memfit.apply_(tiny_gpt2(2), configs)


def test_configs_from_workload_and_label() -> None:
    w = memfit.Workload(batch_size=1, seq_len=8, optimizer="sgd", optimizer_in_backward=True)
    configs = memfit.techniques.configs_from_workload(w)
    i = configs.index(OptimizerInBackwardConfig())
    assert isinstance(configs[i - 1], OptimizerConfig)
    assert "optimizer step in backward" in memfit.techniques.labels(w)


def _foreach(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real optimizers with CUDA's foreach implementation, on the CPU."""
    real = optimizer_mod.build_optimizer

    def build(params, config, *, for_trace):
        return (
            real(params, config, for_trace=True)
            if config.name != "lion"
            else real(params, config, for_trace=for_trace)
        )

    monkeypatch.setattr(optimizer_mod, "build_optimizer", build)
    monkeypatch.setattr(oib, "build_optimizer", build)


def _measured_peak(w: memfit.Workload) -> int:
    model = measured_gpt2()
    setup = memfit.apply_(model, w)
    batch = _batch(w.batch_size, w.seq_len or 0, MEASURED_VOCAB)
    with memfit.measure(model, setup.optimizer) as m:
        for _ in range(2):
            setup.step(batch)
    assert m.profile is not None
    return m.profile.peak_allocated_bytes


@pytest.mark.parametrize("name", ["adamw", "sgd-momentum", "lion"])
def test_measured_drop_matches_estimated_drop(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _foreach(monkeypatch)
    base = memfit.Workload(batch_size=1, seq_len=4, attention="eager", optimizer=name)
    w = base.with_(optimizer_in_backward=True)
    est = {x: memfit.estimate(measured_gpt2(), x) for x in (base, w)}
    estimated_drop = est[base].profile.peak_allocated_bytes - est[w].profile.peak_allocated_bytes
    measured_drop = _measured_peak(base) - _measured_peak(w)
    # Most of the gradients: all 4 layers' and the embeddings' fp32 gradients are 857,088 B
    # (rounded to 512-B blocks), of which one parameter's at most is alive at the new peak.
    assert est[base].profile.breakdown["gradients"] == 857_088
    assert 600_000 < estimated_drop < 857_088 + 700_000
    assert abs(measured_drop - estimated_drop) <= 0.05 * estimated_drop, (
        name, measured_drop, estimated_drop,
    )  # fmt: skip


def test_catalog_model_replays_with_steps_in_backward() -> None:
    """GPT-2 (12 blocks) is traced with 3 blocks and replayed: each block's steps lie inside
    its backward, so the replay copies them with it (and the 4-block check agrees). At the
    peak, no full set of gradients: GPT-2's 124,439,808 fp32 gradients are 497,759,232 B; the
    most alive at once are the tied embedding's, 50257 x 768 x 4 = 154,389,504 B, and some of
    one block's (7,087,872 parameters, 28,351,488 B)."""
    w = memfit.Workload(batch_size=1, seq_len=32, optimizer="adamw", optimizer_in_backward=True)
    est = memfit.estimate("gpt2", w)
    assert est.replayed
    assert est.profile.breakdown["gradients"] <= 154_389_504 + 28_351_488
