"""`memfit lint`: find memory anti-patterns in PyTorch training code without running it.

    >>> from memfit.lint import lint_paths
    >>> [f"{f.path}:{f.line} {f.code}" for f in lint_paths(["train.py"])]

The static sibling of `memfit.doctor`: the rules and their codes are in `memfit.lint.rules`,
one docs entry each in docs/lint.md. Only `ast` is used; nothing of the linted code runs.
"""

from memfit.lint.config import LintConfig, find_config
from memfit.lint.engine import collect_files, lint_files, lint_paths, lint_source
from memfit.lint.finding import Edit, LintFinding
from memfit.lint.rules import RULES, Rule

__all__ = [
    "RULES",
    "Edit",
    "LintConfig",
    "LintFinding",
    "Rule",
    "collect_files",
    "find_config",
    "lint_files",
    "lint_paths",
    "lint_source",
]
