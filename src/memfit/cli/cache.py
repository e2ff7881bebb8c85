"""`memfit cache`: where memfit keeps traces and plans, how much, and `--clear` to empty it.

The cache itself is memfit.estimator.trace.cache (location, keys, what is stored).
"""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from memfit.cli.common.exits import fail
from memfit.errors import BadInputError
from memfit.units import format_bytes


def cache_command(
    clear: Annotated[
        bool, typer.Option("--clear", help="Remove every cached trace and plan.")
    ] = False,
) -> None:
    """Where memfit caches traces and plans, and how much it holds (--clear empties it)."""
    # Here, not at the top: trace_cache reads the installed packages' versions.
    from memfit.estimator import trace_cache

    try:
        _show_or_clear(trace_cache, clear)
    except BadInputError as e:
        raise fail(str(e)) from None


def _show_or_clear(trace_cache: Any, clear: bool) -> None:
    root = trace_cache.cache_dir()
    if clear:
        n = trace_cache.clear()
        typer.echo(f"removed {n} cached file{'s' * (n != 1)} from {root}")
        return
    files = trace_cache.entries(root)
    by_kind: dict[str, list[int]] = {}
    for p, size in files:
        by_kind.setdefault(p.parent.name, []).append(size)
    off = f"off (MEMFIT_NO_CACHE={os.environ.get('MEMFIT_NO_CACHE')})"
    state = "on" if trace_cache.enabled() else off
    typer.echo(f"memfit cache: {root} ({state}; at most "
               f"{format_bytes(trace_cache.max_bytes())}, oldest removed first)")  # fmt: skip
    for kind in ("traces", "plans"):
        sizes = by_kind.get(kind, [])
        typer.echo(f"  {kind:7} {len(sizes):5} files  {format_bytes(sum(sizes)):>12}")
