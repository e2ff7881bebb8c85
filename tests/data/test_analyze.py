"""memfit.data.analyze_data: the streaming pass, and the "word" of 100,000 spaces found by its
line whatever the tokenizer makes of it."""

from __future__ import annotations

import json

import pytest

from memfit.data import ApproximateTokenizer, analyze_data, load_tokenizer
from memfit.errors import BadInputError

SPACES = "before" + " " * 100_000 + "after"


def _jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def test_approximate_counts_by_hand():
    # "a b c d": 7 characters -> ceil(7 / 4) = 2, but 4 words -> 4; "x" * 10 -> ceil(10/4) = 3.
    assert ApproximateTokenizer().encode(["a b c d", "x" * 10, "", SPACES]) == [4, 3, 0, 25_003]


def test_the_space_run_is_found_by_line(tmp_path, bpe_tok, words_tok):
    texts = ["the cat sat"] * 300 + [SPACES] + ["a dog"] * 200
    p = _jsonl(tmp_path / "d.jsonl", texts)
    seen = []
    approx = analyze_data(p, top=2, progress=lambda done, total: seen.append((done, total)))
    assert approx.approximate and approx.samples == 501
    assert (approx.longest[0].where, approx.longest[0].value) == (301, 25_003)
    assert approx.longest_runs[0].where == 301 and approx.longest_runs[0].value == 100_000
    assert approx.longest[0].preview == "before⟨100,000 spaces⟩after"
    assert seen[-1] == (p.stat().st_size, p.stat().st_size)
    # A byte-level BPE makes a token of each space it cannot merge: 100,000 tokens and more.
    bpe = analyze_data(p, tokenizer=load_tokenizer(bpe_tok))
    assert bpe.longest[0].where == 301 and bpe.longest[0].value >= 100_000
    # A whitespace tokenizer sees no word in the run, only "before" and "after" ([UNK]): the
    # sample is short in tokens, and only the character statistics name its line.
    words = analyze_data(p, tokenizer=load_tokenizer(words_tok))
    assert words.tokens.max == 3 and words.longest[0].where == 1
    assert (words.longest_runs[0].where, words.longest_runs[0].value) == (301, 100_000)
    assert words.whitespace.max == 100_000 and words.words.max == 6


def test_exact_lengths_and_id_counts(tmp_path, words_tok):
    p = _jsonl(tmp_path / "d.jsonl", ["the cat", "the cat sat on the mat", "dog", "zebra the"])
    r = analyze_data(p, tokenizer=load_tokenizer(words_tok))
    # Lengths 2, 6, 1, 2 ("zebra" is [UNK], id 0).
    assert dict(r.tokens.counts) == {2: 2, 6: 1, 1: 1}
    # ids: [UNK]0 x1, the1 x4, cat2 x2, sat3 x1, on4 x1, mat5 x1, a6 x0, dog7 x1.
    assert r.id_counts.tolist() == [1, 4, 2, 1, 1, 1, 0, 1]
    assert r.vocab_size == 8 and not r.approximate
    assert [(x.where, x.value) for x in r.longest[:2]] == [(2, 6), (1, 2)]
    fence, beyond = r.outliers()
    # Lengths 1, 2, 2, 6: Q1 = 1.75, Q3 = 3, fence 3 + 3 * 1.25 = 6.75: no outlier.
    assert (fence, beyond) == (6.75, 0)


def test_a_long_outlier_beyond_the_fence(tmp_path):
    p = _jsonl(tmp_path / "d.jsonl", ["abcd"] * 99 + ["abcd" * 1000])
    r = analyze_data(p)
    # 99 samples of 1 token: Q1 = Q3 = 1, fence 1; the 1,000-token sample is beyond it.
    assert r.outliers() == (1.0, 1) and r.longest[0].where == 100


def test_bad_input(tmp_path):
    p = tmp_path / "d.txt"
    p.write_text("\n\n")
    with pytest.raises(BadInputError, match=r"d\.txt holds no samples"):
        analyze_data(p)
    p.write_text("x\n")
    with pytest.raises(BadInputError, match="top=-1 must be a whole number"):
        analyze_data(p, top=-1)
