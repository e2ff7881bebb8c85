"""Data rules: MF006 (a whole dataset moved to the GPU before the loop), MF008 (a tokenizer
that pads without truncation), MF009 (`DataLoader(pin_memory=True)` over GPU tensors)."""

from __future__ import annotations

import ast
import re

from memfit.lint import _ast
from memfit.lint.finding import FileContext, LintFinding

DATASET_ON_GPU = "MF006"
PAD_NO_TRUNCATION = "MF008"
PIN_GPU_TENSORS = "MF009"

#: Names that hold a whole split: `dataset`, `train_data`, `X_train`, `val_images`, `all_x`.
_DATASET = re.compile(
    r"(^|_)datasets?($|_)"
    r"|^(x|y)_?(train|val|valid|test)$"
    r"|^(train|training|val|valid|validation|test|eval|full|whole|all)_?"
    r"(data|set|x|y|inputs|images|labels|targets|features|tokens|ids|examples)$",
    re.IGNORECASE,
)
_MOVES = frozenset({"to", "cuda"})
_PADDING_ON = (True, "longest", "max_length")
_TOKENIZE_METHODS = frozenset({"__call__", "batch_encode_plus", "encode_plus"})


def _gpu_move(expr: ast.AST) -> ast.expr | None:
    """The receiver of `x.cuda()` / `x.to(device)` (not `.to("cpu")`, not `.to(dtype)`)."""
    if not isinstance(expr, ast.Call) or not isinstance(expr.func, ast.Attribute):
        return None
    if expr.func.attr not in _MOVES:
        return None
    args = [*expr.args, *(k.value for k in expr.keywords if k.arg == "device")]
    if expr.func.attr == "to":
        if not args or (isinstance(args[0], ast.Constant) and args[0].value == "cpu"):
            return None
        if (_ast.dotted(args[0]) or "").startswith("torch."):
            return None  # .to(torch.float16): a cast
    return expr.func.value


def _moved_name(expr: ast.AST) -> str | None:
    """The dataset-looking name a GPU move is applied to (through casts and `.data`)."""
    recv = _gpu_move(expr)
    while isinstance(recv, ast.Call) and isinstance(recv.func, ast.Attribute):
        recv = recv.func.value  # x.float().cuda()
    if recv is None:
        return None
    if isinstance(recv, ast.Attribute) and recv.attr in ("data", "targets", "tensors"):
        recv = recv.value
    name = _ast.last_name(recv)
    return name if name is not None and _DATASET.search(name) else None


def check_dataset_on_gpu(ctx: FileContext) -> list[LintFinding]:
    out = []
    for scope in ctx.scopes:
        loops = list(ctx.loops(scope))
        in_loop = {id(n) for lp in loops for n in _ast.walk(lp)} if loops else set()
        for node in ctx.nodes(scope):
            if id(node) in in_loop or not isinstance(node, ast.Call):
                continue
            name = _moved_name(node)
            if name is None or not any(_ast.pos(lp) > _ast.pos(node) for lp in loops):
                continue
            out.append(ctx.finding(
                node, DATASET_ON_GPU,
                f"`{ctx.text(node)}` moves the whole `{name}` to the GPU before the loop",
                "keep it on the CPU and move each batch in the loop: "
                "`x.to(device, non_blocking=True)`",
            ))  # fmt: skip
    return out


def check_tokenizer_padding(ctx: FileContext) -> list[LintFinding]:
    """MF008. A call beside a truncating one in the same function is left alone: that is the
    deliberate untruncated pass that detects (and warns about) truncation."""
    out = []
    for scope in ctx.scopes:
        calls = [
            n for n in ctx.nodes(scope)
            if isinstance(n, ast.Call) and _is_tokenizer_call(n.func)
            and not _ast.has_star_kwargs(n)
        ]  # fmt: skip
        if any(_truncates(c) for c in calls):
            continue
        binds = _bindings([*ctx.nodes(scope), *ctx.nodes(ctx.tree)]) if calls else {}
        for c in calls:
            if _pads(c) and not _fixed_text(c, binds) and not _untruncated_check(ctx, c, scope):
                out.append(_padding_finding(ctx, c))
    return out


def _untruncated_check(ctx: FileContext, call: ast.Call, scope: _ast.Scope) -> bool:
    """`untruncated_ids = tokenizer(prompt, padding="longest")`: the deliberate untruncated
    pass that compares lengths to warn about truncation (the diffusers idiom)."""
    for node in ctx.nodes(scope):
        if isinstance(node, ast.Assign) and any(n is call for n in ast.walk(node.value)):
            names = [n for t in node.targets for n in _ast.target_names(t)]
            return any("untruncated" in n for n in names)
    return False


def _fixed_text(call: ast.Call, binds: dict[str, list[ast.expr]]) -> bool:
    """Whether the text tokenized is written in the file (string literals, through names,
    subscripts and comprehensions): its length is known, nothing is unbounded."""
    text = call.args[0] if call.args else _ast.kwarg(call, "text")
    return text is not None and _literal(text, binds, 0)


def _bindings(nodes: list[ast.AST]) -> dict[str, list[ast.expr]]:
    """Name -> what it is bound to in the function and at module level (a parameter binds an
    unknown value)."""
    out: dict[str, list[ast.expr]] = {}
    for node in nodes:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                for n in _ast.target_names(t):
                    out.setdefault(n, []).append(node.value)
        elif isinstance(node, ast.For | ast.comprehension):
            for n in _ast.target_names(node.target):
                out.setdefault(n, []).append(node.iter)
        elif isinstance(node, ast.arg):
            out.setdefault(node.arg, []).append(ast.Name(id="<parameter>"))
    return out


def _literal(expr: ast.AST, binds: dict[str, list[ast.expr]], depth: int) -> bool:
    if depth > 6:
        return False
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, str)
    if isinstance(expr, ast.List | ast.Tuple):
        return all(_literal(e, binds, depth + 1) for e in expr.elts)
    if isinstance(expr, ast.Subscript):
        return _literal(expr.value, binds, depth + 1)
    if isinstance(expr, ast.ListComp | ast.GeneratorExp):
        return _literal(expr.elt, binds, depth + 1)
    if isinstance(expr, ast.Name):
        values = binds.get(expr.id, [])
        return bool(values) and all(_literal(v, binds, depth + 1) for v in values)
    return False


def _truncates(call: ast.Call) -> bool:
    return _ast.kwarg(call, "truncation") is not None or _ast.kwarg(call, "max_length") is not None


def _pads(call: ast.Call) -> bool:
    padding = _ast.kwarg(call, "padding")
    return isinstance(padding, ast.Constant) and padding.value in _PADDING_ON


def _padding_finding(ctx: FileContext, node: ast.Call) -> LintFinding:
    padding = _ast.kwarg(node, "padding")
    assert isinstance(padding, ast.Constant)
    to = "the model's maximum length" if padding.value == "max_length" else "the longest text"
    return ctx.finding(
            node, PAD_NO_TRUNCATION,
            f"`{ctx.text(node)}` pads to {to} without truncation: one long text sets "
            "the batch's sequence length",
            "add `truncation=True, max_length=N`",
        )  # fmt: skip


def _is_tokenizer_call(func: ast.expr) -> bool:
    name = _ast.last_name(func) or ""
    if isinstance(func, ast.Attribute) and name in _TOKENIZE_METHODS:
        name = _ast.last_name(func.value) or ""
    return "tokenizer" in name.lower() or name == "tok"


def check_pin_memory(ctx: FileContext) -> list[LintFinding]:
    out = []
    for scope in ctx.scopes:
        on_gpu = _gpu_names(ctx, scope)
        for node in ctx.nodes(scope):
            if not isinstance(node, ast.Call) or _ast.call_name(node) != "DataLoader":
                continue
            if not _ast.is_const(_ast.kwarg(node, "pin_memory"), True):
                continue
            dataset = node.args[0] if node.args else _ast.kwarg(node, "dataset")
            if dataset is None or not _holds_gpu(dataset, on_gpu):
                continue
            out.append(ctx.finding(
                node, PIN_GPU_TENSORS,
                f"`{ctx.text(node)}` pins memory for a dataset already on the GPU",
                "drop `pin_memory=True`, or keep the dataset on the CPU",
            ))  # fmt: skip
    return out


def _gpu_names(ctx: FileContext, scope: _ast.Scope) -> set[str]:
    """Names bound in `scope` to a GPU tensor or to a TensorDataset over GPU tensors."""
    out: set[str] = set()
    for node in ctx.nodes(scope):
        if isinstance(node, ast.Assign) and _holds_gpu(node.value, out):
            out |= {n for t in node.targets for n in _ast.target_names(t)}
    return out


def _holds_gpu(expr: ast.AST, on_gpu: set[str]) -> bool:
    if _gpu_move(expr) is not None:
        return True
    if isinstance(expr, ast.Name):
        return expr.id in on_gpu
    if isinstance(expr, ast.Call) and _ast.call_name(expr) == "TensorDataset":
        return any(_holds_gpu(a, on_gpu) for a in expr.args)
    return False
