"""`memfit find-batch FILE.py:trial[:make_batch]` (registered by memfit.cli.app).

Runs `find_batch_size` on the user's trial function: on a real GPU when the code uses one, or on
the CPU under `memfit.simulate` when `--gpu` names the card to simulate (a name from `memfit
gpus`, optionally limited: `rtx-4090@12GiB`). The simulated trial runs on fake tensors, as CUDA
would run it (memfit.simulation.fake_run): its tensors take no host memory and nothing is
computed; `--real` runs it on real tensors instead, for a trial that needs values. Without
`--gpu` on a machine with no CUDA GPU the search would measure host RAM, which says nothing
about a GPU: that is refused.

What the trial's file holds at top level (made at import, before the search) is on the GPU from
the start: its modules with parameters or buffers (a parameterless `nn.CrossEntropyLoss()` is
not a model; a module inside another one found is counted with it; several models, a GAN's
generator and discriminator, are all counted), and its optimizer when there is one. Their
gradients are set to None between tries.

Exit codes: 0 found; 1 even the smallest batch does not fit; 2 bad input (no such file or
function, an unknown GPU, no GPU and no `--gpu`, or a memfit BadInputError raised by the
trial); 3 the trial raised another error (not an out-of-memory): its traceback is printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import traceback
from typing import Annotated, Any

import typer

import memfit
from memfit.cli.common.exits import EXIT_OK, fail
from memfit.errors import BadInputError, MemfitError

EXIT_NOTHING_FITS = 1
EXIT_TRIAL_FAILED = 3


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
    real: Annotated[
        bool,
        typer.Option(
            "--real",
            help="With --gpu: run the trial on real tensors (needs host RAM as large as the "
            "memory simulated) instead of fake ones.",
        ),
    ] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Find the largest batch that runs, by trying (doubling, then binary search)."""
    # Here, not at the top: these import torch, which `memfit --help` must not.
    import torch

    from memfit.guard.batch_search import find_batch_size
    from memfit.models.sources import load_functions

    if gpu is None and not torch.cuda.is_available():
        raise fail(
            "No CUDA GPU here, so the search would measure host RAM. Pass --gpu NAME to "
            "simulate a GPU on the CPU (e.g. --gpu t4 or --gpu rtx-4090@12GiB; `memfit gpus` "
            "lists the names)."
        )
    try:
        trial, make_batch = load_functions(target)
        model, optimizer = _model_and_optimizer(trial)
        where: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
        if gpu is not None:
            from memfit.simulation.simulated_gpu import simulate

            where = simulate(gpu, model=model, optimizer=optimizer, fake=not real)
        elif real:
            raise BadInputError("--real chooses how --gpu simulates a GPU; it needs --gpu.")
    except (MemfitError, ImportError) as e:
        raise fail(str(e)) from None
    try:
        with where:
            r = find_batch_size(
                trial, make_batch=make_batch, start=start, max_batch=max_batch,
                target_batch=target_batch, model=model, optimizer=optimizer,
                progress=progress and not as_json,
            )  # fmt: skip
    except BadInputError as e:
        raise fail(str(e)) from None
    except torch.OutOfMemoryError as e:
        typer.echo(f"{e}", err=True)
        raise typer.Exit(EXIT_NOTHING_FITS) from None
    except Exception as e:  # the trial's own error: shown, with its own exit code
        typer.echo(_user_traceback(e), err=True, nl=False)
        typer.echo(f"error: the trial raised {type(e).__name__}: {e}", err=True)
        raise typer.Exit(EXIT_TRIAL_FAILED) from None
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
    """The model and optimizer the trial's module holds at top level (see the module
    docstring): one module, an `nn.ModuleDict` of several (keyed by their names), or None; the
    optimizer when there is exactly one."""
    import torch  # here, not at the top: `memfit --help` must not import torch

    g = getattr(trial, "__globals__", {})
    found = {
        name: v
        for name, v in g.items()
        if isinstance(v, torch.nn.Module)
        and (next(v.parameters(), None) is not None or next(v.buffers(), None) is not None)
    }
    inside = {id(sub) for m in found.values() for sub in m.modules() if sub is not m}
    models = {name: m for name, m in found.items() if id(m) not in inside}
    unique = list({id(m): (name, m) for name, m in models.items()}.values())  # aliases once
    opts = list({id(v): v for v in g.values() if isinstance(v, torch.optim.Optimizer)}.values())
    optimizer = opts[0] if len(opts) == 1 else None
    if len(unique) <= 1:
        return (unique[0][1] if unique else None), optimizer
    probe = torch.nn.ModuleDict()  # a name such as `forward` cannot be a key as it is
    return torch.nn.ModuleDict(
        {(name if not hasattr(probe, name) else f"{name}_"): m for name, m in unique}
    ), optimizer


def _user_traceback(e: BaseException) -> str:
    """The traceback from the first frame outside memfit on (the search's frames are noise)."""
    here = os.path.dirname(os.path.abspath(memfit.__file__)) + os.sep
    tb = e.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(here):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb))
