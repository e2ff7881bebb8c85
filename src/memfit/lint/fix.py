"""`--fix`: apply the edits of fixable findings (insertions such as `loss` -> `loss.item()`).

Only rules whose fix is mechanical and keeps the program's meaning attach edits (MF001 when
what is stored is the loss itself, by name). Edits are applied from the end of the file
backwards, so earlier positions stay valid; the same edit twice is applied once.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from memfit.lint.finding import Edit, LintFinding


def apply_edits(source: str, edits: Iterable[Edit]) -> str:
    """`source` with every edit inserted (line 1-based, column 0-based in characters)."""
    lines = source.splitlines(keepends=True)
    for e in sorted(set(edits), key=lambda e: (e.line, e.column), reverse=True):
        if not 1 <= e.line <= len(lines):
            continue
        line = lines[e.line - 1]
        lines[e.line - 1] = line[: e.column] + e.text + line[e.column :]
    return "".join(lines)


def fix_files(findings: Iterable[LintFinding]) -> dict[str, int]:
    """Rewrite each file with its findings' edits; return file -> findings fixed."""
    by_file: dict[str, list[LintFinding]] = {}
    for f in findings:
        if f.fixable:
            by_file.setdefault(f.path, []).append(f)
    fixed = {}
    for path, found in by_file.items():
        p = Path(path)
        try:
            text = p.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue  # not UTF-8: left as it is, its findings stay reported
        new = apply_edits(text, (e for f in found for e in f.edits))
        with p.open("w", encoding="utf-8", newline="") as out:  # line endings kept as read
            out.write(new)
        fixed[path] = len(found)
    return fixed
