"""Walk files, parse them, run the selected rules, drop what `# noqa` suppresses.

    >>> from memfit.lint import lint_paths
    >>> for f in lint_paths(["train.py"], ignore=["MF004"]):
    ...     print(f.path, f.line, f.code, f.message)

Nothing is imported or run: each file is read and parsed with `ast`. A file that does not parse
is reported as `MF000` (it cannot be checked), which no `--ignore` hides.
"""

from __future__ import annotations

import ast
import fnmatch
import io
import re
import tokenize
from collections.abc import Iterable, Sequence
from pathlib import Path

from memfit.errors import BadInputError
from memfit.lint.finding import FileContext, LintFinding
from memfit.lint.rules import RULES, Rule, selected

SYNTAX_ERROR = "MF000"

#: Folders never walked into (ruff's default exclusions, plus caches).
DEFAULT_EXCLUDE = (
    ".bzr", ".direnv", ".eggs", ".git", ".hg", ".mypy_cache", ".nox", ".pants.d", ".pytest_cache",
    ".ruff_cache", ".svn", ".tox", ".venv", "__pycache__", "__pypackages__", "_build",
    "buck-out", "build", "dist", "node_modules", "site-packages", "venv",
)  # fmt: skip

# `# noqa` alone suppresses every code on its line; `# noqa: MF001, MF002` those codes.
_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", re.I)
_ALL = frozenset({"*"})


def lint_paths(
    paths: Sequence[str | Path],
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    exclude: Sequence[str] = (),
) -> list[LintFinding]:
    """Lint Python files and folders (walked for `*.py`); findings sorted by file and line.

    Args:
        paths: files (linted whatever their suffix) and folders.
        select: rule codes or prefixes to run (`["MF001", "MF00"]`, `["ALL"]`); None: all.
        ignore: codes or prefixes not to run.
        exclude: glob patterns of files or folders to skip (matched against each path and its
            name, as `[tool.memfit.lint] exclude` does).

    Raises:
        BadInputError: a path that does not exist, or an unknown rule code.
    """
    rules = selected(select, ignore)
    return lint_files(collect_files(paths, exclude), rules)


def collect_files(paths: Sequence[str | Path], exclude: Sequence[str] = ()) -> list[Path]:
    """The files to lint: given files as they are, `*.py` under given folders."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise BadInputError(
                f"No such file or folder: {str(raw)!r}. Pass Python files or folders that exist."
            )
        if p.is_dir():
            out.extend(f for f in sorted(p.rglob("*.py")) if not _excluded(f, p, exclude))
        elif not _excluded(p, p.parent, exclude):
            out.append(p)
    return list(dict.fromkeys(out))


def _excluded(path: Path, base: Path, patterns: Sequence[str]) -> bool:
    parts = path.relative_to(base).parts if path.is_relative_to(base) else path.parts
    if any(part in DEFAULT_EXCLUDE for part in parts[:-1]):
        return True
    text = path.as_posix()
    return any(
        fnmatch.fnmatch(text, pat) or fnmatch.fnmatch(text, f"*/{pat}")
        or any(fnmatch.fnmatch(part, pat) for part in path.parts)
        for pat in patterns
    )  # fmt: skip


def lint_files(files: Iterable[Path], rules: Sequence[Rule] = RULES) -> list[LintFinding]:
    out: list[LintFinding] = []
    for f in files:
        try:
            source = f.read_bytes()
        except OSError as e:
            raise BadInputError(f"Cannot read {str(f)!r}: {e.strerror}.") from None
        out.extend(lint_source(source, str(f), rules))
    return out


def lint_source(
    source: str | bytes, path: str = "<string>", rules: Sequence[Rule] = RULES
) -> list[LintFinding]:
    """Lint one file's text (bytes honour a coding cookie); `path` is what findings name."""
    text = source if isinstance(source, str) else _decode(source)
    try:
        tree = ast.parse(source, filename=path)
    except (SyntaxError, ValueError) as e:
        return [_syntax_finding(path, e)]
    ctx = FileContext(path=path, source=text, tree=tree)
    noqa = noqa_lines(text)
    found = [f for rule in rules for f in rule.check(ctx) if not _suppressed(f, noqa)]
    return sorted(found, key=lambda f: (f.line, f.column, f.code))


def _decode(source: bytes) -> str:
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
        return source.decode(encoding)
    except (SyntaxError, UnicodeDecodeError, LookupError):
        return source.decode("utf-8", errors="replace")


def _syntax_finding(path: str, e: SyntaxError | ValueError) -> LintFinding:
    line = getattr(e, "lineno", None) or 1
    col = getattr(e, "offset", None) or 1
    msg = getattr(e, "msg", None) or str(e)
    return LintFinding(
        path=path, line=line, column=col, end_line=line, end_column=col, code=SYNTAX_ERROR,
        message=f"cannot parse this file ({msg}), so no rule checked it",
        fix="fix the syntax (the lint reads Python 3), or exclude the file with "
        "`exclude` in [tool.memfit.lint]",
    )  # fmt: skip


def noqa_lines(text: str) -> dict[int, frozenset[str]]:
    """Line -> the codes its `# noqa` comment suppresses (`{"*"}` for a bare `# noqa`)."""
    out: dict[int, frozenset[str]] = {}
    try:
        comments = [
            (t.start[0], t.string)
            for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type == tokenize.COMMENT
        ]
    except (tokenize.TokenError, SyntaxError):
        comments = [(i, line) for i, line in enumerate(text.splitlines(), 1) if "#" in line]
    for line, comment in comments:
        m = _NOQA.search(comment)
        if m is not None:
            codes = m["codes"]
            out[line] = _ALL if codes is None else frozenset(re.split(r"[\s,]+", codes.upper()))
    return out


def _suppressed(f: LintFinding, noqa: dict[int, frozenset[str]]) -> bool:
    """A `# noqa` on the first or the last line of the flagged expression suppresses it."""
    for line in {f.line, f.end_line}:
        codes = noqa.get(line)
        if codes is not None and (codes is _ALL or f.code in codes):
            return True
    return False
