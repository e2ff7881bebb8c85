"""What a lint rule returns (`LintFinding`, with an optional `Edit` for `--fix`) and what it
reads (`FileContext`: one parsed file)."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import cached_property

from memfit.lint import _ast


@dataclass(frozen=True, kw_only=True)
class Edit:
    """Insert `text` at (line, column) of the file: 1-based line, 0-based character column."""

    line: int
    column: int
    text: str


@dataclass(frozen=True, kw_only=True)
class LintFinding:
    """One anti-pattern found in a file, reported as `path:line:col CODE message (fix: ...)`.

    Attributes:
        path: the file, as it was given (or found under a given folder).
        line, column: 1-based position of the flagged expression (column in characters).
        end_line, end_column: where it ends (1-based, exclusive column, as SARIF counts).
        code: the rule's stable code (`MF001`).
        message: what was seen and why it costs memory.
        fix: the change to make, as code where possible.
        edits: the insertions `--fix` applies; empty when the fix is not mechanical and safe.
    """

    path: str
    line: int
    column: int
    end_line: int
    end_column: int
    code: str
    message: str
    fix: str
    edits: tuple[Edit, ...] = ()

    @property
    def fixable(self) -> bool:
        return bool(self.edits)


@dataclass
class FileContext:
    """One parsed file, as the rules see it."""

    path: str
    source: str
    tree: ast.Module
    lines: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.lines = self.source.splitlines()
        self._nodes: dict[int, list[ast.AST]] = {}

    @cached_property
    def scopes(self) -> list[_ast.Scope]:
        """The module and every function in it (walked once per file)."""
        return list(_ast.scopes(self.tree))

    def nodes(self, scope: _ast.Scope) -> list[ast.AST]:
        """Every node of `scope`, not entering nested functions (cached)."""
        key = id(scope)
        if key not in self._nodes:
            self._nodes[key] = list(_ast.walk(scope.body))
        return self._nodes[key]

    def loops(self, scope: _ast.Scope) -> list[_ast.Loop]:
        return [n for n in self.nodes(scope) if isinstance(n, _ast.Loop)]

    def guards(self, scope: _ast.Scope) -> list[tuple[int, int]]:
        """Line ranges of the scope's `with` blocks that decide grad mode."""
        return _ast.guarded_lines_in(self.nodes(scope))

    @cached_property
    def checkpoint_names(self) -> set[str]:
        return _ast.checkpoint_names(self.tree)

    def char_col(self, line: int, byte_col: int) -> int:
        """0-based character column of an `ast` offset (which counts UTF-8 bytes)."""
        if not 1 <= line <= len(self.lines):
            return byte_col
        return len(self.lines[line - 1].encode()[:byte_col].decode(errors="replace"))

    def text(self, node: ast.AST) -> str:
        """The source of `node`, on one line (shortened when long)."""
        src = ast.get_source_segment(self.source, node) or ast.unparse(node)
        src = " ".join(src.split())
        return src if len(src) <= 60 else src[:57] + "..."

    def finding(
        self, node: ast.AST, code: str, message: str, fix: str, edits: tuple[Edit, ...] = ()
    ) -> LintFinding:
        line = getattr(node, "lineno", 1)
        end_line = getattr(node, "end_lineno", None) or line
        end = getattr(node, "end_col_offset", None)
        return LintFinding(
            path=self.path,
            line=line,
            column=self.char_col(line, getattr(node, "col_offset", 0)) + 1,
            end_line=end_line,
            end_column=self.char_col(end_line, end) + 1 if end is not None else 1,
            code=code,
            message=message,
            fix=fix,
            edits=edits,
        )

    def after(self, node: ast.AST, text: str) -> Edit:
        """An edit inserting `text` right after `node`."""
        line = getattr(node, "end_lineno", 1) or 1
        return Edit(line=line, column=self.char_col(line, getattr(node, "end_col_offset", 0)),
                    text=text)  # fmt: skip
