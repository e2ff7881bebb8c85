"""The command-line options that describe a workload, declared once for every verb that takes them.

`estimate`, `plan`, `max-batch` and `max-seq` all describe the step to size with the same
options (`--batch`, `--seq`, `--precision`, ...). Each option is an `Annotated` type here, so its
flag, type and help text are written once; a verb lists the ones it takes, for instance
`precision: Precision = DEFAULT.precision`. Defaults come from `Workload()` and the choices in
the help texts from the tuples in `memfit.workload`, so the CLI cannot drift from the library.
`build_workload` turns the parsed values into a `Workload`. A verb that takes the whole set is
decorated with `@takes_workload_options()`: the options are added to its signature (after its
own parameters, so `--help` lists them in one place) and reach it as one `workload` argument, a
built `Workload`; it lists none of them itself. `--optimizer` defaults to None, not
to a name: the Workload resolves it from the mode (AdamW to train, none for inference), and an
optimizer given with `--mode inference` is an error, as every training-only option is.

The model argument, `--task`, `--alloc-conf` and `--json` are not Workload fields, but several of
these verbs take them, so they are declared here too. Options only one verb has stay in that verb.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer

from memfit.errors import BadInputError
from memfit.workload import (
    ATTENTION,
    AUTO_PRECISION,
    CACHES,
    CHECKPOINTING,
    DISTILL_LOSSES,
    MODES,
    OPTIMIZERS,
    PRECISIONS,
    QUANTIZE,
    TEACHER_PRECISIONS,
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
Precision = Annotated[
    str | None,
    typer.Option(
        help=f"{_either(PRECISIONS)}, or auto: the checkpoint's dtype, as transformers loads it "
        "(default: fp32 to train, auto for inference and generation)."
    ),
]
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
Ddp = Annotated[
    bool,
    typer.Option("--ddp", help="The --gpus run DistributedDataParallel: each the whole model."),
]


Quantize = Annotated[
    str | None,
    typer.Option(help=f"Quantized base weights: {_either(QUANTIZE)} (needs --lora-rank to train)."),
]
PrepareKbit = Annotated[
    bool,
    typer.Option("--prepare-kbit", help="peft's prepare_model_for_kbit_training casts (QLoRA)."),
]
OptimizerInBackward = Annotated[
    bool,
    typer.Option(
        "--optimizer-in-backward", help="Step each parameter as its gradient lands; free it."
    ),
]
OffloadActivations = Annotated[
    str | None,
    typer.Option(
        "--offload-activations",
        help="Saved activations to pinned CPU memory: save_on_cpu (every saved tensor, as "
        "PyTorch's) or torchtune (parameters and tiny tensors stay).",
    ),
]
ChunkedLoss = Annotated[
    int | None,
    typer.Option("--chunked-loss", help="Cross-entropy over N chunks of the sequence."),
]
FsdpCpuOffload = Annotated[
    bool,
    typer.Option(
        "--fsdp-cpu-offload", help="FSDP2 CPUOffloadPolicy: params, grads, state on the CPU."
    ),
]
HostMemory = Annotated[
    str | None,
    typer.Option("--host-memory", help="Host RAM for what lives on the CPU (default: this one's)."),
]

PromptLen = Annotated[
    int | None, typer.Option("--prompt-len", help="Generation: prompt tokens (default 512).")
]
NewTokens = Annotated[int, typer.Option("--new-tokens", help="Generation: tokens generated.")]
NumBeams = Annotated[int, typer.Option("--num-beams", help="Generation: beams (1: greedy).")]
Cache = Annotated[str, typer.Option(help=f"Generation: KV cache, {_either(CACHES)}.")]
Tp = Annotated[int, typer.Option(help="Generation: tensor-parallel GPUs (one rank reported).")]

Teacher = Annotated[
    str | None,
    typer.Option(help="Distill from this teacher (catalog name, config.json or file.py:build)."),
]
TeacherPrecision = Annotated[
    str | None,
    typer.Option(
        "--teacher-precision",
        help=f"Teacher weights: {_either(TEACHER_PRECISIONS)} (default: the compute dtype).",
    ),
]
TeacherQuantize = Annotated[
    str | None,
    typer.Option("--teacher-quantize", help=f"Quantized teacher: {_either(QUANTIZE)}."),
]
DistillLoss = Annotated[
    str, typer.Option("--distill-loss", help=f"Distillation loss: {_either(DISTILL_LOSSES)}.")
]
TeacherTopK = Annotated[
    int | None,
    typer.Option("--teacher-top-k", help="Offline distillation from the teacher's top-k logits."),
]


#: Every option `build_workload` takes: (parameter name, annotated type, default), in the order
#: `--help` lists them.
WORKLOAD_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("batch", Batch, DEFAULT.batch_size),
    ("seq", Seq, DEFAULT.seq_len),
    ("image_size", ImageSize, DEFAULT.image_size),
    ("mode", Mode, DEFAULT.mode),
    ("precision", Precision, None),
    ("optimizer", Optimizer, None),
    ("grad_accum", GradAccum, DEFAULT.grad_accum),
    ("checkpointing", Checkpointing, DEFAULT.checkpointing),
    ("lora_rank", LoraRank, None),
    ("lora_targets", LoraTargets, None),
    ("attention", Attention, DEFAULT.attention),
    ("gpu", GpuForVerdict, DEFAULT.gpu),
    ("gpus", Gpus, DEFAULT.gpus),
    ("ddp", Ddp, DEFAULT.ddp),
    ("offload_optimizer", OffloadOptimizer, DEFAULT.offload_optimizer),
    ("embedding_on_cpu", EmbeddingOnCpu, DEFAULT.embedding_on_cpu),
    ("tie_embeddings", TieEmbeddings, DEFAULT.tie_embeddings),
    ("quantize", Quantize, DEFAULT.quantize),
    ("prepare_kbit", PrepareKbit, DEFAULT.prepare_kbit),
    ("optimizer_in_backward", OptimizerInBackward, DEFAULT.optimizer_in_backward),
    ("offload_activations", OffloadActivations, None),
    ("chunked_loss", ChunkedLoss, DEFAULT.chunked_loss),
    ("fsdp_cpu_offload", FsdpCpuOffload, DEFAULT.fsdp_cpu_offload),
    ("host_memory", HostMemory, DEFAULT.host_memory),
    ("prompt_len", PromptLen, DEFAULT.prompt_len),
    ("new_tokens", NewTokens, DEFAULT.new_tokens),
    ("num_beams", NumBeams, DEFAULT.num_beams),
    ("cache", Cache, DEFAULT.cache),
    ("tp", Tp, DEFAULT.tp),
    ("teacher", Teacher, DEFAULT.teacher),
    ("teacher_precision", TeacherPrecision, DEFAULT.teacher_precision),
    ("teacher_quantize", TeacherQuantize, DEFAULT.teacher_quantize),
    ("distill_loss", DistillLoss, DEFAULT.distill_loss),
    ("teacher_top_k", TeacherTopK, DEFAULT.teacher_top_k),
)


#: Options whose parameter is not named as the Workload field it sets.
FIELD_OF_OPTION = {"batch": "batch_size", "seq": "seq_len", "lora_rank": "lora",
                   "lora_targets": "lora"}  # fmt: skip


def workload_flags() -> dict[str, str]:
    """Workload field -> the flag that sets it, read from the options above (LoRA's two flags
    build one LoraConfig: library messages name it `LoraConfig(rank=...)`, not a flag)."""
    out = {}
    for name, annotated, _ in WORKLOAD_OPTIONS:
        option = typing.get_args(annotated)[1]
        flag = option.param_decls[0] if option.param_decls else "--" + name.replace("_", "-")
        if FIELD_OF_OPTION.get(name) != "lora":
            out[FIELD_OF_OPTION.get(name, name)] = flag
    return out


NoCache = Annotated[
    bool,
    typer.Option(
        "--no-cache",
        help="Trace again instead of reading memfit's trace and plan cache "
        "($MEMFIT_CACHE_DIR, else ~/.cache/memfit; `memfit cache` shows it).",
    ),
]


def skip_cache(no_cache: bool) -> None:
    """`--no-cache`: trace (and plan) again for the rest of this command."""
    if no_cache:
        from memfit.estimator import set_enabled

        set_enabled(False)


def takes_workload_options(
    *, skip: Sequence[str] = ()
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a verb every workload option but those it declares itself or `skip`s, and
    `--no-cache`; the verb takes `workload_options` (a dict of the parsed values, for
    `build_workload`) instead.

    The options are added to the signature typer reads (after the verb's own parameters), so a
    new Workload field is one line in WORKLOAD_OPTIONS, not one per verb.
    """

    def decorate(verb: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(verb, include_extras=True)
        own = [
            p.replace(annotation=hints.get(p.name, p.annotation))
            for p in inspect.signature(verb).parameters.values()
            if p.name != "workload_options"
        ]
        taken = {p.name for p in own} | set(skip)
        added = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=d, annotation=a)
            for name, a, d in WORKLOAD_OPTIONS
            if name not in taken
        ]
        names = {p.name for p in added}
        added.append(inspect.Parameter("no_cache", inspect.Parameter.KEYWORD_ONLY,
                                       default=False, annotation=NoCache))  # fmt: skip

        @functools.wraps(verb)
        def wrapper(**kwargs: Any) -> Any:
            skip_cache(kwargs.pop("no_cache"))
            options = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
            return verb(**kwargs, workload_options=options)

        params = sorted(own + added, key=lambda p: p.kind == inspect.Parameter.KEYWORD_ONLY)
        wrapper.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params]
        )
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        del wrapper.__wrapped__  # typer must read the signature above, not the verb's
        return wrapper

    return decorate


def build_workload(
    *,
    batch: int = DEFAULT.batch_size,
    seq: int | None = DEFAULT.seq_len,
    image_size: int | None = DEFAULT.image_size,
    mode: str = DEFAULT.mode,
    precision: str | None = None,
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
    **techniques: Any,
) -> Workload:
    """The Workload the parsed options describe (keywords named as the parameters of the verbs;
    `techniques` are the Workload fields whose option has the field's name, e.g. `quantize`).

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
    if techniques.get("offload_activations", False) is None:  # the option not given
        techniques["offload_activations"] = False
    return Workload(
        **given,
        **techniques,
        batch_size=batch,
        seq_len=seq,
        image_size=image_size,
        mode=mode,
        precision=precision or (DEFAULT.precision if mode == "train" else AUTO_PRECISION),
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
