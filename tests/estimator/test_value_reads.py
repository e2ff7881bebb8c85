"""Value reads a fake trace answers because the value is certain
(memfit.estimator.trace.value_reads):
transformers < 5.18 reads `torch.rand([]) < layerdrop` in every training step of BART-like
models, layerdrop 0 included; a uniform sample is never below 0."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from memfit.estimator.trace.tracker import Tracker


class _LayerDrop(torch.nn.Module):
    def __init__(self, layerdrop: float) -> None:
        super().__init__()
        self.layerdrop = layerdrop
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.rand([]) < self.layerdrop:  # transformers 5.17's BART encoder, as written
            return x
        return self.linear(x)


def _forward(layerdrop: float) -> Tracker:
    model = _LayerDrop(layerdrop)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        x = mode.from_tensor(torch.zeros(2, 4))
        tracker = Tracker(model)
        with tracker:
            tracker.set_phase("forward", 0)
            model(x)
    return tracker


def test_a_uniform_sample_below_zero_is_answered_false():
    tracker = _forward(0.0)
    assert any(r.op == "addmm.default" for r in tracker.records.values())  # the layer ran
    assert list(tracker.certain_values.values()) == [False]


def test_an_uncertain_value_is_still_an_error():
    with pytest.raises(Exception, match="_local_scalar_dense"):
        _forward(0.5)
