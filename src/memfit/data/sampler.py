"""`TokenBudgetSampler`: micro-batches whose padded size (batch x longest) stays under a token
budget, a `torch.utils.data` batch sampler.

With a budget from `token_budget` (the most padded tokens per micro-batch that fit the GPU),
no batch it yields is larger than one the estimator found to fit. Grouping by length packs
samples of similar length together, so little of each batch is padding; the batch holding the
longest sample comes first, so a step that would not fit fails at once, not hours in.
"""

from __future__ import annotations

import operator
import random
from collections.abc import Iterator, Sequence
from typing import Any

import torch.utils.data

from memfit.errors import BadInputError


class TokenBudgetSampler(torch.utils.data.Sampler[list[int]]):
    """Batches of dataset indices whose `len(batch) * longest <= max_tokens`.

    Args:
        lengths: each sample's length in tokens (index i is sample i).
        max_tokens: the budget of padded tokens per batch (e.g. `token_budget(...).tokens`).
        max_len: samples are truncated to this many tokens by the collate function, so they
            count as at most `max_len`; None: counted whole.
        group_by_length: sort by length before packing (little padding); False packs in
            dataset (or shuffled) order.
        longest_first: yield the batch holding the longest sample first.
        shuffle: shuffle the order of the batches (and, without grouping, of the samples),
            anew each epoch (`set_epoch`), from `seed`.
        max_batch_size: at most this many samples a batch, whatever the budget; None: no cap.

    An empty sample counts as 1 token (it still takes a row of the batch). A sample longer
    than the budget can never be batched, so it is an error, naming it, at construction.

    Example:
        >>> sampler = TokenBudgetSampler(lengths, max_tokens=16384, max_len=2048, shuffle=True)
        >>> loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=pad_and_truncate)
    """

    def __init__(
        self,
        lengths: Sequence[int],
        max_tokens: int,
        *,
        max_len: int | None = None,
        group_by_length: bool = True,
        longest_first: bool = True,
        shuffle: bool = False,
        seed: int = 0,
        max_batch_size: int | None = None,
    ) -> None:
        _check_count("max_tokens", max_tokens)
        if max_len is not None:
            _check_count("max_len", max_len)
        if max_batch_size is not None:
            _check_count("max_batch_size", max_batch_size)
        self.lengths = [_counted(i, n, max_len) for i, n in enumerate(lengths)]
        self.max_tokens = max_tokens
        self.max_len = max_len
        self.group_by_length, self.longest_first = group_by_length, longest_first
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self.max_batch_size = max_batch_size
        self._check_budget()
        self._cache: tuple[int, list[list[int]]] | None = None

    @classmethod
    def from_dataset(cls, dataset: Any, max_tokens: int, *, column: str = "input_ids",
                     **options: Any) -> TokenBudgetSampler:  # fmt: skip
        """A sampler over a `datasets.Dataset` (or any dataset of dicts): `column` holds each
        sample's tokens (its length is read) or its length as an int."""
        if hasattr(dataset, "column_names") and hasattr(dataset, "select_columns"):
            if column not in dataset.column_names:
                raise BadInputError(
                    f"The dataset has no column {column!r}; its columns are "
                    f"{', '.join(map(repr, dataset.column_names))}. Pass column=."
                )
            rows = dataset.select_columns([column]).iter(batch_size=1024)
            values = (v for batch in rows for v in batch[column])
        else:
            values = (dataset[i][column] for i in range(len(dataset)))
        lengths = [v if isinstance(v, int) else len(v) for v in values]
        return cls(lengths, max_tokens, **options)

    def _check_budget(self) -> None:
        over = [(i, n) for i, n in enumerate(self.lengths) if n > self.max_tokens]
        if over:
            i, n = max(over, key=lambda t: t[1])
            raise BadInputError(
                f"{len(over)} sample(s) are longer than max_tokens={self.max_tokens}, the "
                f"longest sample {i} with {n} tokens: no batch can hold them. Truncate with "
                f"max_len= (at most {self.max_tokens}), or raise max_tokens."
            )

    def set_epoch(self, epoch: int) -> None:
        """Shuffle differently for each epoch (as DistributedSampler.set_epoch)."""
        self.epoch = epoch

    def batches(self) -> list[list[int]]:
        """This epoch's batches, in the order they are yielded."""
        if self._cache is None or self._cache[0] != self.epoch:
            self._cache = (self.epoch, self._make_batches())
        return self._cache[1]

    def _make_batches(self) -> list[list[int]]:
        rng = random.Random(self.seed + self.epoch)
        order = list(range(len(self.lengths)))
        if self.shuffle:
            rng.shuffle(order)
        if self.group_by_length:  # stable: equal lengths keep the (shuffled) order
            order.sort(key=lambda i: -self.lengths[i])
        batches = self._pack(order)
        if self.shuffle:
            rng.shuffle(batches)
        if self.longest_first and batches:
            first = max(range(len(batches)), key=self._size_key(batches))
            batches.insert(0, batches.pop(first))
        return batches

    def _size_key(self, batches: list[list[int]]) -> Any:
        def key(b: int) -> tuple[int, int, int]:
            longest = max(self.lengths[i] for i in batches[b])
            return longest, longest * len(batches[b]), -b  # ties: the earliest batch

        return key

    def _pack(self, order: list[int]) -> list[list[int]]:
        """Greedy: a sample joins the open batch unless (size + 1) x longest would pass the
        budget (or the batch is full); then the batch closes and the sample opens the next."""
        batches: list[list[int]] = []
        batch: list[int] = []
        longest = 0
        for i in order:
            n = self.lengths[i]
            wider = max(longest, n)
            full = self.max_batch_size is not None and len(batch) >= self.max_batch_size
            if batch and (full or (len(batch) + 1) * wider > self.max_tokens):
                batches.append(batch)
                batch, wider = [], n
            batch.append(i)
            longest = wider
        if batch:
            batches.append(batch)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        yield from (list(b) for b in self.batches())

    def __len__(self) -> int:
        return len(self.batches())


def _counted(i: int, n: Any, max_len: int | None) -> int:
    """A sample's length as the budget counts it: at least 1, at most max_len."""
    try:
        if isinstance(n, bool):
            raise TypeError
        n = operator.index(n)  # int, numpy and torch integers
    except TypeError:
        n = -1
    if n < 0:
        raise BadInputError(
            f"lengths[{i}] is {n!r}: a length is a whole number of tokens, 0 or more."
        )
    n = max(n, 1)
    return min(n, max_len) if max_len is not None else n


def _check_count(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadInputError(f"{name}={value!r} must be a positive whole number.")
