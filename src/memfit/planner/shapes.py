"""What the planner searches: the techniques it may use and the *shapes* they make.

A shape is everything about a configuration that changes the traced step (precision,
optimizer, checkpointing, LoRA / QLoRA, tied embeddings, the optimizer step in backward,
offloaded activations, a chunked loss, FSDP2's CPU offload); the micro-batch and the placements
that only move storages (optimizer state or the embedding on the CPU) are searched per shape by
`memfit.planner.search`.

The search runs in stages, so that a job that fits with the usual techniques is planned as fast
as before and the heavier savers are traced only when they are needed:

1. `shapes`: precision, optimizer, checkpointing, and the opt-in LoRA / QLoRA / tied embeddings.
2. `lean_shapes`, when nothing fits: the lean full fine-tune practitioners run on small cards
   (torchtune's low-memory recipes): pure bf16 (if allowed or widened), the optimizer step in
   backward (no gradients kept, no accumulation: the micro-batch is the whole per-GPU batch), a
   paged or 8-bit optimizer or Adafactor, checkpointing and offloaded activations, and a
   chunked loss for causal LMs.
3. `offload_shapes`, when nothing fits still: FSDP2's CPU offload of parameters, gradients and
   optimizer state (also on one GPU), at the cost of PCIe traffic every micro-batch.

Pure precision, unless allowed, is widened (WIDEN_WHEN_NOTHING_FITS) only after all three
stages found nothing in mixed precision; then the three run again with it
(`memfit.planner.search._staged_search`).

With a teacher (knowledge distillation, `Goal.teacher`), the distillation's own options are
searched too (`distillations`): the KL over chunks of the positions ("chunked-kl", with the
chunked loss), a teacher quantized to NF4 or LLM.int8 (opt-in: its outputs change slightly) and
the teacher's top-k logits computed beforehand and read with the batch (opt-in: it changes the
recipe, and needs a pass of the teacher over the data). Stage 1 tries each on the usual
optimizer; the later stages use the lightest allowed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from memfit.errors import BadInputError, closest
from memfit.models.sources import ModelSpec
from memfit.optimizers import (
    DEFAULT_OPTIMIZER,
    NO_OPTIMIZER,
    SPECS,
    paged_variant,
    plan_choices,
    spec_of,
)
from memfit.precision import PURE_BF16, precision_of

#: Techniques the planner can use, by the name `allow` / `forbid` take.
TECHNIQUES = {
    "micro-batch": "split the global batch into micro-batches with gradient accumulation",
    "mixed-precision": "fp16/bf16 autocast with fp32 weights",
    "pure-precision": "16-bit weights, gradients and optimizer state (bf16-true)",
    "checkpointing": "recompute each repeated block's activations in backward",
    # The optimizers the planner may switch to, from their OptimizerSpec rows.
    **{s.allow: s.allow_help or s.title for s in SPECS.values() if s.allow is not None},
    "paged-optimizer": "optimizer state in CUDA unified memory (the paged variant of the "
    "optimizer, bitsandbytes)",
    "optimizer-in-backward": "step each parameter as its gradient lands (no accumulation)",
    "activation-offload": "keep saved activations in pinned CPU memory",
    "chunked-loss": "cross-entropy over chunks of the sequence (causal LMs); with a teacher, "
    "the distillation KL over chunks (chunked-kl)",
    "offload": "optimizer state and update on the CPU",
    "fsdp-offload": "FSDP2 CPU offload of parameters, gradients and optimizer state",
    "ddp": "with several GPUs, DistributedDataParallel: the whole model on each GPU (no "
    "sharding), one gradient all-reduce per step, instead of FSDP2",
    "cpu-embedding": "input embedding table on the CPU",
    "tied-embeddings": "share the input embedding with the output projection (changes the model)",
    "lora": "train LoRA adapters on a frozen base (changes what is trained)",
    "qlora": "LoRA adapters on a 4-bit NF4 base (changes what is trained and the weights)",
    "quantized-teacher": "the distillation teacher's weights in NF4 or LLM.int8 (its outputs "
    "change slightly)",
    "offline-logits": "the teacher's top-k logits computed beforehand and read with the batch: "
    "no teacher in the step (changes the recipe; one teacher pass over the data first)",
}
#: Techniques that change the model, what is trained, or its numerics (no fp32 master
#: weights): used only when allowed explicitly.
OPT_IN = frozenset(
    {"tied-embeddings", "lora", "qlora", "pure-precision", "quantized-teacher", "offline-logits"}
)
#: Opt-in techniques searched anyway when nothing fits without them, because they keep the
#: model and what is trained (pure bf16 is how torchtune fine-tunes full models); the plan says
#: so, and `--forbid` refuses them. LoRA and tied embeddings change the model: suggested only.
WIDEN_WHEN_NOTHING_FITS = frozenset({"pure-precision"})
#: LoRA rank the planner tries when LoRA is allowed.
PLAN_LORA_RANK = 16
#: Chunks of a chunked cross-entropy: torchtune's CEWithChunkedOutputLoss default
#: (num_output_chunks=8).
PLAN_LOSS_CHUNKS = 8
#: How the planner offloads activations: torchtune's filters keep the weights (which every
#: matmul saves) and tiny tensors on the device, so only activations cross PCIe.
PLAN_ACTIVATION_OFFLOAD = "torchtune"
#: The quantization QLoRA uses (Dettmers et al. 2023: NF4 with double quantization).
PLAN_QLORA_QUANTIZE = "nf4-dq"
#: Teacher quantizations tried with "quantized-teacher": bitsandbytes NF4 (4-bit; the lightest)
#: and LLM.int8 (8-bit, closer to the 16-bit teacher's outputs).
PLAN_TEACHER_QUANTIZE = ("nf4", "int8")
#: Teacher logits kept per position with "offline-logits": arcee-ai DistillKit's example of a
#: teacher served by vLLM (examples/vllm_teacher.yml, `top_k: 256`).
PLAN_TEACHER_TOP_K = 256


@dataclass(frozen=True)
class Distillation:
    """How a shape distills from the goal's teacher (workload.Workload's fields of the same
    names); the default is the plain one: the KL of both full logits, the teacher online and
    unquantized."""

    distill_loss: str = "kl"
    teacher_quantize: str | None = None
    teacher_top_k: int | None = None

    @property
    def plain(self) -> bool:
        return self == PLAIN

    @property
    def chunked(self) -> bool:
        return self.distill_loss == "chunked-kl"


PLAIN = Distillation()


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class Shape:
    precision: str
    optimizer: str
    checkpointing: str
    lora: bool
    tie_embeddings: bool
    quantize: str | None = None
    optimizer_in_backward: bool = False
    #: False, or the variant (memfit.workload.ACTIVATION_OFFLOAD).
    offload_activations: bool | str = False
    chunked_loss: int | None = None
    fsdp_cpu_offload: bool = False
    distill: Distillation = field(default=PLAIN)
    #: With several GPUs: DistributedDataParallel instead of FSDP2.
    ddp: bool = False

    def distillation(self, goal: Any) -> dict[str, Any]:
        """The Workload fields of the goal's teacher and this shape's distillation ({} without
        a teacher)."""
        teacher = teacher_of(goal)
        if teacher is None:
            return {}
        d = self.distill
        return {
            "teacher": teacher,
            "distill_loss": d.distill_loss,
            "teacher_quantize": d.teacher_quantize,
            "teacher_top_k": d.teacher_top_k,
        }


def teacher_of(goal: Any) -> str | None:
    """The goal's distillation teacher (`Goal.teacher`), or None."""
    return getattr(goal, "teacher", None)


def distillation_of(w: Any) -> Distillation:
    """A workload's distillation options as a shape holds them."""
    if w.teacher is None:
        return PLAIN
    return Distillation(w.distill_loss, w.teacher_quantize, w.teacher_top_k)


def _optimizer_weight(name: str) -> int:
    # OptimizerSpec.weight; paged state lives in unified memory, outside the caching
    # allocator: it pages out rather than fail, so on the device it weighs nothing.
    return 0 if name == NO_OPTIMIZER else spec_of(name).weight


def _optimizer_heavier(a: str, b: str) -> bool:
    # A partial order: Adam(W) keeps two full moments, more than any lighter optimizer; the
    # lighter ones (8-bit AdamW, Adafactor, ...) are not comparable with each other.
    return a == b or _optimizer_weight(a) > _optimizer_weight(b)


def _teacher_heavier(a: Distillation, b: Distillation) -> bool:
    # A teacher in the step is heavier than none (offline logits: (B, S, K) values and ids in
    # the batch); a 16-bit teacher than an NF4 one. LLM.int8 is compared with neither: its
    # weights are lighter than 16-bit ones, its int32 matmul outputs heavier than both.
    if a.teacher_top_k is not None or b.teacher_top_k is not None:
        return a.teacher_top_k == b.teacher_top_k or b.teacher_top_k is not None
    return a.teacher_quantize == b.teacher_quantize or (
        a.teacher_quantize is None and b.teacher_quantize in ("nf4", "nf4-dq", "fp4")
    )


def heavier(a: Shape, b: Shape) -> bool:
    """True when shape `a` needs at least as much memory as `b` in every respect, at the same
    micro-batch. Shapes with and without the step in backward are never compared: they run at
    different micro-batches (no accumulation with the step in backward)."""
    return bool(
        precision_of(a.precision).width >= precision_of(b.precision).width
        and _optimizer_heavier(a.optimizer, b.optimizer)
        and (a.checkpointing == "off" or b.checkpointing == "blocks")
        and (not a.lora or b.lora)
        and (a.tie_embeddings <= b.tie_embeddings)
        and (a.quantize is None or a.quantize == b.quantize)
        and a.optimizer_in_backward == b.optimizer_in_backward
        and (not a.offload_activations or a.offload_activations == b.offload_activations)
        and (a.chunked_loss is None or b.chunked_loss is not None)
        and (not a.fsdp_cpu_offload or b.fsdp_cpu_offload)
        and (a.ddp or not b.ddp)  # a whole model per GPU holds more than its shard
        and (not a.distill.chunked or b.distill.chunked)
        and _teacher_heavier(a.distill, b.distill)
    )


def allowed_techniques(allow: tuple[str, ...], forbid: tuple[str, ...]) -> set[str]:
    for name in (*allow, *forbid):
        if name not in TECHNIQUES:
            raise BadInputError(
                f"Unknown technique {name!r}.{closest(name, list(TECHNIQUES))} "
                f"Known: {', '.join(TECHNIQUES)}."
            )
    both = set(allow) & set(forbid)
    if both:
        raise BadInputError(
            f"{', '.join(sorted(both))} is both allowed and forbidden; drop one of the flags."
        )
    return (set(TECHNIQUES) - OPT_IN - set(forbid)) | set(allow)


def _sorted(shapes: list[Shape]) -> list[Shape]:
    # Fastest first (16-bit compute, no recomputation, nothing over PCIe), lightest next: a good
    # plan found early bounds the rest, and a light shape that fails rules out the heavier ones.
    # Offline logits run no teacher (faster); a quantized teacher dequantizes (slower).
    return sorted(shapes, key=lambda s: (
        s.precision == "fp32", s.fsdp_cpu_offload, bool(s.offload_activations), not s.ddp,
        s.distill.teacher_top_k is None, s.checkpointing != "off",
        s.distill.teacher_quantize is not None, s.distill.chunked,
        precision_of(s.precision).width + _optimizer_weight(s.optimizer) - s.lora
        - s.tie_embeddings,
    ))  # fmt: skip


def shapes(goal: Any, allowed: set[str], gpu: Any, spec: ModelSpec) -> list[Shape]:
    """Stage 1: the usual techniques and the opt-in ones allowed."""
    low = "bf16" if gpu.bf16 else "fp16"
    if goal.precision:
        precisions = [goal.precision]
    else:
        # fp32 needs more memory than mixed precision and runs slower, so it is searched only
        # when mixed precision is not allowed.
        precisions = [f"{low}-mixed"] if "mixed-precision" in allowed else ["fp32"]
        if "pure-precision" in allowed and gpu.bf16:
            precisions.append(PURE_BF16)
    optimizers = [goal.optimizer] if goal.optimizer else [DEFAULT_OPTIMIZER, *plan_choices(allowed)]
    ckpt = ["off", "blocks"] if "checkpointing" in allowed and spec.num_layers else ["off"]
    adapters: list[tuple[bool, str | None]] = [(False, None)]
    if "lora" in allowed:
        adapters.append((True, None))
    if "qlora" in allowed:
        adapters.append((True, PLAN_QLORA_QUANTIZE))
    tied = [False, True] if "tied-embeddings" in allowed else [False]
    usual = goal.optimizer or DEFAULT_OPTIMIZER
    kinds = distillations(goal, allowed)
    out = [
        Shape(p, o, c, lora, t, quantize=q, distill=d)
        for p, o, c, (lora, q), t, d in itertools.product(
            precisions, optimizers, ckpt, adapters, tied, kinds
        )
        # LoRA's optimizer state is tiny, and a distillation option changes the teacher's side:
        # try them only with the goal's (or AdamW) optimizer.
        if (not lora and d.plain) or o == usual
    ]
    if len(adapters) > 1 and not goal.precision and gpu.bf16 and PURE_BF16 not in precisions:
        # A frozen base needs no fp32 master weights: LoRA is usually trained on a 16-bit base.
        for c, (lora, q), t, d in itertools.product(ckpt, adapters[1:], tied, kinds):
            out.append(Shape(PURE_BF16, usual, c, lora, t, quantize=q, distill=d))
    return _sorted(out)


def with_ddp(shapes: list[Shape], allowed: set[str], n_gpus: int) -> list[Shape]:
    """`shapes` and, over several GPUs with "ddp" allowed, each of them under DDP instead of
    FSDP2 (not the step in backward, whose hooks memfit does not combine with DDP's)."""
    if n_gpus < 2 or "ddp" not in allowed:
        return shapes
    ddp = [
        replace(s, ddp=True) for s in shapes if not (s.optimizer_in_backward or s.fsdp_cpu_offload)
    ]
    return _sorted(shapes + ddp)


def distillations(goal: Any, allowed: set[str], *, lightest: bool = False) -> list[Distillation]:
    """The distillation options searched with the goal's teacher ([PLAIN] without one): the
    plain KL; the chunked KL ("chunked-loss"); the teacher in each of PLAN_TEACHER_QUANTIZE
    ("quantized-teacher"); offline top-k logits ("offline-logits"); and the lightest of them
    together. With `lightest`, only that one (the lean stages)."""
    if teacher_of(goal) is None:
        return [PLAIN]
    loss = "chunked-kl" if "chunked-loss" in allowed else "kl"
    quantized = list(PLAN_TEACHER_QUANTIZE) if "quantized-teacher" in allowed else []
    # A teacher precision the goal keeps means a teacher that runs: no offline logits.
    offline = "offline-logits" in allowed and getattr(goal, "teacher_precision", None) is None
    if offline:
        light = Distillation(loss, None, PLAN_TEACHER_TOP_K)
    else:
        light = Distillation(loss, quantized[0] if quantized else None)
    if lightest:
        return [light]
    out = [PLAIN, Distillation(loss)] + [Distillation("kl", q) for q in quantized]
    if offline:
        out.append(Distillation("kl", None, PLAN_TEACHER_TOP_K))
    return list(dict.fromkeys([*out, light]))


def lean_shapes(goal: Any, allowed: set[str], gpu: Any, spec: ModelSpec) -> list[Shape]:
    """Stage 2 (nothing fitted in stage 1): a lean full fine-tune (see the module docstring)."""
    if goal.precision:
        precision = goal.precision
    elif "pure-precision" in allowed and gpu.bf16:
        precision = PURE_BF16
    else:
        precision = f"{'bf16' if gpu.bf16 else 'fp16'}-mixed"
    if goal.optimizer:
        optimizers = [goal.optimizer]
    else:
        optimizers = [DEFAULT_OPTIMIZER, *plan_choices(allowed)]
        if "paged-optimizer" in allowed:
            optimizers = [paged_variant(o) or o for o in optimizers]
    in_backward = [False]
    # The GradScaler unscales all gradients at once: no step in backward with fp16-mixed.
    if "optimizer-in-backward" in allowed and not precision_of(precision).scaler:
        in_backward.append(True)
    ckpt = ["blocks", "off"] if "checkpointing" in allowed and spec.num_layers else ["off"]
    act: list[bool | str] = [False]
    if "activation-offload" in allowed:
        act.append(PLAN_ACTIVATION_OFFLOAD)
    chunks = PLAN_LOSS_CHUNKS if "chunked-loss" in allowed and spec.task == "causal-lm" else None
    # With a teacher the distillation's loss replaces the model's: it is chunked instead.
    (distill,) = distillations(goal, allowed, lightest=True)
    if teacher_of(goal) is not None:
        chunks = None
    out = [
        Shape(precision, o, c, False, False, optimizer_in_backward=ib, offload_activations=a,
              chunked_loss=chunks, distill=distill)
        for o, ib, c, a in itertools.product(optimizers, in_backward, ckpt, act)
    ]  # fmt: skip
    return _sorted(out)


def offload_shapes(goal: Any, allowed: set[str], gpu: Any, spec: ModelSpec) -> list[Shape]:
    """Stage 3 (nothing fitted in stage 2): FSDP2's CPU offload, with checkpointing and the
    goal's (or AdamW) optimizer: its state lives on the CPU, so a lighter one gains nothing on
    the device."""
    if "fsdp-offload" not in allowed:
        return []
    lean = lean_shapes(goal, allowed - {"optimizer-in-backward"}, gpu, spec)
    usual = goal.optimizer or DEFAULT_OPTIMIZER
    return _sorted(
        [
            Shape(s.precision, usual, s.checkpointing, False, False,
                  offload_activations=s.offload_activations, chunked_loss=s.chunked_loss,
                  fsdp_cpu_offload=True, distill=s.distill)
            for s in lean
            if s.optimizer == lean[0].optimizer
        ]
    )  # fmt: skip


def placements(allowed: set[str]) -> list[tuple[bool, bool]]:
    offload = [False, True] if "offload" in allowed else [False]
    emb = [False, True] if "cpu-embedding" in allowed else [False]
    return list(itertools.product(offload, emb))


def shape_of(w: Any) -> Shape:
    """The shape a workload has (the search's workloads are built from shapes)."""
    return Shape(
        w.precision, w.optimizer, w.checkpointing, w.lora is not None, w.tie_embeddings,
        quantize=w.quantize, optimizer_in_backward=w.optimizer_in_backward,
        offload_activations=w.offload_activations, chunked_loss=w.chunked_loss,
        fsdp_cpu_offload=w.fsdp_cpu_offload, distill=distillation_of(w), ddp=w.ddp,
    )  # fmt: skip


def is_lean(shape: Shape) -> bool:
    """Whether the shape uses a technique of the later stages or QLoRA."""
    return bool(
        shape.quantize
        or shape.optimizer_in_backward
        or shape.offload_activations
        or shape.chunked_loss
        or shape.fsdp_cpu_offload
        or not shape.distill.plain
    )


def is_plain(shape: Shape, goal: Any) -> bool:
    """Whether `shape` is the baseline's: the goal's or AdamW optimizer, no techniques."""
    return (
        shape.optimizer == (goal.optimizer or DEFAULT_OPTIMIZER)
        and shape.checkpointing == "off"
        and not shape.lora
        and not shape.tie_embeddings
        and not is_lean(shape)
    )
