"""`memfit estimate MODEL`: peak GPU memory of one step, traced on the CPU (no GPU needed).

Exit codes: 0 the estimate fits `--gpu`, or no GPU was named; 1 it does not fit; 2 bad input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from memfit.cli.common.exits import EXIT_DOES_NOT_FIT, EXIT_OK, fail
from memfit.cli.common.pictures import check_picture_paths, write_pictures
from memfit.cli.common.workload_options import (
    AllocConf,
    AsJson,
    Model,
    Task,
    build_workload,
    takes_workload_options,
)
from memfit.cuda.allocator_config import AllocatorConfig
from memfit.errors import MemfitError

AccelerateConfig = Annotated[
    Path | None,
    typer.Option(
        "--accelerate-config",
        help="An accelerate config file: its mixed precision, FSDP2 settings and processes "
        "set the workload (a flag that says otherwise is an error).",
    ),
]


@takes_workload_options()
def estimate_command(
    ctx: typer.Context,
    model: Model,
    workload_options: dict[str, Any],
    accelerate_config: AccelerateConfig = None,
    task: Task = None,
    alloc_conf: AllocConf = None,
    as_json: AsJson = False,
    timeline: Annotated[
        Path | None, typer.Option(help="Write the memory timeline to this .png or .html.")
    ] = None,
    snapshot: Annotated[
        Path | None,
        typer.Option(help="Write a snapshot pytorch.org/memory_viz opens (.pickle) here."),
    ] = None,
) -> None:
    """Estimate peak GPU memory of one training (or inference) step, without a GPU."""
    # The library imports are here, not at the top: they import torch, which `memfit --help`
    # must not (and inside the try, a missing optional dependency is bad input, exit 2).
    try:
        from memfit.estimator import estimate

        if accelerate_config is not None:
            from memfit.integrations.accelerate_config import merge_options

            # typer may vendor click: its ParameterSource is compared by name.
            sources = {n: ctx.get_parameter_source(n) for n in workload_options}
            given = {n for n, src in sources.items() if src is not None and src.name not in (
                "DEFAULT", "DEFAULT_MAP")}  # fmt: skip
            workload_options = merge_options(accelerate_config, workload_options, given)
        w = build_workload(**workload_options)
        check_picture_paths(timeline, snapshot)  # before the estimate, which may take a while
        est = estimate(model, w, task=task, alloc_conf=alloc_conf)
        if timeline is not None or snapshot is not None:
            cfg = AllocatorConfig.from_string(alloc_conf) if alloc_conf else None
            write_pictures(est.profile, timeline, snapshot, config=cfg)
    except (MemfitError, ImportError) as e:
        raise fail(str(e)) from None
    from memfit.report.json import estimate_json
    from memfit.report.text import render_text

    if as_json:
        typer.echo(json.dumps(estimate_json(est), indent=2))
    else:
        Console(highlight=False, soft_wrap=True).print(render_text(est), markup=False)
    raise typer.Exit(EXIT_DOES_NOT_FIT if est.fits is False else EXIT_OK)
