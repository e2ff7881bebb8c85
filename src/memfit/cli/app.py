"""The `memfit` command: a thin layer over the library (parse, call, render, exit code).

This module only builds the typer app from the verb modules and runs it; each verb lives in its
own module (`estimate`, `plan`, `catalog`, `measure`, `doctor`, `find_batch`), which imports the
shared exit codes from `memfit.cli.common.exits` and never this module. Exit codes: 0 success
(fits, or
no GPU named); 1 does not fit; 2 bad input (see `memfit.cli.common.exits`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Annotated

import typer

from memfit._compat import quiet_imports
from memfit.cli.cache import cache_command
from memfit.cli.catalog import gpus_command, models_command
from memfit.cli.data import data_command
from memfit.cli.doctor import doctor_command
from memfit.cli.estimate import estimate_command
from memfit.cli.find_batch import find_batch_command
from memfit.cli.lint import lint_command
from memfit.cli.measure import compare_command, profile_command
from memfit.cli.plan import max_batch_command, max_seq_command, plan_command
from memfit.cli.serve import serve_command

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="memfit: peak GPU memory of PyTorch training and inference, estimated on a CPU.",
)


def _version(value: bool) -> None:
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    import torch

    from memfit._compat import transformers_version

    try:
        mine = version("memfit")
    except PackageNotFoundError:  # run from a source tree that was not installed
        mine = "(not installed)"
    tf = transformers_version()
    typer.echo(
        f"memfit {mine} (torch {torch.__version__}, "
        f"transformers {tf if tf is not None else 'not installed'})"
    )
    raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_version,
            is_eager=True,
            help="Print memfit's version and the torch and transformers it runs with.",
        ),
    ] = False,
) -> None:
    """memfit: peak GPU memory of PyTorch training and inference, estimated on a CPU."""


# In the order `memfit --help` lists them.
app.command("estimate")(estimate_command)
app.command("plan")(plan_command)
app.command("max-batch")(max_batch_command)
app.command("max-seq")(max_seq_command)
app.command("serve")(serve_command)
app.command("models")(models_command)
app.command("gpus")(gpus_command)
app.command("profile")(profile_command)
app.command("compare")(compare_command)
app.command("doctor")(doctor_command)
app.command("find-batch")(find_batch_command)
app.command("lint")(lint_command)
app.command("data")(data_command)
app.command("cache")(cache_command)


#: Commands that run no code of the user's: their process ends without the interpreter's
#: teardown (about 0.3 s of freeing torch's and transformers' objects), once everything they
#: print is flushed; their files are written and closed before they return. `doctor`,
#: `profile` and `find-batch` run the user's script, whose open files and exit handlers need
#: the normal exit.
FAST_EXIT = frozenset(
    {"estimate", "plan", "max-batch", "max-seq", "serve", "models", "gpus", "compare", "lint",
     "data", "cache"}
)  # fmt: skip


def main() -> None:
    """Entry point of the `memfit` console script (exit 130 on Ctrl-C, as a shell expects).

    Commands that run no code of the user's import the libraries quietly (their import-time
    log lines concern those libraries, not the user's run: `memfit._compat.quiet_imports`)."""
    verb = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    quiet = quiet_imports() if verb in FAST_EXIT else contextlib.nullcontext()
    try:
        with quiet:
            app()
    except KeyboardInterrupt:
        sys.exit(130)
    except SystemExit as done:
        if verb not in FAST_EXIT:
            raise
        code = done.code
        if not isinstance(code, int):  # None is success; a message is printed, then 1
            if code is not None:
                print(code, file=sys.stderr)
            code = 0 if code is None else 1
        for stream in (sys.stdout, sys.stderr):
            # A closed pipe (`| head`) has nothing more to take.
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


if __name__ == "__main__":
    main()
