"""The exit codes every `memfit` verb shares, and the one way a verb reports bad input.

0 success (fits, or no GPU named); 1 does not fit; 2 bad input. Verbs that need more say so in
their own module (`doctor`: 1 findings; `find-batch`: 3 the trial failed; `profile`: 1 the script
failed; a script interrupted with Ctrl-C: 130). Every verb module imports this one, never
`memfit.cli.app`, so the app can import the verbs without a cycle.
"""

from __future__ import annotations

import typer

EXIT_OK = 0
EXIT_DOES_NOT_FIT = 1
EXIT_BAD_INPUT = 2


def fail(message: str) -> typer.Exit:
    """Print `error: MESSAGE` on stderr and return the bad-input exit for the caller to raise
    (`raise fail(...) from None`), so the verb's control flow stays visible at the call site."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(EXIT_BAD_INPUT)
