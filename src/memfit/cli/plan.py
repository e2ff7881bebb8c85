"""`memfit plan`, `memfit max-batch`, `memfit max-seq`: searches for what fits a given GPU.

`plan` looks for the fastest configuration that fits, keeping the global batch and sequence
length; `max-batch` and `max-seq` look for the largest micro-batch or sequence length that fits
one configuration. Exit codes: 0 something fits; 1 nothing does; 2 bad input.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from memfit.cli.common.exits import EXIT_DOES_NOT_FIT, EXIT_OK, fail
from memfit.cli.common.workload_options import (
    DEFAULT,
    AllocConf,
    AsJson,
    Gpu,
    Gpus,
    HostMemory,
    ImageSize,
    Model,
    NoCache,
    Seq,
    Task,
    Teacher,
    build_workload,
    skip_cache,
    takes_workload_options,
)
from memfit.errors import MemfitError
from memfit.workload import Workload


def _split(values: list[str] | None) -> tuple[str, ...]:
    """`--allow a,b --allow c` as ("a", "b", "c")."""
    return tuple(v.strip() for item in values or [] for v in item.split(",") if v.strip())


def plan_command(
    model: Model,
    gpu: Gpu,
    global_batch: Annotated[
        int, typer.Option("--global-batch", help="Samples per optimizer step (kept).")
    ] = 8,
    seq: Seq = DEFAULT.seq_len,
    image_size: ImageSize = DEFAULT.image_size,
    gpus: Gpus = DEFAULT.gpus,
    # Not the Workload options: here they are optional, and a value pins what the planner
    # would otherwise choose.
    precision: Annotated[
        str | None, typer.Option(help="Keep this precision (default: the planner chooses).")
    ] = None,
    optimizer: Annotated[
        str | None, typer.Option(help="Keep this optimizer (default: the planner chooses).")
    ] = None,
    allow: Annotated[
        list[str] | None,
        typer.Option(
            help="Also allow a technique (lora, qlora, tied-embeddings, pure-precision, "
            "quantized-teacher, offline-logits)."
        ),
    ] = None,
    forbid: Annotated[list[str] | None, typer.Option(help="Never use a technique.")] = None,
    task: Task = None,
    host_memory: HostMemory = None,
    teacher: Teacher = None,
    as_json: AsJson = False,
    no_cache: NoCache = False,
) -> None:
    """The fastest configuration that fits GPU, keeping the global batch and sequence length."""
    skip_cache(no_cache)
    try:
        # Here, not at the top: these import torch, which `memfit --help` must not.
        from memfit.planner.search import Goal, plan

        goal = Goal(
            global_batch=global_batch, seq_len=seq, image_size=image_size,
            precision=precision, optimizer=optimizer, teacher=teacher,
        )  # fmt: skip
        if host_memory is not None:
            Workload(host_memory=host_memory)  # a bad size fails here, naming the form
        result = plan(
            model, gpu=gpu, goal=goal, n_gpus=gpus, allow=_split(allow), forbid=_split(forbid),
            task=task, host_memory=host_memory,
        )  # fmt: skip
    except (MemfitError, ImportError) as e:
        raise fail(str(e)) from None
    from memfit.planner.plan_text import plan_to_json, render_plan

    if as_json:
        typer.echo(json.dumps(plan_to_json(result), indent=2))
    else:
        typer.echo(render_plan(result))
    raise typer.Exit(EXIT_OK if result.best is not None else EXIT_DOES_NOT_FIT)


def _progress_line(generate: bool) -> Any:
    """A line on stderr per value `max_seq` traces (each can take seconds)."""
    from memfit.units import format_bytes

    name = "prompt" if generate else "sequence"
    tried = [0]

    def report(value: int, total: int, fits: bool) -> None:
        tried[0] += 1
        verdict = "fits" if fits else "does not fit"
        typer.echo(f"  [{tried[0]}] {name} {value}: {format_bytes(total)}, {verdict}", err=True)

    return report


def _limit_command(
    what: str,
    model: str,
    gpu: str,
    task: str | None,
    alloc_conf: str | None,
    as_json: bool,
    **options: Any,
) -> None:
    """Search the largest `what` ("batch_size" or "seq_len") that fits `gpu` for the workload
    the other `options` describe, print it, and exit 0 (something fits) or 1 (nothing does)."""
    try:
        # Here, not at the top: these import torch, which `memfit --help` must not.
        from memfit.planner.limits import max_batch, max_seq

        w = build_workload(gpu=gpu, **options)
        if what == "batch_size":
            result = max_batch(model, w, gpu=gpu, task=task, alloc_conf=alloc_conf)
        else:
            result = max_seq(model, w, gpu=gpu, task=task, alloc_conf=alloc_conf,
                             progress=_progress_line(w.mode == "generate"))  # fmt: skip
    except (MemfitError, ImportError) as e:
        raise fail(str(e)) from None
    from memfit.planner.plan_text import limit_to_json, render_limit

    typer.echo(json.dumps(limit_to_json(result), indent=2) if as_json else render_limit(result))
    raise typer.Exit(EXIT_OK if result.largest else EXIT_DOES_NOT_FIT)


@takes_workload_options(skip=("batch",))
def max_batch_command(
    model: Model,
    gpu: Gpu,
    workload_options: dict[str, Any],
    task: Task = None,
    alloc_conf: AllocConf = None,
    as_json: AsJson = False,
) -> None:
    """The largest micro-batch that fits GPU for this configuration (searched, not guessed; when
    the search's cap fits, the answer is "at least" the cap)."""
    _limit_command("batch_size", model, gpu, task, alloc_conf, as_json, **workload_options)


@takes_workload_options(skip=("seq",))
def max_seq_command(
    model: Model,
    gpu: Gpu,
    workload_options: dict[str, Any],
    task: Task = None,
    alloc_conf: AllocConf = None,
    as_json: AsJson = False,
) -> None:
    """The longest sequence that fits GPU for this configuration (searched, not guessed), for
    models whose input is tokens."""
    _limit_command("seq_len", model, gpu, task, alloc_conf, as_json, **workload_options)
