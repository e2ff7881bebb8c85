"""memfit.data.budget: the max length and what it truncates, and the token budget whose batches
the estimator confirms fit (tiny GPT-2 on a GPU limited to a budget)."""

from __future__ import annotations

import pytest

import memfit
from memfit.data import LengthCounts, fit_length, token_budget
from memfit.errors import BadInputError

#: A card limited so that a tiny GPT-2 fits a few hundred samples of 64 tokens, not thousands.
SMALL_GPU = "rtx-4090@600MiB"


def test_fit_length_counts_the_cut(tiny_config):
    lengths = LengthCounts()
    lengths.add([10, 64, 65, 100, 1000])
    fit = fit_length(str(tiny_config), memfit.Workload(batch_size=2), lengths, gpu="rtx-4090")
    # Every one of the 64 positions fits; 65, 100 and 1000 lose 1 + 36 + 936 = 973 tokens.
    assert fit.limit.largest == 64 and not fit.limit.capped
    assert (fit.truncated, fit.tokens_cut, fit.samples, fit.tokens) == (3, 973, 5, 1239)
    assert fit.share_truncated == 3 / 5 and fit.share_cut == 973 / 1239


def test_budget_batches_fit(tiny_config):
    model, w = str(tiny_config), memfit.Workload(optimizer="sgd")
    budget = token_budget(model, w, gpu=SMALL_GPU, max_len=64)
    assert budget.tokens <= budget.batch_at_max_len * 64 and not budget.capped
    assert [s for _, s, _ in budget.checks] == [32, 16, 8]
    # One more sample of 64 tokens does not fit: the budget is the largest at max_len.
    over = w.with_(batch_size=budget.batch_at_max_len + 1, seq_len=64)
    assert memfit.estimate(model, over, gpu=SMALL_GPU).fits is False
    # The widest batch the budget allows fits at the longest and the shortest length checked.
    for seq in (64, 8):
        wide = w.with_(batch_size=budget.tokens // seq, seq_len=seq)
        assert memfit.estimate(model, wide, gpu=SMALL_GPU).fits, seq


def test_budget_refusals(tiny_config):
    with pytest.raises(BadInputError, match="max_len=0 must be a positive"):
        token_budget(str(tiny_config), memfit.Workload(), gpu=SMALL_GPU, max_len=0)
