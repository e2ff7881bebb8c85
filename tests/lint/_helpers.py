"""Shared by the lint tests: lint a dedented snippet and read back (line, code) pairs."""

from __future__ import annotations

import textwrap

from memfit.lint.engine import lint_source
from memfit.lint.finding import LintFinding
from memfit.lint.rules import selected


def lint(src: str, *codes: str) -> list[LintFinding]:
    return lint_source(textwrap.dedent(src), "snippet.py", selected(codes or None, None))


def hits(src: str, *codes: str) -> list[tuple[int, str]]:
    """(line, code) of each finding of `codes` (all rules when none is named)."""
    return [(f.line, f.code) for f in lint(src, *codes)]
