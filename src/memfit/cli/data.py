"""`memfit data PATH --model MODEL [--gpu GPU] [--tokenizer DIR]`: what a text data set asks of
the GPU.

One streaming pass (a progress bar on a terminal) gives the token-length statistics, the longest
samples and character-level outliers with their line or row; with `--gpu`, the longest
sequence that fits the model and workload (as `memfit max-seq`) and the share of samples it
truncates; with a real tokenizer, the vocabulary's coverage and what pruning it saves.

The workload options (`--batch`, `--precision`, ...) size the max length and the vocabulary
savings, so without `--gpu` and without a tokenizer they apply to nothing and are errors.
Exit codes: 0 done; 1 no sequence length fits the GPU; 2 bad input.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

import typer

from memfit.cli.common.exits import EXIT_DOES_NOT_FIT, EXIT_OK, fail
from memfit.cli.common.workload_options import (
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
    LoraRank,
    LoraTargets,
    Mode,
    OffloadOptimizer,
    Optimizer,
    Precision,
    Task,
    TieEmbeddings,
    build_workload,
)
from memfit.errors import BadInputError, MemfitError

DataPath = Annotated[
    str,
    typer.Argument(
        help="JSONL, CSV, TSV, text (a sample a line), Parquet, or a save_to_disk folder."
    ),
]
ModelOption = Annotated[
    str,
    typer.Option(
        "--model", help="Catalog name, HF config.json, or file.py:build (sizes the max length)."
    ),
]
TokenizerDir = Annotated[
    str | None,
    typer.Option(
        "--tokenizer",
        help="Folder with tokenizer.json (default: the model's folder if it has one, else an "
        "approximate count).",
    ),
]
Field = Annotated[str | None, typer.Option(help="The text column (default: text).")]
Format = Annotated[
    str | None,
    typer.Option("--format", help="jsonl, csv, tsv, text, parquet or datasets (default: suffix)."),
]
Split = Annotated[str | None, typer.Option(help="The split of a saved DatasetDict.")]
Top = Annotated[int, typer.Option(help="How many of the longest samples to list.")]


def _tokenizer(tokenizer: str | None, model: str) -> Any:
    from memfit.data.tokenize import load_tokenizer, tokenizer_beside

    if tokenizer is not None:
        return load_tokenizer(tokenizer)
    beside = tokenizer_beside(model)
    return load_tokenizer(beside) if beside is not None else None


#: The workload options the vocabulary savings read (the max length reads them all).
_SAVINGS_OPTIONS = frozenset({
    "batch", "mode", "precision", "optimizer", "lora_rank", "lora_targets",
    "offload_optimizer", "embedding_on_cpu", "tie_embeddings", "task",
})  # fmt: skip


def _refuse_unused(options: dict[str, Any], gpu: str | None, tok: Any) -> None:
    """Workload options size the max length (--gpu) and the savings (a real tokenizer):
    one that sizes neither here is an error."""
    if gpu is not None:
        return
    unused = [
        f"--{k.replace('_', '-')}"
        for k, v in options.items()
        if v != _DEFAULTS[k] and (tok is None or k not in _SAVINGS_OPTIONS)
    ]
    if unused:
        needs = "--gpu (max length)" + (
            "" if tok is not None else " or --tokenizer DIR (vocabulary)"
        )
        raise BadInputError(
            f"{', '.join(unused)} size the max length"
            + ("" if tok is not None else " and the vocabulary savings")
            + f", which need {needs}; here they apply to nothing. Add --gpu, or leave them out."
        )


_DEFAULTS: dict[str, Any] = {
    "batch": DEFAULT.batch_size, "task": None, "mode": DEFAULT.mode,
    "precision": DEFAULT.precision, "optimizer": None, "grad_accum": DEFAULT.grad_accum,
    "checkpointing": DEFAULT.checkpointing, "lora_rank": None, "lora_targets": None,
    "attention": DEFAULT.attention, "alloc_conf": None,
    "offload_optimizer": DEFAULT.offload_optimizer,
    "embedding_on_cpu": DEFAULT.embedding_on_cpu, "tie_embeddings": DEFAULT.tie_embeddings,
    "gpus": DEFAULT.gpus,
}  # fmt: skip


def _describe(w: Any) -> str:
    """The workload as the report's fit line names it: ", batch 8, fp32, adamw"."""
    return f", batch {w.batch_size}, {w.precision}, {w.mode}, optimizer {w.optimizer}"


def _progress_pass(path: str, tok: Any, field: str | None, fmt: str | None,
                   split: str | None, top: int) -> Any:  # fmt: skip
    """The data pass, with a progress bar on stderr when it is a terminal."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TimeRemainingColumn

    from memfit.data.analyze import analyze_data

    console = Console(stderr=True)
    with Progress(
        "reading", BarColumn(), TaskProgressColumn(), TimeRemainingColumn(), console=console,
        transient=True, disable=not console.is_terminal,
    ) as bar:  # fmt: skip
        task = bar.add_task("read", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return analyze_data(path, tokenizer=tok, field=field, format=fmt, split=split, top=top,
                            progress=progress)  # fmt: skip


def _findings(
    path: str, model: str, gpu: str | None, tokenizer: str | None, field: str | None,
    fmt: str | None, split: str | None, top: int, options: dict[str, Any],
) -> Any:  # fmt: skip
    from memfit.data.budget import fit_length
    from memfit.data.report_text import Findings
    from memfit.data.vocab import coverage, vocab_savings

    tok = _tokenizer(tokenizer, model)
    _refuse_unused(options, gpu, tok)
    task, alloc_conf = options.pop("task"), options.pop("alloc_conf")
    if alloc_conf is not None and gpu is None:
        raise BadInputError("--alloc-conf sizes the max length, which needs --gpu. Add --gpu.")
    w = build_workload(**options)
    report = _progress_pass(path, tok, field, fmt, split, top)
    found = Findings(report=report, workload=_describe(w))
    if gpu is not None:
        found.fit = fit_length(model, w, report.tokens, gpu=gpu, task=task,
                               alloc_conf=alloc_conf)  # fmt: skip
    if tok is not None:
        found.coverage = coverage(report.id_counts, vocab_size=tok.vocab_size)
        seq = (found.fit.limit.largest if found.fit else None) or math.ceil(
            report.tokens.percentile(99)
        )
        found.savings = [
            vocab_savings(model, k, w, seq_len=seq, task=task, highest_id=len(report.id_counts) - 1)
            for k in sorted(set(found.coverage.needed.values()))
        ]
    return found


def data_command(
    path: DataPath,
    model: ModelOption,
    gpu: GpuForVerdict = None,
    tokenizer: TokenizerDir = None,
    field: Field = None,
    fmt: Format = None,
    split: Split = None,
    top: Top = 5,
    batch: Batch = DEFAULT.batch_size,
    task: Task = None,
    mode: Mode = DEFAULT.mode,
    precision: Precision = DEFAULT.precision,
    optimizer: Optimizer = None,
    grad_accum: GradAccum = DEFAULT.grad_accum,
    checkpointing: Checkpointing = DEFAULT.checkpointing,
    lora_rank: LoraRank = None,
    lora_targets: LoraTargets = None,
    attention: Attention = DEFAULT.attention,
    alloc_conf: AllocConf = None,
    offload_optimizer: OffloadOptimizer = DEFAULT.offload_optimizer,
    embedding_on_cpu: EmbeddingOnCpu = DEFAULT.embedding_on_cpu,
    tie_embeddings: TieEmbeddings = DEFAULT.tie_embeddings,
    gpus: Gpus = DEFAULT.gpus,
    as_json: AsJson = False,
) -> None:
    """Token lengths, outliers, the max length that fits GPU and what it cuts, of a data set.

    Streamed in constant memory; with a tokenizer, also the vocabulary's coverage and what
    pruning it saves.
    """
    options = dict(
        batch=batch, task=task, mode=mode, precision=precision, optimizer=optimizer,
        grad_accum=grad_accum, checkpointing=checkpointing, lora_rank=lora_rank,
        lora_targets=lora_targets, attention=attention, alloc_conf=alloc_conf,
        offload_optimizer=offload_optimizer, embedding_on_cpu=embedding_on_cpu,
        tie_embeddings=tie_embeddings, gpus=gpus,
    )  # fmt: skip
    try:
        found = _findings(path, model, gpu, tokenizer, field, fmt, split, top, options)
    except (MemfitError, ImportError) as e:
        raise fail(str(e)) from None
    from memfit.data.report_text import findings_to_json, render_findings

    typer.echo(json.dumps(findings_to_json(found), indent=2) if as_json else render_findings(found))
    nothing_fits = found.fit is not None and found.fit.limit.largest is None
    raise typer.Exit(EXIT_DOES_NOT_FIT if nothing_fits else EXIT_OK)
