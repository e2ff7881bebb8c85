"""Text data sets and GPU memory: token-length statistics, the longest sequence that fits and
what it truncates, a token-budget batch sampler, and vocabulary coverage and pruning.

Example:
    >>> from memfit.data import analyze_data, load_tokenizer
    >>> report = analyze_data("train.jsonl", tokenizer=load_tokenizer("my-model/"))
    >>> report.tokens.percentile(99), report.longest[0].where

Tokenizers, pyarrow and datasets are imported when used, not with this package.
"""

from __future__ import annotations

from memfit.data._source import TextSource
from memfit.data.analyze import DataReport, analyze_data
from memfit.data.budget import LengthFit, TokenBudget, fit_length, token_budget
from memfit.data.readers import FORMATS, open_texts
from memfit.data.sampler import TokenBudgetSampler
from memfit.data.stats import LengthCounts, Longest
from memfit.data.tokenize import ApproximateTokenizer, HfTokenizer, load_tokenizer
from memfit.data.vocab import (
    VocabCoverage,
    VocabSavings,
    coverage,
    shrink_vocabulary,
    vocab_savings,
)

__all__ = [
    "FORMATS",
    "ApproximateTokenizer",
    "DataReport",
    "HfTokenizer",
    "LengthCounts",
    "LengthFit",
    "Longest",
    "TextSource",
    "TokenBudget",
    "TokenBudgetSampler",
    "VocabCoverage",
    "VocabSavings",
    "analyze_data",
    "coverage",
    "fit_length",
    "load_tokenizer",
    "open_texts",
    "shrink_vocabulary",
    "token_budget",
    "vocab_savings",
]
