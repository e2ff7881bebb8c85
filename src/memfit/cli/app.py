"""The `memfit` command: a thin layer over the library (parse, call, render, exit code).

Exit codes: 0 success (fits, or no GPU named); 1 does not fit; 2 bad input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from memfit.errors import MemfitError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="memfit: peak GPU memory of PyTorch training and inference, estimated on a CPU.",
)

EXIT_OK = 0
EXIT_DOES_NOT_FIT = 1
EXIT_BAD_INPUT = 2


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(EXIT_BAD_INPUT)


@app.command()
def estimate(
    model: Annotated[
        str,
        typer.Argument(
            help="Catalog name (see `memfit models`), HF config.json, or file.py:build."
        ),
    ],
    batch: Annotated[int, typer.Option(help="Micro-batch size.")] = 1,
    seq: Annotated[int | None, typer.Option(help="Tokens per sample (text models).")] = None,
    image_size: Annotated[
        int | None, typer.Option("--image-size", help="Image side in pixels (vision models).")
    ] = None,
    task: Annotated[
        str | None, typer.Option(help="Model head, e.g. causal-lm, seq-classification.")
    ] = None,
    mode: Annotated[str, typer.Option(help="train or inference.")] = "train",
    precision: Annotated[
        str, typer.Option(help="fp32, fp16-mixed, bf16-mixed, fp16-true or bf16-true.")
    ] = "fp32",
    optimizer: Annotated[
        str,
        typer.Option(
            help="sgd, sgd-momentum, adam, adamw, adamw-fused, adafactor, adamw-8bit, lion, none."
        ),
    ] = "adamw",
    grad_accum: Annotated[
        int, typer.Option("--grad-accum", help="Gradient-accumulation steps.")
    ] = 1,
    checkpointing: Annotated[
        str, typer.Option(help="Activation checkpointing: off or blocks.")
    ] = "off",
    lora_rank: Annotated[
        int | None, typer.Option("--lora-rank", help="Add LoRA adapters of this rank.")
    ] = None,
    lora_targets: Annotated[
        str | None,
        typer.Option("--lora-targets", help="Comma-separated module names, e.g. q_proj,v_proj."),
    ] = None,
    attention: Annotated[str, typer.Option(help="sdpa or eager.")] = "sdpa",
    gpu: Annotated[
        str | None, typer.Option(help="Target GPU (see `memfit gpus`); gives a verdict.")
    ] = None,
    alloc_conf: Annotated[
        str | None,
        typer.Option("--alloc-conf", help="PYTORCH_CUDA_ALLOC_CONF to simulate."),
    ] = None,
    offload_optimizer: Annotated[
        bool, typer.Option("--offload-optimizer", help="Keep optimizer state on the CPU.")
    ] = False,
    embedding_on_cpu: Annotated[
        bool, typer.Option("--embedding-on-cpu", help="Keep the input embedding on the CPU.")
    ] = False,
    tie_embeddings: Annotated[
        bool, typer.Option("--tie-embeddings", help="Share input and output embeddings.")
    ] = False,
    gpus: Annotated[
        int,
        typer.Option(help="Data-parallel GPUs: above 1, FSDP2 shards the model (per rank)."),
    ] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON report.")] = False,
    timeline: Annotated[
        Path | None, typer.Option(help="Write the memory timeline to this .png or .html.")
    ] = None,
    snapshot: Annotated[
        Path | None,
        typer.Option(help="Write a snapshot pytorch.org/memory_viz opens (.pickle) here."),
    ] = None,
) -> None:
    """Estimate peak GPU memory of one training (or inference) step, without a GPU."""
    from memfit.workload import LoraConfig, Workload

    try:
        lora = None
        if lora_targets and lora_rank is None:
            raise _fail("--lora-targets needs --lora-rank (e.g. --lora-rank 8).")
        if lora_rank is not None:
            targets = tuple(t.strip() for t in (lora_targets or "").split(",") if t.strip())
            lora = LoraConfig(rank=lora_rank, targets=targets)
        w = Workload(
            batch_size=batch,
            seq_len=seq,
            image_size=image_size,
            mode=mode,
            precision=precision,
            optimizer=optimizer if mode == "train" else "none",
            grad_accum=grad_accum,
            checkpointing=checkpointing,
            lora=lora,
            attention=attention,
            gpu=gpu,
            offload_optimizer=offload_optimizer,
            embedding_on_cpu=embedding_on_cpu,
            tie_embeddings=tie_embeddings,
            gpus=gpus,
        )
        from memfit.cli.measure import check_timeline_path
        from memfit.estimator.estimate import estimate as run_estimate

        check_timeline_path(timeline)
        est = run_estimate(model, w, task=task, alloc_conf=alloc_conf)
        if timeline is not None or snapshot is not None:
            from memfit.cli.measure import write_pictures
            from memfit.cuda.allocator_config import AllocatorConfig

            cfg = AllocatorConfig.from_string(alloc_conf) if alloc_conf else None
            write_pictures(est.profile, timeline, snapshot, config=cfg)
    except (MemfitError, ImportError) as e:
        raise _fail(str(e)) from None
    from memfit.report import text as report
    from memfit.report.json import estimate_json

    if as_json:
        typer.echo(json.dumps(estimate_json(est), indent=2))
    else:
        from rich.console import Console

        Console(highlight=False, soft_wrap=True).print(report.render_text(est), markup=False)
    raise typer.Exit(EXIT_DOES_NOT_FIT if est.fits is False else EXIT_OK)


def _split(values: list[str] | None) -> tuple[str, ...]:
    return tuple(v.strip() for item in values or [] for v in item.split(",") if v.strip())


@app.command()
def plan(
    model: Annotated[str, typer.Argument(help="Catalog name, HF config.json, or file.py:build.")],
    gpu: Annotated[str, typer.Option(help="Target GPU (see `memfit gpus`).")],
    global_batch: Annotated[
        int, typer.Option("--global-batch", help="Samples per optimizer step (kept).")
    ] = 8,
    seq: Annotated[int | None, typer.Option(help="Tokens per sample (kept).")] = None,
    image_size: Annotated[int | None, typer.Option("--image-size")] = None,
    gpus: Annotated[
        int, typer.Option(help="Data-parallel GPUs: FSDP2 shards the model over them.")
    ] = 1,
    precision: Annotated[
        str | None, typer.Option(help="Keep this precision (default: the planner chooses).")
    ] = None,
    optimizer: Annotated[
        str | None, typer.Option(help="Keep this optimizer (default: the planner chooses).")
    ] = None,
    allow: Annotated[
        list[str] | None,
        typer.Option(help="Also allow a technique (lora, tied-embeddings, pure-precision)."),
    ] = None,
    forbid: Annotated[list[str] | None, typer.Option(help="Never use a technique.")] = None,
    task: Annotated[str | None, typer.Option()] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The fastest configuration that fits GPU, keeping the global batch and sequence length."""
    try:
        from memfit.planner.search import Goal
        from memfit.planner.search import plan as run_plan

        goal = Goal(
            global_batch=global_batch, seq_len=seq, image_size=image_size,
            precision=precision, optimizer=optimizer,
        )  # fmt: skip
        result = run_plan(
            model, gpu=gpu, goal=goal, n_gpus=gpus, allow=_split(allow), forbid=_split(forbid),
            task=task,
        )  # fmt: skip
    except (MemfitError, ImportError) as e:
        raise _fail(str(e)) from None
    from memfit.planner.render import plan_to_json, render_plan

    if as_json:
        typer.echo(json.dumps(plan_to_json(result), indent=2))
    else:
        typer.echo(render_plan(result))
    raise typer.Exit(EXIT_OK if result.best is not None else EXIT_DOES_NOT_FIT)


def _limit_command(what: str, model: str, gpu: str, w_kwargs: dict, task: str | None,
                   as_json: bool) -> None:  # fmt: skip
    try:
        from memfit.planner.limits import max_batch, max_seq
        from memfit.workload import Workload

        w = Workload(**w_kwargs)
        fn = max_batch if what == "batch_size" else max_seq
        result = fn(model, w, gpu=gpu, task=task)
    except (MemfitError, ImportError) as e:
        raise _fail(str(e)) from None
    from memfit.planner.render import limit_to_json, render_limit

    typer.echo(json.dumps(limit_to_json(result), indent=2) if as_json else render_limit(result))
    raise typer.Exit(EXIT_OK if result.largest else EXIT_DOES_NOT_FIT)


@app.command("max-batch")
def max_batch_cmd(
    model: Annotated[str, typer.Argument()],
    gpu: Annotated[str, typer.Option(help="Target GPU.")],
    seq: Annotated[int | None, typer.Option()] = None,
    precision: Annotated[str, typer.Option()] = "fp32",
    optimizer: Annotated[str, typer.Option()] = "adamw",
    checkpointing: Annotated[str, typer.Option()] = "off",
    mode: Annotated[str, typer.Option()] = "train",
    task: Annotated[str | None, typer.Option()] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The largest micro-batch that fits GPU for this configuration (searched, not guessed)."""
    _limit_command(
        "batch_size", model, gpu,
        {"seq_len": seq, "precision": precision, "checkpointing": checkpointing, "mode": mode,
         "optimizer": optimizer if mode == "train" else "none"},
        task, as_json,
    )  # fmt: skip


@app.command("max-seq")
def max_seq_cmd(
    model: Annotated[str, typer.Argument()],
    gpu: Annotated[str, typer.Option(help="Target GPU.")],
    batch: Annotated[int, typer.Option()] = 1,
    precision: Annotated[str, typer.Option()] = "fp32",
    optimizer: Annotated[str, typer.Option()] = "adamw",
    checkpointing: Annotated[str, typer.Option()] = "off",
    mode: Annotated[str, typer.Option()] = "train",
    task: Annotated[str | None, typer.Option()] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The longest sequence that fits GPU for this configuration (searched, not guessed)."""
    _limit_command(
        "seq_len", model, gpu,
        {"batch_size": batch, "precision": precision, "checkpointing": checkpointing,
         "mode": mode, "optimizer": optimizer if mode == "train" else "none"},
        task, as_json,
    )  # fmt: skip


@app.command()
def models(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the built-in model catalog."""
    from memfit.models.catalog import list_models

    entries = list_models()
    if as_json:
        rows = [
            {"name": m.name, "hf_id": m.hf_id, "task": m.task, "parameters": m.parameter_count}
            for m in entries
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("name", "parameters", "default task", "source")
    for m in entries:
        table.add_row(m.name, f"{m.parameter_count:,}", m.task, m.hf_id or "memfit.models.zoo")
    Console().print(table)


@app.command()
def gpus(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the GPU catalog: memory as the driver reports it, compute capability, features."""
    from memfit.cuda.target import list_gpus
    from memfit.units import format_bytes

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
    from rich.console import Console
    from rich.table import Table

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


def _register_commands() -> None:
    from memfit.cli.doctor import doctor_command
    from memfit.cli.find_batch import find_batch_command
    from memfit.cli.measure import compare_command, profile_command

    app.command("profile")(profile_command)
    app.command("compare")(compare_command)
    app.command("doctor")(doctor_command)
    app.command("find-batch")(find_batch_command)


_register_commands()


def main() -> None:
    """Entry point of the `memfit` console script."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
