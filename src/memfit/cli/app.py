"""The `memfit` command: a thin layer over the library (parse, call, render, exit code).

This module only builds the typer app from the verb modules and runs it; each verb lives in its
own module (`estimate`, `plan`, `catalog`, `measure`, `doctor`, `find_batch`), which imports the
shared exit codes from `memfit.cli._exit` and never this module. Exit codes: 0 success (fits, or
no GPU named); 1 does not fit; 2 bad input (see `memfit.cli._exit`).
"""

from __future__ import annotations

import sys

import typer

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


def main() -> None:
    """Entry point of the `memfit` console script (exit 130 on Ctrl-C, as a shell expects)."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
