"""Statistics kept in one streaming pass, in memory that does not grow with the data.

Exact percentiles need every length, but not every sample: lengths are integers, so a count of
samples per distinct length (`LengthCounts`) holds them all in memory bounded by the number of
distinct lengths (at most the longest sample), whatever the number of samples. The longest
samples are kept by a bounded heap (`TopK`).
"""

from __future__ import annotations

import bisect
import heapq
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

#: Tukey's "far out" fence: beyond the third quartile by 3 interquartile ranges (J. W. Tukey,
#: Exploratory Data Analysis, 1977).
TUKEY_FAR_OUT = 3.0

_WHITESPACE_RUN = re.compile(r"\s{2,}")


@dataclass
class LengthCounts:
    """How many samples have each length: exact percentiles, histogram, share above a limit.

    Example:
        >>> c = LengthCounts(); c.add([1, 2, 3, 4])
        >>> c.percentile(50)
        2.5
    """

    counts: Counter[int] = field(default_factory=Counter)

    def add(self, lengths: Iterable[int]) -> None:
        self.counts.update(lengths)

    @property
    def n(self) -> int:
        return sum(self.counts.values())

    @property
    def total(self) -> int:
        """The sum of all lengths."""
        return sum(v * c for v, c in self.counts.items())

    @property
    def max(self) -> int:
        return max(self.counts, default=0)

    def mean(self) -> float:
        return self.total / self.n if self.counts else 0.0

    def _sorted(self) -> tuple[list[int], list[int]]:
        """Distinct lengths ascending, and the number of samples up to and including each."""
        values = sorted(self.counts)
        cumulative, run = [], 0
        for v in values:
            run += self.counts[v]
            cumulative.append(run)
        return values, cumulative

    def percentile(self, q: float) -> float:
        """The q-th percentile as `numpy.percentile(lengths, q)` computes it (linear
        interpolation between the two nearest ranks)."""
        if not self.counts:
            raise ValueError("no lengths counted")
        values, cumulative = self._sorted()

        def kth(k: int) -> int:  # the k-th smallest length, 0-based
            return values[bisect.bisect_right(cumulative, k)]

        h = (self.n - 1) * q / 100
        lo = int(h)
        low = kth(lo)
        return low + (h - lo) * (kth(min(lo + 1, self.n - 1)) - low)

    def above(self, limit: int) -> tuple[int, int]:
        """(samples longer than `limit`, tokens beyond `limit` in them): what truncating to
        `limit` cuts."""
        longer = [(v, c) for v, c in self.counts.items() if v > limit]
        return sum(c for _, c in longer), sum((v - limit) * c for v, c in longer)

    def far_out_fence(self) -> float:
        """Q3 + 3 IQR: a length beyond it is far beyond the bulk (`TUKEY_FAR_OUT`)."""
        q1, q3 = self.percentile(25), self.percentile(75)
        return q3 + TUKEY_FAR_OUT * (q3 - q1)

    def histogram(self) -> list[tuple[int, int, int]]:
        """(low, high, samples) per power-of-two bucket [2^k, 2^(k+1) - 1] (and [0, 0]), from the
        shortest bucket with a sample to the longest."""
        buckets: Counter[int] = Counter()
        for v, c in self.counts.items():
            buckets[v.bit_length()] += c  # 0 -> 0, 1 -> 1, 2..3 -> 2, 4..7 -> 3, ...
        if not buckets:
            return []
        lo, hi = min(buckets), max(buckets)
        return [
            (0 if b == 0 else 1 << (b - 1), 0 if b == 0 else (1 << b) - 1, buckets[b])
            for b in range(lo, hi + 1)
        ]


@dataclass(order=True)
class Longest:
    """A sample in a top-k list: its value (tokens or characters), where it is, a preview."""

    value: int
    where: int
    preview: str = field(compare=False, default="")
    tokens: int = field(compare=False, default=0)


class TopK:
    """The k samples with the largest value, in memory for k samples (a min-heap). Ties keep
    the first sample seen."""

    def __init__(self, k: int) -> None:
        self.k = k
        self._heap: list[tuple[int, int, int, str, int]] = []  # (value, -where, where, ...)

    def wants(self, value: int) -> bool:
        """Whether a sample of `value` would enter (so its preview is worth making)."""
        return self.k > 0 and (len(self._heap) < self.k or value > self._heap[0][0])

    def push(self, value: int, where: int, preview: str = "", tokens: int = 0) -> None:
        item = (value, -where, where, preview, tokens)
        if len(self._heap) < self.k:
            heapq.heappush(self._heap, item)
        elif value > self._heap[0][0]:
            heapq.heapreplace(self._heap, item)

    def items(self) -> list[Longest]:
        """Largest first; equal values in the order they were seen."""
        ordered = sorted(self._heap, key=lambda t: (-t[0], t[2]))
        return [Longest(value=v, where=w, preview=p, tokens=t) for v, _, w, p, t in ordered]


def char_profile(text: str) -> tuple[int, int]:
    """(longest "word", longest whitespace run) of a text, in characters. A word is a run
    without whitespace; a text that is only whitespace has no word (0), so a line of 100,000
    spaces shows as a whitespace run of 100,000."""
    words = text.split()
    runs = _WHITESPACE_RUN.findall(text)
    # Without a run of 2 or more: 1 if there is any whitespace at all, else 0.
    single = 1 if sum(map(len, words)) < len(text) else 0
    return max(map(len, words), default=0), max(map(len, runs)) if runs else single


_PREVIEW_RUN = re.compile(r"\s{4,}")
_SPACES = re.compile(r"\s*")


def preview(text: str, width: int = 60) -> str:
    """The start of a text on one line: whitespace runs of 4 or more shown as "⟨N spaces⟩"
    (or "⟨N whitespace⟩" when mixed), newlines as "⏎", cut to `width` characters."""

    def run(m: re.Match[str]) -> str:
        s = m.group(0)
        kind = "spaces" if s == " " * len(s) else "whitespace"
        return f"⟨{len(s):,} {kind}⟩"

    # Only the start is shown, but a run that starts there must be counted whole.
    head = text[: width * 4]
    if head and head[-1].isspace():
        head += _SPACES.match(text, len(head)).group(0)  # type: ignore[union-attr]
        head += text[len(head) : len(head) + width]
    shown = _PREVIEW_RUN.sub(run, head).replace("\r", "").replace("\n", "⏎").replace("\t", "⇥")
    return shown if len(shown) <= width else shown[: width - 1] + "…"
