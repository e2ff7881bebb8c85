"""`memfit models` and `memfit gpus`: the built-in catalogs, as a table or as JSON (exit 0).

`memfit gpus --for MODEL --global-batch B --seq S [--gpus N ...] [--prices FILE]` plans the job
on every GPU of the catalog (memfit.planner.gpus.ranking.choose_gpu): whether it fits, the fastest
plan and its predicted tokens per second, sorted; with a price list, the cost per million
tokens. Exit 0 when some GPU fits, 1 when none does, 2 on bad input.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Column, Table

from memfit.cli.common.exits import EXIT_DOES_NOT_FIT, fail
from memfit.cli.common.workload_options import NoCache, skip_cache
from memfit.cuda.target import list_gpus
from memfit.errors import MemfitError
from memfit.units import format_bytes


def _name_column(names: Iterable[str]) -> Column:
    """The column of the names a user types (`--gpu rtx-4060-ti-16gb`): never wrapped or cut,
    whatever the terminal's width; the other columns wrap instead."""
    return Column("name", no_wrap=True, min_width=max((len(n) for n in names), default=4))


def models_command(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the built-in model catalog."""
    # Here, not at the top: the model catalog imports torch, which `memfit --help` must not.
    from memfit.models.catalog import list_models

    entries = list_models()
    if as_json:
        rows = [
            {"name": m.name, "hf_id": m.hf_id, "task": m.task, "parameters": m.parameter_count}
            for m in entries
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(_name_column(m.name for m in entries), "parameters", "default task", "source")
    for m in entries:
        table.add_row(m.name, f"{m.parameter_count:,}", m.task, m.hf_id or "memfit.models.zoo")
    Console().print(table)


def gpus_command(
    for_model: Annotated[
        str | None,
        typer.Option("--for", help="Plan this model on every GPU (catalog name or config.json)."),
    ] = None,
    global_batch: Annotated[
        int | None, typer.Option("--global-batch", help="With --for: samples per step (8).")
    ] = None,
    seq: Annotated[int | None, typer.Option(help="With --for: tokens per sample.")] = None,
    gpus: Annotated[
        list[int] | None, typer.Option(help="With --for: GPU counts to try (repeat: 1 2 8).")
    ] = None,
    prices: Annotated[
        str | None, typer.Option(help="With --for: CSV of gpu,usd_per_hour (your own prices).")
    ] = None,
    allow: Annotated[list[str] | None, typer.Option(help="With --for: allow a technique.")] = None,
    forbid: Annotated[list[str] | None, typer.Option(help="With --for: never a technique.")] = None,
    teacher: Annotated[
        str | None, typer.Option(help="With --for: distill from this teacher (as plan --teacher).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    no_cache: NoCache = False,
) -> None:
    """List the GPU catalog; with --for MODEL, which GPUs fit the job and how fast."""
    skip_cache(no_cache)
    given = {"--global-batch": global_batch, "--seq": seq, "--gpus": gpus, "--prices": prices,
             "--allow": allow, "--forbid": forbid, "--teacher": teacher,
             "--no-cache": no_cache or None}  # fmt: skip
    if for_model is None:
        stray = [k for k, v in given.items() if v is not None]
        if stray:
            raise fail(f"{', '.join(stray)} only apply with --for MODEL (the job to plan).")
        _catalog(as_json)
        return
    _for_model(for_model, global_batch or 8, seq, gpus or [1], prices, allow, forbid, teacher,
               as_json)  # fmt: skip


def _for_model(model: str, global_batch: int, seq: int | None, counts: list[int],
               prices: str | None, allow: Any, forbid: Any, teacher: str | None,
               as_json: bool) -> None:  # fmt: skip
    from memfit.cli.plan import _split

    try:
        # Here, not at the top: the planner imports torch, which `memfit --help` must not.
        from memfit.planner.gpus.ranking import choose_gpu
        from memfit.planner.search import Goal

        goal = Goal(global_batch=global_batch, seq_len=seq, teacher=teacher)
        choices = choose_gpu(model, goal, n_gpus=counts, prices=prices, allow=_split(allow),
                             forbid=_split(forbid))  # fmt: skip
    except (MemfitError, ImportError) as e:
        raise fail(str(e)) from None
    from memfit.planner.gpus.text import describe_choice, gpu_choices_to_json

    if as_json:
        typer.echo(json.dumps(gpu_choices_to_json(choices), indent=2))
    else:
        table = Table("gpu", "n", "memory", "fits", "tokens/s", "$/M tokens", "plan")
        for c in choices:
            row = describe_choice(c)
            table.add_row(c.gpu.name, str(c.n_gpus), format_bytes(c.gpu.total_memory_bytes),
                          *row)  # fmt: skip
        Console(width=140).print(table)
    if not any(c.fits for c in choices):
        raise typer.Exit(EXIT_DOES_NOT_FIT)


def _catalog(as_json: bool) -> None:
    entries = list_gpus()
    if as_json:
        rows = [
            {
                "name": g.name,
                "total_memory_bytes": g.total_memory_bytes,
                "compute_capability": list(g.compute_capability),
                "bf16": g.bf16,
                "flash_attention": g.flash_attention,
            }
            for g in entries
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(_name_column(g.name for g in entries), "memory (torch)", "compute cap.",
                  "bf16", "flash attn", "model")  # fmt: skip
    for g in entries:
        cc = f"{g.compute_capability[0]}.{g.compute_capability[1]}"
        table.add_row(
            g.name,
            format_bytes(g.total_memory_bytes),
            cc,
            "yes" if g.bf16 else "no",
            "yes" if g.flash_attention else "no",
            g.display_name,
        )
    Console().print(table)
