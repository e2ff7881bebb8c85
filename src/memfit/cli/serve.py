"""`memfit serve`: the KV cache a vLLM engine would allocate on a GPU (memfit.serving_capacity).

Exit codes: 0 a sequence of the context length fits; 1 none does (vLLM would refuse to start
with that max_model_len); 2 bad input.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from memfit.cli.common.exits import EXIT_DOES_NOT_FIT, EXIT_OK, fail
from memfit.cli.common.workload_options import (
    AsJson,
    Gpu,
    Model,
    NoCache,
    Precision,
    Quantize,
    Task,
    skip_cache,
)
from memfit.errors import MemfitError

#: vLLM's defaults (memfit.planner.serving names their sources); here as literals so that
#: `memfit --help` does not import torch.
_UTILIZATION, _BLOCK_SIZE = 0.9, 16


def serve_command(
    model: Model,
    gpu: Gpu,
    gpu_memory_utilization: Annotated[
        float,
        typer.Option(
            "--gpu-memory-utilization",
            help="Fraction of the GPU's memory the engine may use (vLLM's option).",
        ),
    ] = _UTILIZATION,
    block_size: Annotated[
        int, typer.Option("--block-size", help="Tokens per KV block (vLLM's option).")
    ] = _BLOCK_SIZE,
    context_len: Annotated[
        int | None,
        typer.Option(
            "--context-len",
            help="Tokens of one request, vLLM's max_model_len (default: the model's positions).",
        ),
    ] = None,
    precision: Precision = "bf16-true",
    quantize: Quantize = None,
    max_num_batched_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-num-batched-tokens",
            help="Tokens of the profiling run (default: vllm serve's, 2048 or 8192 by GPU).",
        ),
    ] = None,
    max_num_seqs: Annotated[
        int | None,
        typer.Option(
            "--max-num-seqs", help="Requests at once (default: vllm serve's, 256 or 1024 by GPU)."
        ),
    ] = None,
    task: Task = None,
    as_json: AsJson = False,
    no_cache: NoCache = False,
) -> None:
    """KV blocks, KV tokens and concurrent sequences a vLLM engine would have on GPU."""
    skip_cache(no_cache)
    try:
        # Here, not at the top: these import torch, which `memfit --help` must not.
        from memfit.planner.serving import serving_capacity

        cap = serving_capacity(
            model, gpu, precision=precision or "bf16-true", quantize=quantize,
            gpu_memory_utilization=gpu_memory_utilization, block_size=block_size,
            context_len=context_len, max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs, task=task,
        )  # fmt: skip
    except (MemfitError, ImportError) as e:
        raise fail(str(e)) from None
    from memfit.planner.plan_text import render_serving, serving_to_json

    typer.echo(json.dumps(serving_to_json(cap), indent=2) if as_json else render_serving(cap))
    raise typer.Exit(EXIT_OK if cap.concurrent_sequences >= 1 else EXIT_DOES_NOT_FIT)
