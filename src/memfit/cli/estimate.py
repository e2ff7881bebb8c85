"""`memfit estimate MODEL`: peak GPU memory of one step, traced on the CPU (no GPU needed).

Exit codes: 0 the estimate fits `--gpu`, or no GPU was named; 1 it does not fit; 2 bad input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from memfit.cli._exit import EXIT_DOES_NOT_FIT, EXIT_OK, fail
from memfit.cli._pictures import check_picture_paths, write_pictures
from memfit.cli._workload_options import (
    DEFAULT,
    AllocConf,
    AsJson,
    Attention,
    Batch,
    Checkpointing,
    EmbeddingOnCpu,
    GpuForVerdict,
    Gpus,
    GradAccum,
    ImageSize,
    LoraRank,
    LoraTargets,
    Mode,
    Model,
    OffloadOptimizer,
    Optimizer,
    Precision,
    Seq,
    Task,
    TieEmbeddings,
    build_workload,
)
from memfit.cuda.allocator_config import AllocatorConfig
from memfit.errors import MemfitError


def estimate_command(
    model: Model,
    batch: Batch = DEFAULT.batch_size,
    seq: Seq = DEFAULT.seq_len,
    image_size: ImageSize = DEFAULT.image_size,
    task: Task = None,
    mode: Mode = DEFAULT.mode,
    precision: Precision = DEFAULT.precision,
    optimizer: Optimizer = None,
    grad_accum: GradAccum = DEFAULT.grad_accum,
    checkpointing: Checkpointing = DEFAULT.checkpointing,
    lora_rank: LoraRank = None,
    lora_targets: LoraTargets = None,
    attention: Attention = DEFAULT.attention,
    gpu: GpuForVerdict = DEFAULT.gpu,
    alloc_conf: AllocConf = None,
    offload_optimizer: OffloadOptimizer = DEFAULT.offload_optimizer,
    embedding_on_cpu: EmbeddingOnCpu = DEFAULT.embedding_on_cpu,
    tie_embeddings: TieEmbeddings = DEFAULT.tie_embeddings,
    gpus: Gpus = DEFAULT.gpus,
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
        from memfit.estimator.estimate import estimate

        w = build_workload(
            batch=batch, seq=seq, image_size=image_size, mode=mode, precision=precision,
            optimizer=optimizer, grad_accum=grad_accum, checkpointing=checkpointing,
            lora_rank=lora_rank, lora_targets=lora_targets, attention=attention, gpu=gpu,
            offload_optimizer=offload_optimizer, embedding_on_cpu=embedding_on_cpu,
            tie_embeddings=tie_embeddings, gpus=gpus,
        )  # fmt: skip
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
