"""Paged optimizers (bitsandbytes PagedAdamW, PagedAdamW8bit): the trace lays out their state
as bitsandbytes does and keeps the paged part out of the allocator's device memory.

The model has one weight of 400 x 300 = 120,000 elements (paged: at least 1e5) and one of
300 x 10 = 3,000 plus a bias of 10 (not paged). bitsandbytes (optim/optimizer.py):
`get_state_buffer` pages tensors of >= 1e5 elements; `init_state` gives tensors under
min_8bit_size (4096) 32-bit states; 8-bit states carry fp32 absmax per 256 elements.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import memfit
from memfit.estimator.trace.step_runner import run_trace
from memfit.techniques import OptimizerConfig
from tests.conftest import module_spec

BIG, SMALL, BIAS = 400 * 300, 300 * 10, 10


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(400, 300, bias=False), nn.Linear(300, 10))


def _spec():
    return module_spec(_model(), lambda b: torch.randn(b, 400))


def _state(optimizer: str) -> tuple[int, int]:
    """(paged bytes, device bytes as requested) of the optimizer state after the trace."""
    tr = run_trace(_spec(), memfit.Workload(batch_size=2, optimizer=optimizer), (8, 9))
    state = [r for r in tr.records.values() if r.category == "optimizer_state"]
    paged = sum(r.nbytes for r in state if r.paged)
    device = sum(r.nbytes for r in state if not r.host)
    assert all(r.host for r in state if r.paged)
    return paged, device


def test_paged_adamw_32bit_layout() -> None:
    paged, device = _state("paged-adamw")
    assert paged == 2 * BIG * 4  # state1, state2 fp32 of the big weight: 960,000 B
    assert device == 2 * (SMALL + BIAS) * 4  # the small tensors' states stay on the device


def test_paged_adamw_8bit_layout() -> None:
    paged, device = _state("paged-adamw-8bit")
    assert paged == 2 * BIG  # uint8 state1, state2
    blocks = -(-BIG // 256)  # 469 absmax entries per state
    qmap = 2 * 256 * 4  # the shared "dynamic" and "udynamic" maps (bitsandbytes fill_qmap)
    assert device == 2 * blocks * 4 + qmap + 2 * (SMALL + BIAS) * 4
    # Not paged: the same layout all on the device.
    assert _state("adamw-8bit") == (0, device + 2 * BIG)


def test_estimate_leaves_paged_state_out_and_says_so() -> None:
    w = memfit.Workload(batch_size=2, optimizer="paged-adamw")
    paged = memfit.estimate(_spec(), w)
    plain = memfit.estimate(_spec(), w.with_(optimizer="adamw"))
    dev = paged.records_summary["optimizer_state"]
    assert dev == 2 * (12_288 + 512)  # 12,000 B and 40 B states, in 512-B blocks
    assert plain.records_summary["optimizer_state"] == dev + 2 * 480_256  # 960,000 B rounded
    note = next(n for n in paged.notes if n.startswith("Paged optimizer state"))
    assert "937.50 KiB" in note  # 960,000 B


@pytest.mark.parametrize(("name", "cls"), [("paged-adamw", "PagedAdamW"),
                                           ("paged-adamw-8bit", "PagedAdamW8bit")])  # fmt: skip
def test_apply_builds_bitsandbytes_paged_optimizer(name: str, cls: str) -> None:
    bnb = pytest.importorskip("bitsandbytes")
    model = _model()
    setup = memfit.apply_(model, [OptimizerConfig(name=name, lr=1e-3)])
    assert type(setup.optimizer) is getattr(bnb.optim, cls)
    assert setup.optimizer.is_paged
    before = model[0].weight.detach().clone()
    with warnings.catch_warnings():  # on the CPU bitsandbytes falls back to unpaged state
        warnings.simplefilter("ignore")
        setup.step((torch.randn(2, 400), torch.randint(0, 10, (2,))),
                   loss_fn=lambda out, b: nn.functional.cross_entropy(out, b[1]))  # fmt: skip
    assert not torch.equal(before, model[0].weight)


def test_paged_with_offload_is_refused() -> None:
    with pytest.raises(memfit.BadInputError, match="paged"):
        OptimizerConfig(name="paged-adamw", offload=True)
