"""`memfit lint PATH...`: static checks for memory anti-patterns in PyTorch training code.

Registered by `memfit.cli.app` (`app.command("lint")(lint_command)`). Exit codes: 0 no finding;
1 findings (after `--fix`, those it could not fix); 2 bad input (a missing path, an unknown rule
code, a bad `[tool.memfit.lint]` table).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from memfit.cli.common.exits import EXIT_OK, fail
from memfit.errors import BadInputError

if TYPE_CHECKING:
    from memfit.lint.finding import LintFinding

#: Exit status when findings remain (0 and 2: memfit.cli.common.exits).
EXIT_FINDINGS = 1


def _codes(value: str | None) -> list[str] | None:
    return None if value is None else [c for c in value.split(",") if c.strip()]


def lint_command(
    paths: Annotated[
        list[Path], typer.Argument(help="Python files or folders (folders are walked for *.py).")
    ],
    select: Annotated[
        str | None,
        typer.Option(help="Comma-separated rule codes or prefixes to run (MF001,MF00,ALL)."),
    ] = None,
    ignore: Annotated[
        str | None, typer.Option(help="Comma-separated rule codes or prefixes not to run.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the findings as JSON.")] = False,
    sarif: Annotated[
        bool, typer.Option("--sarif", help="Print a SARIF 2.1.0 log (for code-scanning UIs).")
    ] = False,
    fix: Annotated[
        bool, typer.Option("--fix", help="Apply the mechanical, safe fixes in place.")
    ] = False,
) -> None:
    """Find memory anti-patterns in training code without running it (codes MF001-MF009).

    Settings come from [tool.memfit.lint] in the nearest pyproject.toml (select, ignore,
    exclude); --select and --ignore replace the values there. Silence one line with
    `# noqa: MF001`.
    """
    # Here, not at the top: `memfit --help` stays fast.
    from memfit.lint.config import find_config
    from memfit.lint.engine import collect_files, lint_files
    from memfit.lint.fix import fix_files
    from memfit.lint.rules import selected

    if as_json and sarif:
        raise fail("--json and --sarif both given; pick one output format.")
    try:
        config = find_config(Path.cwd())
        rules = selected(
            _codes(select) if select is not None else config.select,
            _codes(ignore) if ignore is not None else config.ignore,
            options=("--select" if select is not None else "select in [tool.memfit.lint]",
                     "--ignore" if ignore is not None else "ignore in [tool.memfit.lint]"),
        )  # fmt: skip
        files = collect_files(paths, config.exclude)
        findings = lint_files(files, rules)
        if fix and any(f.fixable for f in findings):
            fixed = fix_files(findings)
            typer.echo(f"Fixed {sum(fixed.values())} finding(s) in {len(fixed)} file(s).",
                       err=True)  # fmt: skip
            findings = lint_files(files, rules)
    except BadInputError as e:
        raise fail(str(e)) from None
    _print(findings, len(files), as_json, sarif)
    raise typer.Exit(EXIT_FINDINGS if findings else EXIT_OK)


def _print(findings: list[LintFinding], files: int, as_json: bool, sarif: bool) -> None:
    from memfit.lint.output import render_text, to_json, to_sarif

    if sarif:
        typer.echo(json.dumps(to_sarif(findings, _version()), indent=2))
    elif as_json:
        typer.echo(json.dumps(to_json(findings, files), indent=2))
    else:
        typer.echo(render_text(findings, files))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("memfit")
    except PackageNotFoundError:
        return "unknown"
