"""Names that docstrings and comments cite resolve: `memfit.a.b.c` and the same written without
the `memfit.` prefix (`estimator.trace.tracker.Tracker`), and module names cited as
`module.attribute` name a module that still exists. A reference to a renamed or removed module
fails here instead of misleading a reader."""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path

import memfit

SRC = Path(memfit.__file__).parent
PACKAGES = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
MODULES = {p.stem for p in SRC.rglob("*.py")} | PACKAGES
#: Module names of the past, cited as `name.attribute`, that no longer exist.
FORMER = {"tracer", "generation_oracle", "quantize_trace", "quantize_layouts", "quantize_read",
          "quantize_real", "distillation_trace", "hardware_render", "_workload_options",
          "trace_errors", "trace_cache", "memory_model", "simulator"}  # fmt: skip


def _resolves(ref: str) -> bool:
    parts = ref.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _prose(path: Path) -> list[tuple[int, str]]:
    """The comments and docstrings of a module, as (line number, text) pairs."""
    text = path.read_text()
    out = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                out += [(value.lineno + i, line) for i, line in enumerate(value.value.split("\n"))]
    return out


def test_cited_names_resolve() -> None:
    dotted = re.compile(
        r"(?<![\w./])((?:memfit\.)?(?:" + "|".join(sorted(PACKAGES)) + r")(?:\.\w+)+)"
    )
    former = re.compile(r"(?<![\w.])(" + "|".join(sorted(FORMER)) + r")\.\w")
    bad = []
    for path in SRC.rglob("*.py"):
        for n, line in _prose(path):
            for m in dotted.finditer(line):
                ref = m.group(1).rstrip(".")
                full = ref if ref.startswith("memfit.") else f"memfit.{ref}"
                if len(full.split(".")) < 3 or full.split(".")[2] not in MODULES:
                    continue  # a variable named like a package (`workload.gpu`)
                if not _resolves(full):
                    bad.append(f"{path.relative_to(SRC)}:{n}: {ref}")
            bad += [f"{path.relative_to(SRC)}:{n}: {m.group(0)}.." for m in former.finditer(line)]
    assert not bad, "stale references:\n" + "\n".join(bad)
