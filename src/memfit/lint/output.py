"""Renderers of lint findings: ruff-style text, JSON, and SARIF 2.1.0 for code-scanning UIs.

Text, one line per finding: `path:line:col CODE message (fix: ...)`, then a summary line.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from memfit.lint.engine import SYNTAX_ERROR
from memfit.lint.finding import LintFinding
from memfit.lint.rules import BY_CODE, RULES

#: The SARIF version and schema these documents follow (OASIS SARIF 2.1.0).
SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
DOCS = "docs/lint.md"
JSON_VERSION = 1


def render_text(findings: list[LintFinding], files: int) -> str:
    lines = [f"{f.path}:{f.line}:{f.column} {f.code} {f.message} (fix: {f.fix})" for f in findings]
    lines.append(summary(findings, files))
    return "\n".join(lines)


def summary(findings: list[LintFinding], files: int) -> str:
    checked = f"{files} file{'s' if files != 1 else ''}"
    if not findings:
        return f"No findings in {checked}."
    by_code = Counter(f.code for f in findings)
    counts = ", ".join(f"{c} x{n}" for c, n in sorted(by_code.items()))
    fixable = sum(f.fixable for f in findings)
    tail = f"; {fixable} fixable with --fix" if fixable else ""
    n = len(findings)
    return f"Found {n} finding{'s' if n != 1 else ''} in {checked} ({counts}){tail}."


def to_json(findings: list[LintFinding], files: int) -> dict[str, Any]:
    """The JSON report: `{"version", "files", "findings": [...]}`, one object per finding."""
    return {
        "version": JSON_VERSION,
        "files": files,
        "findings": [
            {
                "path": f.path,
                "line": f.line,
                "column": f.column,
                "end_line": f.end_line,
                "end_column": f.end_column,
                "code": f.code,
                "rule": _rule_name(f.code),
                "message": f.message,
                "fix": f.fix,
                "fixable": f.fixable,
            }
            for f in findings
        ],
    }


def _rule_name(code: str) -> str:
    return BY_CODE[code].name if code in BY_CODE else "syntax-error"


def to_sarif(findings: list[LintFinding], version: str) -> dict[str, Any]:
    """A SARIF 2.1.0 log with one run; paths are relative to the current folder when under it
    (`%SRCROOT%`), as GitHub code scanning expects."""
    rules = [
        {
            "id": r.code,
            "name": r.name,
            "shortDescription": {"text": r.summary},
            "helpUri": f"{DOCS}#{r.code.lower()}",
            "defaultConfiguration": {"level": "warning"},
        }
        for r in RULES
    ]
    rules.append({
        "id": SYNTAX_ERROR, "name": "syntax-error",
        "shortDescription": {"text": "a file that does not parse (no rule checked it)"},
        "defaultConfiguration": {"level": "error"},
    })  # fmt: skip
    index = {r["id"]: i for i, r in enumerate(rules)}
    results = [_sarif_result(f, index[f.code]) for f in findings]
    driver = {"name": "memfit-lint", "version": version, "informationUri": DOCS, "rules": rules}
    return {
        "$schema": SARIF_SCHEMA,
        "version": SARIF_VERSION,
        "runs": [{"tool": {"driver": driver}, "results": results}],
    }


def _sarif_result(f: LintFinding, rule_index: int) -> dict[str, Any]:
    uri, base = _uri(f.path)
    location: dict[str, Any] = {"uri": uri}
    if base:
        location["uriBaseId"] = base
    return {
        "ruleId": f.code,
        "ruleIndex": rule_index,
        "level": "error" if f.code == SYNTAX_ERROR else "warning",
        "message": {"text": f"{f.message} (fix: {f.fix})"},
        "locations": [{
            "physicalLocation": {
                "artifactLocation": location,
                "region": {
                    "startLine": f.line, "startColumn": f.column,
                    "endLine": f.end_line, "endColumn": f.end_column,
                },
            }
        }],
    }  # fmt: skip


def _uri(path: str) -> tuple[str, str | None]:
    p = Path(path)
    try:
        return p.resolve().relative_to(Path.cwd().resolve()).as_posix(), "%SRCROOT%"
    except ValueError:
        return p.resolve().as_uri(), None
