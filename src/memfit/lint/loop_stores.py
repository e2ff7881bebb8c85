"""MF001: the stores that keep a training loop's graph tensors past their iteration.

Four shapes, each into something the loop does not re-bind (so it outlives the iteration):
an accumulation (`total += loss`, `total = total + loss`, `self.total = self.total + loss`,
`total.add_(loss)`), a container
(`losses.append(loss)`, `outs.extend([out])`), an attribute of `self` (`self.last = loss`), and
a loop-carried name (`prev = loss`, read earlier in the loop). An accumulation under `no_grad`
makes a graph-free tensor and is not reported; a container keeps the tensor as it is and is.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from memfit.lint import _ast
from memfit.lint.finding import Edit, FileContext, LintFinding

KEPT = "MF001"
_ACCUMULATE_OPS = (ast.Add, ast.Sub)
_CONTAINER_ADDS = frozenset({"append", "extend", "insert", "appendleft", "add"})
_IN_PLACE_ADDS = frozenset({"add_", "sub_"})
#: Calls that only read numbers out of a container or accumulator (so `.item()` is safe).
_NUMERIC_USES = frozenset({"sum", "len", "max", "min", "print", "sorted", "mean", "round",
                           "float", "str", "format", "fsum", "median", "average"})  # fmt: skip
_TENSOR_USERS = ("torch.", "dist.", "accelerator.", "fabric.", "xm.", "self.accelerator.")


class _Loop:
    """What the MF001 checks read about one training loop."""

    def __init__(
        self, ctx: FileContext, scope: _ast.Scope, loop: _ast.Loop,
        roots: set[str], graph: set[str], guards: list[tuple[int, int]],
    ) -> None:  # fmt: skip
        self.ctx, self.scope, self.loop = ctx, scope, loop
        self.roots, self.graph, self.guards = roots, graph, guards
        self.bound = _ast.assigned_names(loop.body)

    def leaves(self, expr: ast.AST) -> list[tuple[str, ast.expr]]:
        return [(n, node) for n, node in _ast.flow_leaves(expr) if n in self.graph]

    def outlives(self, holder: str | None) -> bool:
        return holder is not None and holder not in _ast.NOT_TENSORS and holder not in self.bound


def kept_findings(
    ctx: FileContext, scope: _ast.Scope, loop: _ast.Loop,
    roots: set[str], graph: set[str], guards: list[tuple[int, int]],
) -> Iterator[tuple[ast.AST, LintFinding]]:  # fmt: skip
    lp = _Loop(ctx, scope, loop, roots, graph, guards)
    for node in _ast.walk(loop.body):
        f = _accumulation(lp, node) or _container(lp, node) or _attribute(lp, node)
        f = f or _carried(lp, node)
        if f is not None:
            yield node, f


def _accumulation(lp: _Loop, node: ast.AST) -> LintFinding | None:
    holder, value = None, None
    if isinstance(node, ast.AugAssign) and isinstance(node.op, _ACCUMULATE_OPS):
        holder, value = _ast.root_name(node.target), node.value
    elif isinstance(node, ast.Assign) and len(node.targets) == 1:
        t = node.targets[0]
        name = t.id if isinstance(t, ast.Name) and isinstance(node.value, ast.BinOp) else None
        if name in _ast.data_names(node.value) and lp.bound.get(name or "") == [node]:
            holder, value = name, node.value
        elif _self_accumulation(t, node.value):  # `self.total = self.total + loss`
            holder, value = _ast.dotted(t), node.value
    elif isinstance(node, ast.Call) and _ast.call_name(node) in _IN_PLACE_ADDS and node.args:
        assert isinstance(node.func, ast.Attribute)
        holder, value = _ast.root_name(node.func.value), node.args[0]
    # `t = t + loss` (its only binding in the loop) and `self.t = self.t + loss` outlive it.
    rebinds = isinstance(node, ast.Assign)
    if value is None or not (rebinds or lp.outlives(holder)) or _ast.inside(node, lp.guards):
        return None
    leaves = [(n, leaf) for n, leaf in lp.leaves(value) if n != holder]
    if not leaves:
        return None
    assert holder is not None
    number = _numeric_holder(lp, holder, node)
    edits = _edits(lp, leaves, ".item()" if number else ".detach()")
    name = leaves[0][0]
    fix = f"`{holder} += {name}.item()`" if number else f"add `{name}.detach()`"
    return lp.ctx.finding(
        node, KEPT,
        f"`{lp.ctx.text(node)}` keeps every step's autograd graph alive in `{holder}`",
        fix, edits,
    )  # fmt: skip


def _self_accumulation(target: ast.expr, value: ast.expr) -> bool:
    """`self.x = self.x + ...` (or `- ...`): an attribute of self accumulated by assignment."""
    dotted = _ast.dotted(target) or ""
    if not dotted.startswith("self.") or not isinstance(value, ast.BinOp):
        return False
    if not isinstance(value.op, _ACCUMULATE_OPS):
        return False
    return dotted in (_ast.dotted(value.left), _ast.dotted(value.right))


def _container(lp: _Loop, node: ast.AST) -> LintFinding | None:
    if not isinstance(node, ast.Call) or _ast.call_name(node) not in _CONTAINER_ADDS:
        return None
    assert isinstance(node.func, ast.Attribute)
    holder = _ast.root_name(node.func.value)
    if not node.args or not lp.outlives(holder):
        return None
    value = node.args[-1]
    leaves = lp.leaves(value)
    if not leaves:
        return None
    assert holder is not None
    name = leaves[0][0]
    is_loss = all(n in lp.roots for n, _ in leaves)
    number = is_loss and _numeric_holder(lp, holder, node)
    edits = _edits(lp, leaves, ".item()" if number else ".detach()") if is_loss else ()
    if is_loss:
        fix = f"store `{name}.item()` or `{name}.detach()`"
    else:
        fix = f"store `{name}.detach()`, or `{name}.detach().cpu()` to free the GPU memory too"
    return lp.ctx.finding(
        node, KEPT,
        f"`{lp.ctx.text(node)}` keeps every step's tensor and autograd graph in `{holder}`",
        fix, edits,
    )  # fmt: skip


def _attribute(lp: _Loop, node: ast.AST) -> LintFinding | None:
    if not isinstance(node, ast.Assign) or len(node.targets) != 1:
        return None
    target = _ast.dotted(node.targets[0]) or ""
    if not target.startswith("self.") or not _passes_through(node.value):
        return None
    leaves = lp.leaves(node.value)
    if not leaves:
        return None
    name = leaves[0][0]
    return lp.ctx.finding(
        node, KEPT,
        f"`{lp.ctx.text(node)}` keeps the step's autograd graph alive on `self` into the "
        "next iteration",
        f"`{target} = {name}.detach()` (or `.item()` for a number)",
    )  # fmt: skip


def _carried(lp: _Loop, node: ast.AST) -> LintFinding | None:
    """`prev = loss` where `prev` is read earlier in the loop: the loss outlives its step."""
    if not isinstance(node, ast.Assign) or len(node.targets) != 1:
        return None
    t, v = node.targets[0], node.value
    if not (isinstance(t, ast.Name) and isinstance(v, ast.Name) and v.id in lp.roots):
        return None
    first = next(
        (n for n in _ast.walk(lp.loop.body) if isinstance(n, ast.Name) and n.id == t.id), None
    )
    if first is None or not isinstance(first.ctx, ast.Load) or len(lp.bound[t.id]) != 1:
        return None
    return lp.ctx.finding(
        node, KEPT,
        f"`{lp.ctx.text(node)}` carries the loss and its autograd graph into the next "
        "iteration",
        f"`{t.id} = {v.id}.detach()` (or `.item()` for a number)",
    )  # fmt: skip


def _passes_through(expr: ast.AST) -> bool:
    while isinstance(expr, ast.Attribute | ast.Subscript):
        expr = expr.value
    return isinstance(expr, ast.Name)


def _edits(lp: _Loop, leaves: list[tuple[str, ast.expr]], text: str) -> tuple[Edit, ...]:
    """`--fix` edits: only when every graph read is the loss itself, by a bare name."""
    if not all(isinstance(node, ast.Name) and name in lp.roots for name, node in leaves):
        return ()
    return tuple(lp.ctx.after(node, text) for _, node in leaves)


def _numeric_holder(lp: _Loop, holder: str, store: ast.AST) -> bool:
    """Whether `holder` starts as a number or an empty list in the scope and is read only as
    numbers (printed, summed, formatted): then `.item()` is safe, else `.detach()` keeps a
    tensor."""
    starts = False
    store_nodes = {id(n) for n in ast.walk(store)}
    nodes = lp.ctx.nodes(lp.scope)
    parents = {id(c): p for p in nodes for c in ast.iter_child_nodes(p)}
    for node in nodes:
        if isinstance(node, ast.Assign):
            starts = starts or any(name == holder and _empty_start(v) for name, v in _pairs(node))
        read = _ast.dotted(node) == holder and isinstance(getattr(node, "ctx", None), ast.Load)
        if read and id(node) not in store_nodes and not _numeric_use(node, parents):
            return False
    return starts


def _pairs(node: ast.Assign) -> list[tuple[str, ast.expr]]:
    """(name, value) bound by `a = 0` or `a, b = 0.0, []`."""
    out = []
    for t in node.targets:
        if isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple):
            if len(t.elts) == len(node.value.elts):
                out += [
                    (n, v)
                    for e, v in zip(t.elts, node.value.elts, strict=True)
                    for n in _ast.target_names(e)
                ]
        else:
            out += [(n, node.value) for n in _ast.target_names(t)]
    return out


def _empty_start(v: ast.expr) -> bool:
    number = isinstance(v, ast.Constant) and type(v.value) in (int, float)
    return number or (isinstance(v, ast.List) and not v.elts)


def _numeric_use(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    parent = parents.get(id(node))
    if isinstance(parent, ast.BinOp | ast.Compare | ast.FormattedValue | ast.AugAssign):
        return True
    if isinstance(parent, ast.Call) and node is not parent.func:
        name = _ast.dotted(parent.func) or ""
        if name.startswith(_TENSOR_USERS):
            return False
        return name.rpartition(".")[2] in _NUMERIC_USES
    if isinstance(parent, ast.Attribute):
        return False  # total.item(), total.cpu(), losses.clear() ...
    return False
