"""Training-loop rules: MF001 (a loss or output kept past its iteration), MF003
(`retain_graph=True` in a loop), MF007 (`zero_grad(set_to_none=False)`).

A training loop is a `for`/`while` loop whose body calls a backward (`loss.backward()`,
`scaler.scale(loss).backward()`, `accelerator.backward(loss)`, `self.manual_backward(loss)`).
Its graph tensors are the backward's tensors, the names they were computed from by a call that
builds a graph (`out = model(x)`, not `x = x.to(device)` nor `x, y = get_batch()`), and what is
computed from those (`logits = out.logits`), outside `no_grad` blocks. That narrow reading keeps
a lint that would otherwise flag every list of labels quiet.
"""

from __future__ import annotations

import ast
import re

from memfit.lint import _ast
from memfit.lint.finding import FileContext, LintFinding
from memfit.lint.loop_stores import kept_findings

RETAIN = "MF003"
ZERO_GRAD = "MF007"

_BACKWARD_CALLS = frozenset({"backward", "grad"})


def check_kept(ctx: FileContext) -> list[LintFinding]:
    """MF001 over every training loop of the file (a store is reported once, for the
    innermost loop it is seen in)."""
    found: dict[tuple[int, int], LintFinding] = {}
    for scope in ctx.scopes:
        for loop in ctx.loops(scope):
            roots = backward_roots(loop.body)
            if not roots:
                continue
            guards = _ast.guarded_lines_in(loop.body)
            graph = graph_names(loop.body, roots, guards)
            for node, f in kept_findings(ctx, scope, loop, roots, graph, guards):
                found[_ast.pos(node)] = f
    return list(found.values())


def backward_roots(body: list[ast.stmt]) -> set[str]:
    """The names of the tensors a backward is called on below `body`."""
    roots: set[str] = set()
    for node in _ast.walk(body):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        attr = node.func.attr
        if attr == "backward":
            roots |= _ast.data_names(node.func.value)
            if node.args:
                roots |= _ast.data_names(node.args[0])
        elif attr == "manual_backward" and node.args:
            roots |= _ast.data_names(node.args[0])
    return roots


#: Callees that fetch or prepare inputs rather than compute with a graph.
_INPUT_CALL = re.compile(
    r"batch|load|data|prepare|collate|device|next|iter|sample|shuffle|augment|transform|token"
    r"|read|range|enumerate|zip|list|dict|tuple|set|sorted|reversed|len|min|max|sum|abs|print"
    r"|getattr|isinstance|open|map|filter|any|all|type|super|float|int|bool|str|round",
    re.IGNORECASE,
)


def builds_graph(value: ast.AST) -> bool:
    """Whether `value` calls something that computes with a graph: a module or function called
    by name (`model(x)`, `self.model(x)`, `criterion(out, y)`) or a `.forward(...)`."""
    for node in ast.walk(value):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = _ast.dotted(func)
        last = _ast.last_name(func)
        if isinstance(func, ast.Attribute) and func.attr == "forward":
            return True
        if isinstance(func, ast.Name) and not _INPUT_CALL.search(func.id):
            return True
        own = isinstance(func, ast.Attribute) and name == f"self.{func.attr}"
        if own and not _INPUT_CALL.search(last or ""):
            return True
    return False


def graph_names(body: list[ast.stmt], roots: set[str], guards: list[tuple[int, int]]) -> set[str]:
    """The loop's graph tensors: `roots`, their graph-building ancestors, their descendants."""
    defs: dict[str, list[ast.expr]] = {}
    for node in _ast.walk(body):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            if _ast.inside(node, guards):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for name in _ast.target_names(t):
                    defs.setdefault(name, []).append(node.value)
    built = {n for n, values in defs.items() if any(builds_graph(v) for v in values)}
    graph = set(roots)
    changed = True
    while changed:
        before = len(graph)
        for name, values in defs.items():
            for v in values:
                reads = _ast.data_names(v)
                if name in graph:
                    graph |= reads & built
                elif reads & graph:
                    graph.add(name)
        changed = len(graph) != before
    return graph


def check_retain(ctx: FileContext) -> list[LintFinding]:
    """MF003: `retain_graph=True` on a backward in a loop whose graph is rebuilt every
    iteration, when no later backward in the loop uses the retained graph."""
    out = []
    for scope in ctx.scopes:
        for loop in _outer_loops(ctx, scope):
            calls = [c for c in _ast.walk(loop.body) if _is_backward(c)]
            for call in calls:
                assert isinstance(call, ast.Call)
                if not _ast.is_const(_ast.kwarg(call, "retain_graph"), True):
                    continue
                if _ast.kwarg(call, "create_graph") is not None:
                    continue
                if any(_ast.pos(c) > _ast.pos(call) for c in calls):
                    continue  # a second backward follows: the retained graph is used
                inner = _innermost(loop, call)
                if not _rebuilt(_tensor_expr(call), inner.body):
                    continue  # the graph is built before the loop: each iteration reuses it
                out.append(ctx.finding(
                    call, RETAIN,
                    f"`{ctx.text(call)}` in a loop keeps each iteration's saved tensors "
                    "alive, and no later backward uses them",
                    "drop `retain_graph=True` (needed only before a second backward through "
                    "the same graph)",
                ))  # fmt: skip
    return out


def _outer_loops(ctx: FileContext, scope: _ast.Scope) -> list[_ast.Loop]:
    """Loops of `scope` not nested in another loop of it."""
    all_loops = list(ctx.loops(scope))
    nested = {id(n) for lp in all_loops for n in _ast.walk(lp.body) if isinstance(n, _ast.Loop)}
    return [lp for lp in all_loops if id(lp) not in nested]


def _innermost(loop: _ast.Loop, node: ast.AST) -> _ast.Loop:
    best = loop
    for n in _ast.walk(loop.body):
        if isinstance(n, _ast.Loop) and any(c is node for c in _ast.walk(n.body)):
            best = n  # walk is pre-order: deeper loops come later
    return best


def _is_backward(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    name = _ast.dotted(node.func) or ""
    if isinstance(node.func, ast.Attribute) and node.func.attr == "backward":
        return True
    return name.endswith("autograd.grad") or name.endswith("manual_backward")


def _tensor_expr(call: ast.Call) -> ast.expr:
    func = call.func
    assert isinstance(func, ast.Attribute)
    if func.attr == "backward" and not call.args:
        return func.value
    return call.args[0] if call.args else func.value


def _rebuilt(expr: ast.AST, body: list[ast.stmt], depth: int = 0) -> bool:
    """Whether the graph of `expr` is built inside `body` (each iteration)."""
    if builds_graph(_strip_methods(expr)):
        return True
    if depth > 8:
        return False
    defs = _ast.assigned_names(body)
    for name in _ast.data_names(expr):
        for node in defs.get(name, []):
            value = getattr(node, "value", None)
            if value is not None and _rebuilt(value, body, depth + 1):
                return True
    return False


def _strip_methods(expr: ast.AST) -> ast.AST:
    """`model(x).sum()` -> `model(x)`; `out[i].sum()` -> `out[i]` (tensor methods build
    nothing new)."""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        if expr.func.attr not in _ast.GRAPH_METHODS:
            break
        expr = expr.func.value
    return expr


def _updates_grad_in_place(node: ast.AST) -> bool:
    if isinstance(node, ast.AugAssign):
        return isinstance(node.target, ast.Attribute) and node.target.attr == "grad"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        recv = node.func.value
        in_place = node.func.attr.endswith("_") and not node.func.attr.startswith("_")
        return in_place and isinstance(recv, ast.Attribute) and recv.attr == "grad"
    return False


def check_zero_grad(ctx: FileContext) -> list[LintFinding]:
    """MF007: `zero_grad(set_to_none=False)` keeps every gradient allocated between steps.

    A file that updates `.grad` in place (`p.grad += g`, as a parameter server does) needs the
    zeros, and is left alone."""
    if any(_updates_grad_in_place(n) for n in ast.walk(ctx.tree)):
        return []
    out = []
    for node in ast.walk(ctx.tree):
        if (
            isinstance(node, ast.Call)
            and _ast.call_name(node) == "zero_grad"
            and _ast.is_const(_ast.kwarg(node, "set_to_none"), False)
        ):
            out.append(ctx.finding(
                node, ZERO_GRAD,
                f"`{ctx.text(node)}` keeps a full set of gradients allocated through the "
                "next forward",
                "`zero_grad()` (set_to_none=True is the default since PyTorch 2.0)",
            ))  # fmt: skip
    return out
