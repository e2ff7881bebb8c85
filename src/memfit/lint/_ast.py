"""The `ast` vocabulary the lint rules share: scopes, loops, dotted names, the names a tensor
expression reads, grad-mode guards and what `torch.utils.checkpoint` is called in a file.

Nothing here imports or runs the linted code: every answer is read from its syntax tree.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

Scope = ast.Module | ast.FunctionDef | ast.AsyncFunctionDef
Loop = ast.For | ast.AsyncFor | ast.While
_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_TARGETED = (ast.AnnAssign, ast.NamedExpr, ast.For, ast.AsyncFor, ast.comprehension)

#: Tensor methods whose result keeps the autograd graph of their receiver.
GRAPH_METHODS = frozenset(
    {
        "mean", "sum", "float", "half", "bfloat16", "double", "to", "cuda", "view", "reshape",
        "squeeze", "unsqueeze", "flatten", "clone", "contiguous", "div", "mul", "add", "sub",
        "abs", "pow", "exp", "log", "sqrt", "norm", "softmax", "log_softmax", "sigmoid", "tanh",
        "transpose", "permute", "expand", "repeat", "masked_fill", "clamp", "neg", "view_as",
        "reshape_as", "narrow",
    }
)  # fmt: skip
#: Calls that return a number or a graph-free tensor: their argument no longer holds a graph.
CUT_METHODS = frozenset(
    {
        "item", "detach", "detach_", "tolist", "numpy", "argmax", "argmin", "eq", "ne", "gt",
        "lt", "ge", "le", "long", "int", "bool", "numel", "size", "dim", "nelement", "data_ptr",
    }
)  # fmt: skip
CUT_FUNCS = frozenset({"float", "int", "bool", "str", "len", "round", "repr", "format", "print",
                       "isinstance"})  # fmt: skip
#: Names a graph never flows through (framework objects that drive a backward).
NOT_TENSORS = frozenset({"self", "accelerator", "fabric", "scaler", "engine", "model_engine",
                         "torch", "autograd"})  # fmt: skip
#: Context managers or decorators that turn grad recording off (or decide it explicitly).
GRAD_GUARDS = frozenset({"no_grad", "inference_mode", "set_grad_enabled"})


def dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a Name or an Attribute chain over a Name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def last_name(node: ast.AST) -> str | None:
    """The last identifier of a Name or Attribute (`self.tokenizer` -> `tokenizer`)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def pos(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


def walk(nodes: list[ast.stmt] | ast.AST) -> Iterator[ast.AST]:
    """Every node below `nodes`, not entering nested functions, classes or lambdas."""
    start = nodes if isinstance(nodes, list) else [nodes]
    stack: list[ast.AST] = [n for n in reversed(start) if n is nodes or not _nested(n)]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in reversed(list(ast.iter_child_nodes(node))) if not _nested(c))


def _nested(node: ast.AST) -> bool:
    return isinstance(node, _NESTED)


def scopes(tree: ast.Module) -> Iterator[Scope]:
    """The module and every function in it (methods and nested functions included)."""
    yield tree
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def loops(scope: Scope) -> Iterator[Loop]:
    for node in walk(scope.body):
        if isinstance(node, Loop):
            yield node


def kwarg(call: ast.Call, name: str) -> ast.expr | None:
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


def has_star_kwargs(call: ast.Call) -> bool:
    return any(k.arg is None for k in call.keywords)


def is_const(node: ast.AST | None, value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def call_name(call: ast.Call) -> str | None:
    """The last identifier of the called object (`torch.no_grad()` -> `no_grad`)."""
    return last_name(call.func)


def is_grad_guard(expr: ast.AST) -> bool:
    """`torch.no_grad()`, `torch.inference_mode()`, `torch.set_grad_enabled(...)` (as a with
    item or decorator, called or not)."""
    target = expr.func if isinstance(expr, ast.Call) else expr
    return last_name(target) in GRAD_GUARDS


def guarded_lines_in(nodes: list[ast.stmt] | list[ast.AST]) -> list[tuple[int, int]]:
    """Line ranges of the `with` blocks among `nodes` (statements, walked, or an already
    walked node list) that decide grad mode."""
    out = []
    walked = nodes if nodes and not isinstance(nodes[0], ast.stmt) else walk(list(nodes))  # type: ignore[arg-type]
    for node in walked:
        if isinstance(node, ast.With | ast.AsyncWith) and any(
            is_grad_guard(i.context_expr) for i in node.items
        ):
            out.append((node.lineno, node.end_lineno or node.lineno))
    return out


def inside(node: ast.AST, ranges: list[tuple[int, int]]) -> bool:
    line = getattr(node, "lineno", 0)
    return any(a <= line <= b for a, b in ranges)


def decorated_no_grad(scope: Scope) -> bool:
    if isinstance(scope, ast.Module):
        return False
    return any(is_grad_guard(d) for d in scope.decorator_list)


def data_names(expr: ast.AST | None) -> set[str]:
    """Names whose tensor (and its autograd graph) can flow into the value of `expr`.

    `loss * n` -> {loss}; `loss.item()` -> {} (a number); `scaler.scale(loss)` -> {loss};
    `outputs.logits` -> {outputs}; `self.x` -> {self.x}. Comparisons give {} (bool tensors).
    """
    return {name for name, _ in flow_leaves(expr)}


def flow_leaves(expr: ast.AST | None) -> list[tuple[str, ast.expr]]:
    """The (name, node) pairs of `data_names`, with the Name or `self.x` node read."""
    if expr is None:
        return []
    if isinstance(expr, ast.Name):
        return [] if expr.id in NOT_TENSORS else [(expr.id, expr)]
    if isinstance(expr, ast.Attribute):
        d = dotted(expr)
        if d is not None and d.startswith("self.") and isinstance(expr.value, ast.Name):
            return [(d, expr)]
        return flow_leaves(expr.value)
    if isinstance(expr, ast.Subscript | ast.Starred):
        return flow_leaves(expr.value)
    if isinstance(expr, ast.BinOp):
        return flow_leaves(expr.left) + flow_leaves(expr.right)
    if isinstance(expr, ast.UnaryOp):
        return [] if isinstance(expr.op, ast.Not) else flow_leaves(expr.operand)
    if isinstance(expr, ast.IfExp):
        return flow_leaves(expr.body) + flow_leaves(expr.orelse)
    if isinstance(expr, ast.Tuple | ast.List):
        return [leaf for e in expr.elts for leaf in flow_leaves(e)]
    if isinstance(expr, ast.Call):
        return _call_leaves(expr)
    return []


def _call_leaves(call: ast.Call) -> list[tuple[str, ast.expr]]:
    func = call.func
    args = [leaf for a in call.args for leaf in flow_leaves(a)]
    if isinstance(func, ast.Attribute):
        if func.attr in CUT_METHODS:
            return []
        if func.attr in GRAPH_METHODS:
            return flow_leaves(func.value) + args
        return args
    if isinstance(func, ast.Name) and func.id in CUT_FUNCS:
        return []
    return args


def target_names(target: ast.AST) -> list[str]:
    """Names bound by an assignment target (`a, (b, self.c)` -> a, b, self.c)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Attribute):
        d = dotted(target)
        return [d] if d is not None and d.startswith("self.") else []
    if isinstance(target, ast.Tuple | ast.List):
        return [n for e in target.elts for n in target_names(e)]
    if isinstance(target, ast.Starred):
        return target_names(target.value)
    return []


def root_name(node: ast.AST) -> str | None:
    """The object a store goes into: `a.b[0].c` -> `a`, `self.x.y` -> `self.x`."""
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        if isinstance(node, ast.Attribute) and dotted(node) and isinstance(node.value, ast.Name):
            return dotted(node) if node.value.id == "self" else node.value.id
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def assigned_names(nodes: list[ast.stmt]) -> dict[str, list[ast.AST]]:
    """Name -> the statements that bind it (plain, annotated, for-targets, with-as), below
    `nodes`; augmented assignments do not re-bind and are not counted."""
    out: dict[str, list[ast.AST]] = {}
    for node in walk(nodes):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, _TARGETED):
            targets = [node.target]
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            targets = [node.optional_vars]
        for t in targets:
            for n in target_names(t):
                out.setdefault(n, []).append(node)
    return out


def checkpoint_names(tree: ast.Module) -> set[str]:
    """The dotted names under which this file can call `torch.utils.checkpoint.checkpoint`
    (or `checkpoint_sequential`): only those its imports make resolve to torch's."""
    out = {
        "torch.utils.checkpoint.checkpoint",
        "torch.utils.checkpoint.checkpoint_sequential",
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            for a in node.names:
                local = a.asname or a.name
                if node.module == "torch.utils.checkpoint" and a.name.startswith("checkpoint"):
                    out.add(local)
                elif node.module == "torch.utils" and a.name == "checkpoint":
                    out |= {f"{local}.checkpoint", f"{local}.checkpoint_sequential"}
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch.utils.checkpoint" and a.asname:
                    out |= {f"{a.asname}.checkpoint", f"{a.asname}.checkpoint_sequential"}
    return out
