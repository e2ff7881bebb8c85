"""Renderers of `memfit.doctor` findings: terminal lines and JSON for scripts."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from memfit.diagnosis.findings import Finding
from memfit.units import format_bytes


def _where(f: Finding) -> str:
    if f.filename is None:
        return "<unknown>"
    name = f.filename
    if not os.path.relpath(name).startswith(".."):
        name = os.path.relpath(name)
    return f"{name}:{f.lineno}"


#: Said when no step boundary was seen: the checks that compare steps did not run.
NO_STEPS = (
    "0 step boundaries: the doctor watches optimizer.step() \u2014 call dr.step() in loops "
    "without one (`with memfit.doctor() as dr:` around the loop). Graphs kept alive and growth "
    "are only found across steps."
)


def render_findings(findings: list[Finding], steps: int) -> str:
    """One `file:line: kind (bytes) message` line per finding, then its fix, indented."""
    if not findings:
        if steps == 0:
            return f"memfit doctor: {NO_STEPS}"
        return f"memfit doctor: no memory anti-patterns found ({steps} steps watched)."
    lines = [f"memfit doctor: {len(findings)} finding(s) in {steps} steps"]
    for f in findings:
        lines.append(f"{_where(f)}: {f.kind} ({format_bytes(f.bytes)}) {f.message}")
        lines.append(f"    fix: {f.fix}")
    if steps == 0:
        lines.append(f"note: {NO_STEPS}")
    return "\n".join(lines)


def findings_to_json(
    findings: list[Finding], steps: int, script: str, error: str | None = None
) -> dict[str, Any]:
    """The JSON of `memfit doctor --json`: integer bytes, absolute file names."""
    return {
        "script": script,
        "steps": steps,
        "findings": [dataclasses.asdict(f) for f in findings],
        "script_error": error,
    }
