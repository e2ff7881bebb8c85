"""The command-line options that describe a workload, declared once for every verb that takes them.

`estimate`, `plan`, `max-batch` and `max-seq` all describe the step to size with the same
options (`--batch`, `--seq`, `--precision`, ...). Each option is an `Annotated` type here, so its
flag, type and help text are written once; a verb lists the ones it takes, for instance
`precision: Precision = DEFAULT.precision`. Defaults come from `Workload()` and the choices in
the help texts from the tuples in `memfit.workload`, so the CLI cannot drift from the library.
`build_workload` turns the parsed values into a `Workload`. `--optimizer` defaults to None, not
to a name: the Workload resolves it from the mode (AdamW to train, none for inference), and an
optimizer given with `--mode inference` is an error, as every training-only option is.

The model argument, `--task`, `--alloc-conf` and `--json` are not Workload fields, but several of
these verbs take them, so they are declared here too. Options only one verb has stay in that verb.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import typer

from memfit.errors import BadInputError
from memfit.workload import (
    ATTENTION,
    CHECKPOINTING,
    MODES,
    OPTIMIZERS,
    PRECISIONS,
    LoraConfig,
    Workload,
)

#: The library's defaults; a verb's option defaults are read from it.
DEFAULT = Workload()


def _either(choices: Sequence[str]) -> str:
    """The choices as the help texts list them: "a, b or c"."""
    return f"{', '.join(choices[:-1])} or {choices[-1]}"


_GPU_HELP = "Target GPU (see `memfit gpus`)"

# What is sized, and how the answer is printed.
Model = Annotated[
    str,
    typer.Argument(help="Catalog name (see `memfit models`), HF config.json, or file.py:build."),
]
Task = Annotated[str | None, typer.Option(help="Model head, e.g. causal-lm, seq-classification.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the JSON report.")]
AllocConf = Annotated[
    str | None, typer.Option("--alloc-conf", help="PYTORCH_CUDA_ALLOC_CONF to simulate.")
]

# The Workload fields, in the order of the dataclass.
Batch = Annotated[int, typer.Option(help="Micro-batch size.")]
Seq = Annotated[int | None, typer.Option(help="Tokens per sample (text models).")]
ImageSize = Annotated[
    int | None, typer.Option("--image-size", help="Image side in pixels (vision models).")
]
Mode = Annotated[str, typer.Option(help=f"{_either(MODES)}.")]
Precision = Annotated[str, typer.Option(help=f"{_either(PRECISIONS)}.")]
Optimizer = Annotated[
    str | None,
    typer.Option(help=f"{', '.join(OPTIMIZERS)} (default: adamw to train, none for inference)."),
]
GradAccum = Annotated[int, typer.Option("--grad-accum", help="Gradient-accumulation steps.")]
Checkpointing = Annotated[
    str, typer.Option(help=f"Activation checkpointing: {_either(CHECKPOINTING)}.")
]
LoraRank = Annotated[
    int | None, typer.Option("--lora-rank", help="Add LoRA adapters of this rank.")
]
LoraTargets = Annotated[
    str | None,
    typer.Option("--lora-targets", help="Comma-separated module names, e.g. q_proj,v_proj."),
]
Attention = Annotated[str, typer.Option(help=f"{_either(ATTENTION)}.")]
#: `--gpu` where a verb needs one (plan, max-batch, max-seq).
Gpu = Annotated[str, typer.Option(help=f"{_GPU_HELP}.")]
#: `--gpu` where it is optional (estimate): without it there is no fits / does-not-fit verdict.
GpuForVerdict = Annotated[str | None, typer.Option(help=f"{_GPU_HELP}; gives a verdict.")]
OffloadOptimizer = Annotated[
    bool, typer.Option("--offload-optimizer", help="Keep optimizer state on the CPU.")
]
EmbeddingOnCpu = Annotated[
    bool, typer.Option("--embedding-on-cpu", help="Keep the input embedding on the CPU.")
]
TieEmbeddings = Annotated[
    bool, typer.Option("--tie-embeddings", help="Share input and output embeddings.")
]
Gpus = Annotated[
    int, typer.Option(help="Data-parallel GPUs: above 1, FSDP2 shards the model (per rank).")
]


def build_workload(
    *,
    batch: int = DEFAULT.batch_size,
    seq: int | None = DEFAULT.seq_len,
    image_size: int | None = DEFAULT.image_size,
    mode: str = DEFAULT.mode,
    precision: str = DEFAULT.precision,
    optimizer: str | None = None,
    grad_accum: int = DEFAULT.grad_accum,
    checkpointing: str = DEFAULT.checkpointing,
    lora_rank: int | None = None,
    lora_targets: str | None = None,
    attention: str = DEFAULT.attention,
    gpu: str | None = DEFAULT.gpu,
    offload_optimizer: bool = DEFAULT.offload_optimizer,
    embedding_on_cpu: bool = DEFAULT.embedding_on_cpu,
    tie_embeddings: bool = DEFAULT.tie_embeddings,
    gpus: int = DEFAULT.gpus,
) -> Workload:
    """The Workload the parsed options describe (keywords named as the parameters of the verbs).

    Raises BadInputError (exit 2 in the verbs) for a bad value, for an option the mode does not
    use (`--optimizer`, `--grad-accum`, `--checkpointing`, `--lora-rank`, `--offload-optimizer`
    with `--mode inference`), or for `--lora-targets` without `--lora-rank`.
    """
    lora = None
    if lora_targets is not None and lora_rank is None:
        raise BadInputError("--lora-targets needs --lora-rank (e.g. --lora-rank 8).")
    if lora_rank is not None:
        lora = LoraConfig(rank=lora_rank, targets=lora_targets or ())
    # Only an optimizer the user named: without one, the Workload picks by the mode.
    given: dict[str, Any] = {"optimizer": optimizer} if optimizer is not None else {}
    return Workload(
        **given,
        batch_size=batch,
        seq_len=seq,
        image_size=image_size,
        mode=mode,
        precision=precision,
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
