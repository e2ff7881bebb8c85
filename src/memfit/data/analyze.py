"""`analyze_data`: one streaming pass over a text data set, returning a `DataReport`.

Each batch of samples is tokenized, and the pass keeps only what does not grow with the data:
the count of samples per token length (exact percentiles), per longest word and per longest
whitespace run (character-level, to find the "word" of 100,000 spaces), the k longest samples
of each kind with their line or row, and, with a real tokenizer, the count of each token id
(vocabulary coverage). The data set itself is never held: memory is the same for 1 MB and 1 TB.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memfit.data._source import TextSource
from memfit.data.readers import open_texts
from memfit.data.stats import LengthCounts, Longest, TopK, char_profile, preview
from memfit.data.tokenize import ApproximateTokenizer, Tokenizer
from memfit.errors import BadInputError

#: Samples tokenized together (tokenizers' encode_batch runs them on its thread pool).
SAMPLES_PER_BATCH = 1000

#: `progress(done, total)`: the pass's position, in the units of `TextSource.total`.
Progress = Callable[[int, int], None]


@dataclass
class DataReport:
    """What one pass over a data set found.

    Attributes:
        path, format, field, unit: the source (`unit` is "line", 1-based, or "row", 0-based).
        tokenizer: the tokenizer's name; `approximate` is True for ApproximateTokenizer.
        samples: samples read; skipped_blank: blank lines skipped.
        tokens: samples per token length (`LengthCounts`).
        words: samples per longest word (characters without whitespace).
        whitespace: samples per longest whitespace run (characters).
        longest, widest_words, longest_runs: the k samples with the most tokens, the longest
            word, the longest whitespace run (largest first), each with its line or row.
        id_counts: how often each token id occurs (index = id), or None (approximate).
        seconds: the pass's wall time.
    """

    path: Path
    format: str
    field: str | None
    unit: str
    tokenizer: str
    approximate: bool
    samples: int = 0
    skipped_blank: int = 0
    tokens: LengthCounts = dataclasses.field(default_factory=LengthCounts)
    words: LengthCounts = dataclasses.field(default_factory=LengthCounts)
    whitespace: LengthCounts = dataclasses.field(default_factory=LengthCounts)
    longest: list[Longest] = dataclasses.field(default_factory=list)
    widest_words: list[Longest] = dataclasses.field(default_factory=list)
    longest_runs: list[Longest] = dataclasses.field(default_factory=list)
    id_counts: Any = None  # numpy int64 array (V,) or None
    vocab_size: int | None = None
    seconds: float = 0.0

    def outliers(self) -> tuple[float, int]:
        """(fence, samples beyond it): token lengths beyond Q3 + 3 IQR (`far_out_fence`)."""
        fence = self.tokens.far_out_fence()
        return fence, sum(c for v, c in self.tokens.counts.items() if v > fence)


class _Pass:
    """The running state of one pass: counts, top-k heaps, id counts."""

    def __init__(self, report: DataReport, top: int) -> None:
        self.report = report
        self.top = {name: TopK(top) for name in ("tokens", "words", "runs")}

    def add(self, where: list[int], texts: list[str], encoded: list[Any]) -> None:
        r = self.report
        lengths = encoded if r.approximate else [len(ids) for ids in encoded]
        if not r.approximate:
            self._count_ids(encoded)
        profiles = [char_profile(t) for t in texts]
        r.tokens.add(lengths)
        r.words.add(p[0] for p in profiles)
        r.whitespace.add(p[1] for p in profiles)
        r.samples += len(texts)
        for at, text, n, (word, run) in zip(where, texts, lengths, profiles, strict=True):
            for name, value in (("tokens", n), ("words", word), ("runs", run)):
                if self.top[name].wants(value):
                    self.top[name].push(value, at, preview(text), tokens=n)

    def _count_ids(self, encoded: list[list[int]]) -> None:
        import numpy as np

        ids = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int64)
        if ids.size == 0:
            return
        counts = np.bincount(ids)
        r = self.report
        if r.id_counts is None:
            r.id_counts = np.zeros(max(r.vocab_size or 0, counts.size), dtype=np.int64)
        if counts.size > r.id_counts.size:
            r.id_counts = np.pad(r.id_counts, (0, counts.size - r.id_counts.size))
        r.id_counts[: counts.size] += counts

    def finish(self, src: TextSource, seconds: float) -> DataReport:
        r = self.report
        r.longest = self.top["tokens"].items()
        r.widest_words = self.top["words"].items()
        r.longest_runs = self.top["runs"].items()
        r.skipped_blank = src.skipped_blank
        r.seconds = seconds
        return r


def _batches(rows: Iterable[tuple[int, str]], size: int) -> Iterator[tuple[list[int], list[str]]]:
    it = iter(rows)
    while chunk := list(itertools.islice(it, size)):
        yield [w for w, _ in chunk], [t for _, t in chunk]


def analyze_data(
    path: str | Path,
    *,
    tokenizer: Tokenizer | None = None,
    field: str | None = None,
    format: str | None = None,
    split: str | None = None,
    top: int = 5,
    progress: Progress | None = None,
) -> DataReport:
    """Token-length and character-level statistics of the texts at `path`, in one streaming
    pass (see `open_texts` for the formats, `field`, `format` and `split`).

    `tokenizer` is a `load_tokenizer(folder)` result; None counts with ApproximateTokenizer
    (and the report says so). `top` longest samples of each kind are kept. `progress(done,
    total)` is called after each batch. Raises BadInputError for bad input (see
    `open_texts`) and for a data set without a single sample.

    Example:
        >>> report = analyze_data("train.jsonl", tokenizer=load_tokenizer("my-model/"))
        >>> report.tokens.percentile(99), report.longest[0].where
    """
    if not isinstance(top, int) or isinstance(top, bool) or top < 0:
        raise BadInputError(f"top={top!r} must be a whole number of samples, 0 or more.")
    tok: Tokenizer = tokenizer if tokenizer is not None else ApproximateTokenizer()
    t0 = time.perf_counter()
    src = open_texts(path, field=field, format=format, split=split)
    report = DataReport(
        path=src.path, format=src.format, field=src.field, unit=src.unit, tokenizer=tok.name,
        approximate=tok.approximate, vocab_size=tok.vocab_size,
    )  # fmt: skip
    state = _Pass(report, top)
    for where, texts in _batches(src, SAMPLES_PER_BATCH):
        state.add(where, texts, tok.encode(texts))
        if progress is not None:
            progress(src.done, src.total)
    if report.samples == 0:
        raise BadInputError(
            f"{src.path.name} holds no samples (only blank lines, or no rows). Check the file."
        )
    return state.finish(src, time.perf_counter() - t0)
