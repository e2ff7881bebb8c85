"""memfit.data.stats: exact percentiles from counts (as numpy computes them), the histogram, the
truncation cut, Tukey's fence, the top-k heap, character profiles and previews."""

from __future__ import annotations

import random

import numpy as np
import pytest

from memfit.data.stats import LengthCounts, TopK, char_profile, preview


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_percentiles_equal_numpy(seed):
    rng = random.Random(seed)
    lengths = [
        rng.choice([rng.randint(0, 50), rng.randint(0, 5000)]) for _ in range(rng.randint(1, 3000))
    ]
    c = LengthCounts()
    c.add(lengths[: len(lengths) // 2])
    c.add(lengths[len(lengths) // 2 :])  # added in two batches, as the pass does
    for q in (0, 1, 25, 50, 75, 90, 99, 99.9, 100):
        assert c.percentile(q) == pytest.approx(float(np.percentile(lengths, q)), abs=1e-9)
    assert (c.n, c.total, c.max) == (len(lengths), sum(lengths), max(lengths))


def test_known_counts_by_hand():
    c = LengthCounts()
    c.add([1, 2, 3, 4, 100])
    # numpy's linear rule: p50 is rank 2 of 0..4 -> 3; p90 is rank 3.6 -> 4 + 0.6 * 96 = 61.6.
    assert c.percentile(50) == 3 and c.percentile(90) == pytest.approx(61.6)
    # Truncating to 3 cuts two samples: 4 -> 1 token and 100 -> 97 tokens.
    assert c.above(3) == (2, 98) and c.above(100) == (0, 0)
    # Q1 = 2, Q3 = 4: the far-out fence is 4 + 3 * 2 = 10.
    assert c.far_out_fence() == 10
    # Buckets [1], [2, 3], [4, 7], ..., [64, 127]: 1, 2, 1, 0, 0, 0, 1.
    assert c.histogram() == [
        (1, 1, 1), (2, 3, 2), (4, 7, 1), (8, 15, 0), (16, 31, 0), (32, 63, 0), (64, 127, 1)
    ]  # fmt: skip
    zero = LengthCounts()
    zero.add([0, 0, 1])
    assert zero.histogram() == [(0, 0, 2), (1, 1, 1)]
    with pytest.raises(ValueError, match="no lengths"):
        LengthCounts().percentile(50)


def test_top_k_keeps_the_largest_first_seen_on_ties():
    top = TopK(3)
    for where, value in enumerate([5, 9, 1, 9, 7, 9, 2]):
        if top.wants(value):
            top.push(value, where)
    assert [(x.value, x.where) for x in top.items()] == [(9, 1), (9, 3), (9, 5)]
    top2 = TopK(2)
    for where, value in enumerate([3, 8, 1, 6]):
        top2.push(value, where)
    assert [(x.value, x.where) for x in top2.items()] == [(8, 1), (6, 3)]
    assert not TopK(0).wants(10**9)


def test_char_profile():
    assert char_profile("before" + " " * 100_000 + "after") == (6, 100_000)
    assert char_profile(" " * 100_000) == (0, 100_000)  # a "word" of spaces has no word at all
    assert char_profile("one two  three") == (5, 2)
    assert (
        char_profile("a b") == (1, 1)
        and char_profile("abc") == (3, 0)
        and char_profile("") == (0, 0)
    )
    assert char_profile("x\t\ny") == (1, 2)


def test_preview():
    assert preview("before" + " " * 100_000 + "after") == "before⟨100,000 spaces⟩after"
    assert preview("a\nb\tc") == "a⏎b⇥c"
    assert preview("x" + " \n  " + "y") == "x⟨4 whitespace⟩y"
    assert preview("x" * 100, width=10) == "x" * 9 + "…"
    # A run that starts inside the shown head is counted whole, however long.
    assert preview("w" * 239 + " " * 5000 + "end") == ("w" * 59 + "…")
    assert preview("w" * 10 + " " * 5000 + "end", width=30) == "w" * 10 + "⟨5,000 spaces⟩end"
