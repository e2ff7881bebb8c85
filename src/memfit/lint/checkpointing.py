"""Activation-checkpoint rules: MF004 (`checkpoint` without `use_reentrant`), MF005 (a `None`
input to a reentrant `checkpoint`).

Only calls that this file's imports resolve to `torch.utils.checkpoint.checkpoint` or
`checkpoint_sequential` are read (a project's own `checkpoint` wrapper is not torch's); a call
that passes `**kwargs` may carry `use_reentrant` and is left alone.
"""

from __future__ import annotations

import ast

from memfit.lint import _ast
from memfit.lint.finding import FileContext, LintFinding

NO_REENTRANT_FLAG = "MF004"
NONE_INPUT = "MF005"


def _checkpoint_calls(ctx: FileContext) -> list[ast.Call]:
    names = ctx.checkpoint_names
    return [
        n for n in ast.walk(ctx.tree)
        if isinstance(n, ast.Call) and _ast.dotted(n.func) in names and not _ast.has_star_kwargs(n)
    ]  # fmt: skip


def check_use_reentrant(ctx: FileContext) -> list[LintFinding]:
    out = []
    for call in _checkpoint_calls(ctx):
        if _ast.kwarg(call, "use_reentrant") is not None:
            continue
        out.append(ctx.finding(
            call, NO_REENTRANT_FLAG,
            f"`{ctx.text(call)}` without `use_reentrant` runs the reentrant variant: a full "
            "recompute, and no gradients when no input requires grad",
            "pass `use_reentrant=False`",
        ))  # fmt: skip
    return out


def check_none_input(ctx: FileContext) -> list[LintFinding]:
    out = []
    for call in _checkpoint_calls(ctx):
        flag = _ast.kwarg(call, "use_reentrant")
        if flag is not None and not _ast.is_const(flag, True):
            continue  # False, or a variable: cannot tell which variant runs
        nones = [a for a in call.args[1:] if _ast.is_const(a, None)]
        if not nones:
            continue
        out.append(ctx.finding(
            call, NONE_INPUT,
            f"`{ctx.text(call)}` passes `None` to the reentrant checkpoint: if no other input "
            "requires grad, the segment gets no gradients",
            "pass `use_reentrant=False` and the optional inputs by keyword",
        ))  # fmt: skip
    return out
