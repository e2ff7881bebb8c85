"""`memfit profile SCRIPT -- ARGS` and `memfit compare A.json B.json`: reports of measured memory.

`profile` runs a training script under `memfit.measure` (CUDA statistics when the script uses
a GPU, memfit's tracker over real tensors everywhere) and prints the same report as an
estimate; `--timeline` draws it, `--snapshot` writes what pytorch.org/memory_viz opens.
Exit codes: 0 success; 1 the script failed (its traceback, then the report up to then), or
for `compare --fail-above`, a difference over its limit; 2 bad input.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from memfit.cli.common.exits import EXIT_OK, fail
from memfit.cli.common.pictures import check_picture_paths, said_snapshot, write_pictures
from memfit.cli.common.script import check_script
from memfit.errors import BadInputError, MemfitError
from memfit.measurement.script_runner import ScriptFailed, run_script
from memfit.report.compare import (
    check_limits,
    compare,
    load_report,
    render_comparison,
    render_limit_check,
)
from memfit.units import format_bytes

EXIT_SCRIPT_FAILED = 1
#: `compare --fail-above`: a difference is over its limit.
EXIT_OVER_LIMIT = 1


def profile_command(
    script: Annotated[Path, typer.Argument(help="The training script, as run with `python`.")],
    args: Annotated[
        list[str] | None, typer.Argument(help="Arguments for the script, after `--`.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON report.")] = False,
    timeline: Annotated[
        Path | None, typer.Option(help="Write the memory timeline to this .png or .html.")
    ] = None,
    snapshot: Annotated[
        Path | None, typer.Option(help="Write a memory_viz snapshot (.pickle) here.")
    ] = None,
) -> None:
    """Run a training script and measure its memory (GPU when it uses one, else CPU)."""
    # Here, not at the top: these import torch, which `memfit --help` must not.
    from memfit.measurement.measure import measure
    from memfit.report.json import profile_json

    try:
        check_picture_paths(timeline, snapshot)  # before the script runs
        check_script(script)
    except MemfitError as e:
        raise fail(str(e)) from None
    failure: ScriptFailed | None = None
    out = contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext()
    cm = measure(record_history=snapshot is not None)
    try:
        with out:
            run_script(script, args or [], wrap=cm)
    except ScriptFailed as e:
        failure = e
    except (MemfitError, ImportError) as e:
        raise fail(str(e)) from None
    m = cm
    if failure is not None:
        typer.echo(failure.traceback, err=True, nl=False)
        typer.echo(f"error: {failure}; the report covers the run up to the failure.", err=True)
    profile = m.profile
    assert profile is not None  # set when the measured block exits
    if snapshot is not None and m.cuda_snapshot is not None:
        import pickle

        with open(snapshot, "wb") as f:  # the allocator's own history, not a simulation
            pickle.dump(m.cuda_snapshot, f)
        said_snapshot(snapshot)
        snapshot = None
    try:
        write_pictures(profile, timeline, snapshot)
    except (MemfitError, ImportError) as e:
        raise fail(str(e)) from None
    if as_json:
        data = profile_json(profile, source="measured", device=m.device)
        data["steps"] = m.steps
        data["script"] = str(script)
        typer.echo(json.dumps(data, indent=2))
    else:
        typer.echo(render_measured(m, str(script)))
    raise typer.Exit(EXIT_SCRIPT_FAILED if failure is not None else EXIT_OK)


def render_measured(m: Any, what: str) -> str:
    """The terminal report of a measurement."""
    # Here, not at the top: it imports torch, which `memfit --help` must not.
    from memfit.report.text import category_lines, grouped_modules

    p = m.profile
    lines = [f"{what}: measured on {m.device}, {m.steps} optimizer step(s)", ""]
    lines.append(f"  {'peak allocated':<22}{format_bytes(p.peak_allocated_bytes):>14}")
    if m.cuda_max_allocated is not None:
        lines.append(
            f"  {'max_memory_allocated':<22}{format_bytes(m.cuda_max_allocated):>14}   (CUDA)"
        )
        lines.append(f"  {'max_memory_reserved':<22}{format_bytes(m.cuda_max_reserved):>14}")
        lines.append(f"  {'device used':<22}{format_bytes(m.cuda_device_used):>14}   (nvidia-smi)")
    lines.append("")
    lines.append(
        f"peak during {p.peak_phase} of step {p.peak_step}, at op {p.peak_op} in "
        f"{p.peak_module or '<top>'}"
    )
    lines.append("")
    lines.append("at the peak, by category:")
    lines += category_lines(p)
    lines.append("")
    lines.append("at the peak, by module:")
    for mod, b in list(grouped_modules(p.modules_at_depth(3)).items())[:8]:
        lines.append(f"  {mod:<40}{format_bytes(b):>14}")
    return "\n".join(lines)


def _category_limits(values: list[str]) -> tuple[float | None, dict[str, float]]:
    """`--fail-above-category 10 --fail-above-category activations=5` as (10.0, {...})."""
    every: float | None = None
    named: dict[str, float] = {}
    for text in values:
        name, _, pct = text.rpartition("=")
        try:
            value = float(pct)
        except ValueError:
            raise BadInputError(
                f"--fail-above-category {text!r}: write a percentage (10) or CATEGORY=PERCENT "
                "(activations=5)."
            ) from None
        if name:
            named[name.strip()] = value
        else:
            every = value
    return every, named


def compare_command(
    first: Annotated[Path, typer.Argument(help="A report (memfit estimate/profile --json).")],
    second: Annotated[Path, typer.Argument(help="The report to compare it with.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the differences as JSON.")] = False,
    fail_above: Annotated[
        float | None,
        typer.Option(
            "--fail-above",
            min=0,
            metavar="PCT",
            help="Exit 1 when a total (peak allocated, reserved, device total) differs from the "
            "first report by more than PCT percent of it: a CI gate.",
        ),
    ] = None,
    fail_above_category: Annotated[
        list[str] | None,
        typer.Option(
            "--fail-above-category",
            metavar="[CATEGORY=]PCT",
            help="Exit 1 when a category at the peak differs by more than PCT percent: every "
            "category (10), or one (activations=5); repeat it for several.",
        ),
    ] = None,
) -> None:
    """Compare two memory reports (estimate vs measured, or before vs after) per category.

    A CI gate with --fail-above: exit 1 past a limit, in % of the first report; 2 bad input.
    """
    # A value missing from a report is listed as not checked (never passed silently).
    try:
        a, b = load_report(first), load_report(second)
        every, named = _category_limits(fail_above_category or [])
        c = compare(a, b, labels=(first.stem, second.stem))
        check = check_limits(c, total_pct=fail_above, category_pct=every, per_category=named)
    except MemfitError as e:
        raise fail(str(e)) from None
    gated = fail_above is not None or bool(fail_above_category)
    if as_json:
        rows = {r.name: {"a": r.a, "b": r.b, "diff": r.diff, "relative": r.relative}
                for r in [*c.totals, *c.categories]}  # fmt: skip
        out: dict[str, Any] = {"a": str(first), "b": str(second), "rows": rows,
                               "notes": list(c.notes)}  # fmt: skip
        if gated:
            out["over_limit"] = [{"name": r.name, "limit_pct": pct} for r, pct in check.over]
            out["not_checked"] = [r.name for r in check.unchecked]
            out["passed"] = check.passed
        typer.echo(json.dumps(out, indent=2))
    else:
        typer.echo(render_comparison(c))
        if gated:
            typer.echo("")
            typer.echo(render_limit_check(check, (first.stem, second.stem)))
    raise typer.Exit(EXIT_OK if check.passed else EXIT_OVER_LIMIT)
