"""What the GPU allows the data: the longest sequence that fits (and what truncating to it cuts),
and the largest padded tokens per micro-batch (`token_budget`, for `TokenBudgetSampler`).

Both come from the estimator's searches (`memfit.max_seq`, `memfit.max_batch`), not from a
formula.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memfit.data.stats import LengthCounts
from memfit.errors import BadInputError
from memfit.planner.limits import Limit, max_batch, max_seq
from memfit.workload import Workload


@dataclass(frozen=True)
class LengthFit:
    """The longest sequence that fits, and the samples truncating to it cuts.

    Attributes:
        limit: the `max_seq` search (`limit.largest`: None when not even 1 token fits;
            `limit.capped`: the answer is a lower bound, so the cut is an upper bound).
        truncated: samples longer than `limit.largest`; tokens_cut: their tokens beyond it.
        samples, tokens: the data's samples and tokens.
    """

    limit: Limit
    truncated: int
    tokens_cut: int
    samples: int
    tokens: int

    @property
    def share_truncated(self) -> float:
        return self.truncated / self.samples if self.samples else 0.0

    @property
    def share_cut(self) -> float:
        return self.tokens_cut / self.tokens if self.tokens else 0.0


def fit_length(
    model: Any, workload: Workload, lengths: LengthCounts, *, gpu: str,
    task: str | None = None, alloc_conf: str | None = None,
) -> LengthFit:  # fmt: skip
    """`max_seq` for `workload` on `gpu`, and the share of the data (`lengths`, samples per
    token length) longer than it.

    Example:
        >>> fit = fit_length("gpt2", memfit.Workload(batch_size=8), report.tokens, gpu="rtx-4090")
        >>> fit.limit.largest, fit.share_truncated
    """
    limit = max_seq(model, workload, gpu=gpu, task=task, alloc_conf=alloc_conf)
    truncated, cut = lengths.above(limit.largest or 0)
    return LengthFit(limit=limit, truncated=truncated, tokens_cut=cut, samples=lengths.n,
                     tokens=lengths.total)  # fmt: skip


@dataclass(frozen=True)
class TokenBudget:
    """The most padded tokens (batch x longest) a micro-batch may hold and fit.

    Attributes:
        tokens: the budget; max_len: the longest sample it allows.
        batch_at_max_len: the largest micro-batch of `max_len` tokens that fits (`tokens` is
            that times `max_len`, or less when a shorter shape failed the check).
        checks: (batch, seq_len, fits) of the shapes verified with the estimator.
        capped: the micro-batch search hit its cap, so more tokens may fit.
    """

    tokens: int
    max_len: int
    batch_at_max_len: int
    checks: list[tuple[int, int, bool]] = field(default_factory=list)
    capped: bool = False


#: Shorter sequences checked at the budget: max_len / 2, / 4, ..., this many halvings.
CHECKED_HALVINGS = 3


def token_budget(
    model: Any, workload: Workload, *, gpu: str, max_len: int, task: str | None = None,
    alloc_conf: str | None = None,
) -> TokenBudget:  # fmt: skip
    """The largest tokens per micro-batch that fit `gpu` for `workload`, with samples up to
    `max_len` tokens: `max_batch` at `max_len`, times `max_len`.

    Why a budget found at the longest length holds for shorter ones: at a fixed number of
    tokens, a transformer's memory grows with the sequence length (attention's scores are
    batch x seq x seq, that is tokens x seq), so `max_len` is the worst shape of a budget.
    That is checked, not assumed: the budget is estimated at max_len / 2, / 4 and / 8 with the
    batch it allows there, and lowered to the largest that fits at a shape that fails.

    Example:
        >>> budget = token_budget("gpt2", memfit.Workload(), gpu="rtx-4090", max_len=1024)
        >>> sampler = TokenBudgetSampler(lengths, max_tokens=budget.tokens, max_len=1024)
    """
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise BadInputError(f"max_len={max_len!r} must be a positive whole number of tokens.")
    base = workload.with_(seq_len=max_len)
    at_max = max_batch(model, base, gpu=gpu, task=task, alloc_conf=alloc_conf)
    if at_max.largest is None:
        raise BadInputError(
            f"Not even one sample of max_len={max_len} tokens fits {gpu} for this workload. "
            "Lower max_len (memfit max-seq gives the longest that fits), or lighten the "
            "workload (memfit plan)."
        )
    tokens, checks = at_max.largest * max_len, []
    for k in range(1, CHECKED_HALVINGS + 1):
        seq = max_len >> k
        if seq < 1:
            break
        ok = _fits(model, base.with_(seq_len=seq, batch_size=tokens // seq), gpu, task, alloc_conf)
        checks.append((tokens // seq, seq, ok))
        if not ok:
            found = max_batch(model, base.with_(seq_len=seq), gpu=gpu, task=task,
                              alloc_conf=alloc_conf).largest or 0  # fmt: skip
            tokens = min(tokens, found * seq)
    return TokenBudget(tokens=tokens, max_len=max_len, batch_at_max_len=at_max.largest,
                       checks=checks, capped=at_max.capped)  # fmt: skip


def _fits(model: Any, w: Workload, gpu: str, task: str | None, alloc_conf: str | None) -> bool:
    from memfit.estimator import estimate

    return bool(estimate(model, w, gpu=gpu, task=task, alloc_conf=alloc_conf).fits)
