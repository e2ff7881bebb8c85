"""MF002: a model run in evaluation mode (after `model.eval()`) with grad enabled.

Evaluation code is recognised by what it does, not by its name: `m.eval()` is called, then
`m(...)` (or `m.forward(...)`) in the same function, before `m.train()`. It is clean when the
call is inside `with torch.no_grad()` / `inference_mode()` / `set_grad_enabled(...)`, when the
function is decorated with one of them, when every call of the function in the same file is
made under one, when the function sets grad mode itself, or when a backward runs while the model
is in eval mode (training with frozen batch-norm statistics is not evaluation). Lightning's
`validation_step`/`test_step`/`predict_step` run under `no_grad` already.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from memfit.lint import _ast
from memfit.lint.finding import FileContext, LintFinding

EVAL = "MF002"
_FRAMEWORK_NO_GRAD = frozenset({"validation_step", "test_step", "predict_step", "evaluate_step"})
_GRAD_MODE_CALLS = frozenset({"set_grad_enabled", "_set_grad_enabled", "__enter__"})


@dataclass(frozen=True)
class _Event:
    pos: tuple[int, int]
    kind: str  # "eval", "train", "backward" or "call"
    receiver: str | None
    node: ast.AST


def check_eval(ctx: FileContext) -> list[LintFinding]:
    guarded_only = _called_only_under_guard(ctx)
    out = []
    for scope in ctx.scopes:
        name = getattr(scope, "name", None)
        if _ast.decorated_no_grad(scope) or name in _FRAMEWORK_NO_GRAD or name in guarded_only:
            continue
        if _sets_grad_mode(ctx, scope):
            continue
        out.extend(_scope_findings(ctx, scope))
    return out


def _scope_findings(ctx: FileContext, scope: _ast.Scope) -> list[LintFinding]:
    guards = ctx.guards(scope)
    events = sorted(_events(ctx, scope), key=lambda e: e.pos)
    out = []
    for i, ev in enumerate(events):
        if ev.kind != "eval":
            continue
        segment = []
        for later in events[i + 1 :]:
            if later.receiver == ev.receiver and later.kind in ("eval", "train"):
                break
            segment.append(later)
        if any(e.kind == "backward" for e in segment):
            continue
        calls = [
            e for e in segment
            if e.kind == "call" and e.receiver == ev.receiver and not _ast.inside(e.node, guards)
        ]  # fmt: skip
        if calls:
            out.append(_finding(ctx, calls[0].node, ev))
    return out


def _finding(ctx: FileContext, call: ast.AST, ev: _Event) -> LintFinding:
    return ctx.finding(
        call, EVAL,
        f"`{ctx.text(call)}` runs after `{ev.receiver}.eval()` (line {ev.pos[0]}) with grad "
        "enabled: it records an autograd graph that no backward uses",
        "wrap it in `with torch.no_grad():` or decorate the function with `@torch.no_grad()`",
    )  # fmt: skip


def _events(ctx: FileContext, scope: _ast.Scope) -> list[_Event]:
    out = []
    for node in ctx.nodes(scope):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        p = _ast.pos(node)
        if isinstance(func, ast.Attribute) and func.attr in ("eval", "train"):
            recv = _ast.dotted(func.value)
            falsy = func.attr == "train" and node.args and _ast.is_const(node.args[0], False)
            kind = "eval" if func.attr == "eval" or falsy else "train"
            if recv is not None and (func.attr == "train" or not node.args):
                out.append(_Event(p, kind, recv, node))
        elif _is_backward(func):
            out.append(_Event(p, "backward", None, node))
        else:
            target = (
                func.value if isinstance(func, ast.Attribute) and func.attr == "forward" else func
            )
            out.append(_Event(p, "call", _ast.dotted(target), node))
    return out


def _is_backward(func: ast.expr) -> bool:
    if isinstance(func, ast.Attribute) and func.attr in ("backward", "manual_backward"):
        return True
    return (_ast.dotted(func) or "").endswith("autograd.grad")


def _sets_grad_mode(ctx: FileContext, scope: _ast.Scope) -> bool:
    """`torch.set_grad_enabled(False)` called as a statement (not a `with`)."""
    for node in ctx.nodes(scope):
        call = node.value if isinstance(node, ast.Expr) else None
        if isinstance(call, ast.Call) and _ast.call_name(call) in _GRAD_MODE_CALLS:
            return True
    return False


def _called_only_under_guard(ctx: FileContext) -> set[str]:
    """Functions of this file every call of which (at least one) is made with grad off."""
    sites: dict[str, list[bool]] = {}
    for scope in ctx.scopes:
        guards = ctx.guards(scope)
        off = _ast.decorated_no_grad(scope)
        for node in ctx.nodes(scope):
            if isinstance(node, ast.Call):
                name = _ast.last_name(node.func)
                if name is not None:
                    sites.setdefault(name, []).append(off or _ast.inside(node, guards))
    return {name for name, guarded in sites.items() if guarded and all(guarded)}
