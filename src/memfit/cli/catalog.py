"""`memfit models` and `memfit gpus`: the built-in catalogs, as a table or as JSON (exit 0)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from memfit.cuda.target import list_gpus
from memfit.units import format_bytes


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
    table = Table("name", "parameters", "default task", "source")
    for m in entries:
        table.add_row(m.name, f"{m.parameter_count:,}", m.task, m.hf_id or "memfit.models.zoo")
    Console().print(table)


def gpus_command(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the GPU catalog: memory as the driver reports it, compute capability, features."""
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
    table = Table("name", "memory (torch)", "compute cap.", "bf16", "flash attn", "model")
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
