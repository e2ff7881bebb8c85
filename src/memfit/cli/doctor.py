"""`memfit doctor SCRIPT -- ARGS`: run a training script and report its memory anti-patterns.

Registered by `memfit.cli.app` (`app.command("doctor")(doctor_command)`). Exit codes: 0 no finding;
1 findings, or the script failed (its traceback is printed, then what was seen up to then);
2 bad input (no such script); 130 the script was interrupted (Ctrl-C), after the report of what
was seen up to then.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from memfit.cli.common.exits import EXIT_OK, fail
from memfit.cli.common.script import check_script
from memfit.errors import MemfitError
from memfit.measurement.script_runner import EXIT_INTERRUPTED, ScriptFailed, run_script

#: Exit status when the doctor found something or the script failed (0 and 2:
#: memfit.cli.common.exits).
EXIT_FINDINGS = 1


def doctor_command(
    script: Annotated[Path, typer.Argument(help="The training script, as run with `python`.")],
    args: Annotated[
        list[str] | None, typer.Argument(help="Arguments for the script, after `--`.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the findings as JSON.")] = False,
) -> None:
    """Run a training script and find memory anti-patterns (graphs kept alive, growth, ...)."""
    # Here, not at the top: these import torch, which `memfit --help` must not.
    from memfit.diagnosis.doctor import doctor
    from memfit.diagnosis.findings_text import findings_to_json, render_findings

    try:
        check_script(script)  # a syntax error is bad input, not a finding
    except MemfitError as e:
        raise fail(str(e)) from None
    dr = doctor()
    failure: ScriptFailed | None = None
    # With --json, stdout is the report: the script's own prints go to stderr.
    out = contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext()
    try:
        with out:
            run_script(script, args or [], wrap=dr)
    except ScriptFailed as e:
        failure = e
    except MemfitError as e:
        raise fail(str(e)) from None
    interrupted = failure is not None and isinstance(failure.exception, KeyboardInterrupt)
    if interrupted:
        typer.echo("interrupted (Ctrl-C); the report covers the run up to then.", err=True)
    elif failure is not None:
        typer.echo(failure.traceback, err=True, nl=False)
        typer.echo(f"error: {failure}; the report covers the run up to the failure.", err=True)
    findings = dr.findings
    if as_json:
        error = failure.traceback if failure is not None else None
        typer.echo(json.dumps(findings_to_json(findings, dr.steps, str(script), error), indent=2))
    else:
        typer.echo(render_findings(findings, dr.steps))
    if interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)
    raise typer.Exit(EXIT_FINDINGS if findings or failure is not None else EXIT_OK)
