"""`memfit find-batch FILE.py:trial[:make_batch]` (registered by memfit.cli).

Runs `find_batch_size` on the user's trial function: on a real GPU when the code uses one, or on
the CPU under `memfit.simulate` when `--gpu` names the card to simulate (a name from
`memfit gpus`, optionally limited: `rtx-4090@12GiB`). Exit codes: 0 found; 1 even the smallest
batch does not fit; 2 bad input.
"""

from __future__ import annotations

import contextlib
import json
from typing import Annotated, Any

import typer

EXIT_NOTHING_FITS = 1


def find_batch_command(
    target: Annotated[
        str,
        typer.Argument(help="file.py:trial[:make_batch]; trial(batch) runs one training step."),
    ],
    gpu: Annotated[
        str | None,
        typer.Option(help="Simulate this GPU's memory on the CPU (e.g. t4, rtx-4090@12GiB)."),
    ] = None,
    start: Annotated[int, typer.Option(help="First batch size to try.")] = 1,
    max_batch: Annotated[int, typer.Option("--max", help="Largest batch size to try.")] = 4096,
    target_batch: Annotated[
        int | None,
        typer.Option(
            "--target-batch",
            help="Effective batch to keep: the answer is a micro-batch and accumulation.",
        ),
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Find the largest batch that runs, by trying (doubling, then binary search)."""
    import torch

    from memfit.batch_search import find_batch_size
    from memfit.cli import EXIT_OK, _fail
    from memfit.errors import MemfitError
    from memfit.sources import load_functions

    try:
        trial, make_batch = load_functions(target)
        if gpu is not None:
            from memfit.gpu_simulation import simulate

            model, optimizer = _model_and_optimizer(trial)
            where: contextlib.AbstractContextManager[object] = simulate(
                gpu, model=model, optimizer=optimizer
            )
        else:
            where = contextlib.nullcontext()
        with where:
            r = find_batch_size(
                trial, make_batch=make_batch, start=start, max_batch=max_batch,
                target_batch=target_batch, progress=progress and not as_json,
            )  # fmt: skip
    except (MemfitError, ImportError) as e:
        raise _fail(str(e)) from None
    except torch.OutOfMemoryError as e:
        typer.echo(f"{e}", err=True)
        raise typer.Exit(EXIT_NOTHING_FITS) from None
    if as_json:
        typer.echo(json.dumps({
            "batch_size": r.batch_size, "micro_batch_size": r.micro_batch_size,
            "grad_accum": r.grad_accum, "effective_batch_size": r.effective_batch_size,
            "tries": [{"batch_size": b, "ran": ok} for b, ok in r.tries],
            "gpu": gpu, "seconds": round(r.seconds, 2),
        }, indent=2))  # fmt: skip
    else:
        where_txt = f" on a simulated {gpu}" if gpu else ""
        typer.echo(f"largest batch that runs{where_txt}: {r.batch_size}")
        if target_batch is not None:
            typer.echo(
                f"for an effective batch of {r.effective_batch_size}: micro-batch "
                f"{r.micro_batch_size} x {r.grad_accum} accumulation"
            )
    raise typer.Exit(EXIT_OK)


def _model_and_optimizer(trial: object) -> tuple[Any, Any]:
    """The model and optimizer the trial's module holds (made at import, before the simulated
    GPU starts counting): counted from the start when there is exactly one of each."""
    import torch

    g = getattr(trial, "__globals__", {})
    models = [v for v in g.values() if isinstance(v, torch.nn.Module)]
    opts = [v for v in g.values() if isinstance(v, torch.optim.Optimizer)]
    from memfit.errors import BadInputError

    if len(models) > 1:
        raise BadInputError(
            f"The trial's module holds {len(models)} models at top level; memfit cannot tell "
            "which one trains. Build the model inside trial() or keep one at top level."
        )
    return (models[0] if models else None, opts[0] if len(opts) == 1 else None)
