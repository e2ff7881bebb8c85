"""memfit.data.TokenBudgetSampler: no batch over the budget, every sample once, over random
lengths and every option; the longest batch first; a DataLoader over a `datasets` Dataset."""

from __future__ import annotations

import random

import pytest
import torch

from memfit.data import TokenBudgetSampler
from memfit.errors import BadInputError


def _options(rng: random.Random) -> dict:
    return {
        "group_by_length": rng.random() < 0.5, "longest_first": rng.random() < 0.5,
        "shuffle": rng.random() < 0.5, "seed": rng.randint(0, 99),
        "max_batch_size": rng.choice([None, 1, 3, 64]),
    }  # fmt: skip


@pytest.mark.parametrize("seed", range(40))
def test_no_batch_over_the_budget(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 400)
    lengths = [rng.choice([0, rng.randint(1, 64), rng.randint(1, 4096)]) for _ in range(n)]
    max_len = rng.choice([None, 64, 512])
    budget = rng.randint(max(min(max(lengths), max_len or 10**9), 1), 8192)
    opts = _options(rng)
    sampler = TokenBudgetSampler(lengths, budget, max_len=max_len, **opts)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert sorted(i for b in batches for i in b) == list(range(n))  # each sample once
        for b in batches:
            counted = [min(max(lengths[i], 1), max_len or 10**9) for i in b]
            assert len(b) * max(counted) <= budget
            assert opts["max_batch_size"] is None or len(b) <= opts["max_batch_size"]
        if opts["longest_first"]:
            longest = max(min(max(x, 1), max_len or 10**9) for x in lengths)
            assert max(min(max(lengths[i], 1), max_len or 10**9) for i in batches[0]) == longest


def test_grouped_packing_by_hand():
    # Sorted longest first: 10, 6, 5, 5, 2, 1 (indices 1, 3, 0, 4, 5, 2); budget 20:
    # [10, 6] = 2 x 10 = 20; [5, 5, 2] = 3 x 5 = 15, + 1 would be 4 x 5 = 20 -> fits: [5,5,2,1].
    s = TokenBudgetSampler([5, 10, 1, 6, 5, 2], 20)
    assert list(s) == [[1, 3], [0, 4, 5, 2]]
    # In dataset order: [5, 10] = 20; [1, 6] = 12, + 5 -> 18; + 2 -> 24 > 20: [1, 6, 5] then [2].
    s = TokenBudgetSampler([5, 10, 1, 6, 5, 2], 20, group_by_length=False, longest_first=False)
    assert list(s) == [[0, 1], [2, 3, 4], [5]]
    # max_len 4 counts every sample as at most 4 tokens: 5 per batch of 20.
    s = TokenBudgetSampler([5, 10, 1, 6, 5, 2], 20, max_len=4)
    assert [len(b) for b in s] == [5, 1]


def test_longest_first_after_shuffle():
    lengths = [1] * 50 + [100] + [2] * 50
    for seed in range(5):
        s = TokenBudgetSampler(lengths, 100, shuffle=True, seed=seed)
        assert next(iter(s)) == [50]


def test_refusals():
    with pytest.raises(BadInputError, match=r"2 sample\(s\) are longer than max_tokens=10, the "
                       r"longest sample 1 with 30 tokens.*max_len="):  # fmt: skip
        TokenBudgetSampler([3, 30, 11], 10)
    assert len(TokenBudgetSampler([3, 30, 11], 10, max_len=10)) == 3
    with pytest.raises(BadInputError, match=r"lengths\[1\] is -1"):
        TokenBudgetSampler([3, -1], 10)
    with pytest.raises(BadInputError, match=r"max_tokens=0 must be a positive"):
        TokenBudgetSampler([3], 0)
    with pytest.raises(BadInputError, match=r"max_len=True must be a positive"):
        TokenBudgetSampler([3], 10, max_len=True)
    assert list(TokenBudgetSampler(torch.tensor([3, 4]).numpy(), 8)) == [[1, 0]]


def test_dataloader_over_a_datasets_dataset():
    datasets = pytest.importorskip("datasets")
    rng = random.Random(0)
    rows = [[rng.randint(1, 9) for _ in range(rng.randint(1, 40))] for _ in range(300)]
    ds = datasets.Dataset.from_dict({"input_ids": rows})
    sampler = TokenBudgetSampler.from_dataset(ds, 120, shuffle=True)

    def collate(samples):
        longest = max(len(s["input_ids"]) for s in samples)
        return torch.tensor([s["input_ids"] + [0] * (longest - len(s["input_ids"]))
                             for s in samples])  # fmt: skip

    loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, collate_fn=collate)
    shapes = [tuple(b.shape) for b in loader]  # (B, S) padded
    assert all(b * s <= 120 for b, s in shapes)
    assert sum(b for b, _ in shapes) == 300 and shapes[0][1] == 40
    with pytest.raises(BadInputError, match=r"no column 'ids'; its columns are 'input_ids'"):
        TokenBudgetSampler.from_dataset(ds, 120, column="ids")
    plain = [{"input_ids": r} for r in rows]  # a list of dicts works too
    assert len(TokenBudgetSampler.from_dataset(plain, 120)) == len(sampler)
