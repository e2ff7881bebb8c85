"""The optimizer table (memfit.optimizers) is the only place in the package that names an
optimizer: every other module reads its rows, so a new row reaches them all (issue 30)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from memfit.optimizers import NO_OPTIMIZER, OPTIMIZERS, SPECS

SRC = Path(__file__).resolve().parents[1] / "src" / "memfit"
TABLE = SRC / "optimizers"
NAMES = sorted(set(OPTIMIZERS) - {NO_OPTIMIZER}, key=len, reverse=True)
HF_NAMES = {o for s in SPECS.values() for o in s.hf_optim}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _named(text: str) -> list[str]:
    """The optimizer names `text` spells as a value: the whole string, or quoted in it."""
    if text in NAMES or text in HF_NAMES:
        return [text]
    return [n for n in NAMES if re.search(rf"""['"]{re.escape(n)}['"]""", text)]


def test_no_module_outside_the_table_names_an_optimizer() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if TABLE in path.parents:
            continue
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            text = node.value if isinstance(node, ast.Constant) else None
            if isinstance(text, str) and id(node) not in docs and (hits := _named(text)):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {hits}")
    assert not found, "optimizer names outside memfit.optimizers:\n" + "\n".join(found)


def test_the_scan_finds_a_name() -> None:
    # The check above can fail: a quoted name in a message and a bare name are both found.
    assert _named("use optimizer='adamw' instead") == ["adamw"]
    assert _named("adafactor") == ["adafactor"]
    assert _named("Adafactor's factored rows") == []
