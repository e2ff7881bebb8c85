"""The checks a `Workload` runs on construction that span several of its options
(distillation, quantized weights, the step in backward), and the helpers every check uses.
Each raises BadInputError naming the value and the fix."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memfit.errors import BadInputError, closest
from memfit.precision import precision_of
from memfit.workload.choices import DISTILL_LOSSES, QUANTIZE, TEACHER_PRECISIONS

if TYPE_CHECKING:
    from memfit.workload import Workload


def is_int(value: object) -> bool:
    """An int, not a bool (True is an int to Python, never a count to a user)."""
    return isinstance(value, int) and not isinstance(value, bool)


def positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise BadInputError(
            f"{name} must be a positive integer, got {value!r}. Pass e.g. {name}=1."
        )


def names(what: str, value: object) -> tuple[str, ...]:
    """Module names as a tuple: from a tuple or list of names, or a comma-separated string."""
    if isinstance(value, str):
        items: list[object] = [v.strip() for v in value.split(",") if v.strip()]
        if not items:
            raise BadInputError(
                f"{what} {value!r} names no module. Give names, e.g. 'q_proj,v_proj', or leave "
                "it out."
            )
    elif isinstance(value, (tuple, list)):
        items = list(value)
    else:
        raise BadInputError(
            f"{what} must be a tuple of module names or a comma-separated string, got {value!r}."
        )
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise BadInputError(f"{what}: {item!r} in {value!r} is not a module name.")
    return tuple(str(i).strip() for i in items)


def check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        hint = closest(value, list(allowed)) if isinstance(value, str) else ""
        raise BadInputError(f"Unknown {name} {value!r}.{hint} Choose one of: {', '.join(allowed)}.")


def check_teacher(self: Workload) -> None:
    """The distillation options: each on its own, then together."""
    given = {k: getattr(self, k) for k, d in (("teacher_precision", None),
             ("teacher_quantize", None), ("distill_loss", "kl"), ("teacher_top_k", None))
             if getattr(self, k) != d}  # fmt: skip
    if self.teacher is None:
        if given:
            names = ", ".join(f"{k}={v!r}" for k, v in given.items())
            raise BadInputError(
                f"{names}: only distillation uses it, and no teacher is given. Add "
                "teacher='MODEL' (the teacher's catalog name or config.json), or drop it."
            )
        return
    if not isinstance(self.teacher, str) or not self.teacher.strip():
        raise BadInputError(
            f"teacher must be a model name such as 'llama-3.2-1b' (see `memfit models`), "
            f"a config.json or file.py:build, got {self.teacher!r}."
        )
    if self.teacher_precision is not None:
        check_choice("teacher_precision", self.teacher_precision, TEACHER_PRECISIONS)
    if self.teacher_quantize is not None:
        check_choice("teacher_quantize", self.teacher_quantize, QUANTIZE)
    check_choice("distill_loss", self.distill_loss, DISTILL_LOSSES)
    if self.teacher_top_k is not None:
        positive("teacher_top_k", self.teacher_top_k)
        runs = [f"{k}={given[k]!r}" for k in ("teacher_precision", "teacher_quantize")
                if k in given]  # fmt: skip
        if runs:
            it = "it" if len(runs) == 1 else "them"
            raise BadInputError(
                f"{', '.join(runs)} with teacher_top_k={self.teacher_top_k}: offline "
                "top-k logits come with the batch and the teacher does not run in the "
                f"step. Drop {it}, or drop teacher_top_k."
            )
    if self.chunked_loss is not None:
        raise BadInputError(
            f"chunked_loss={self.chunked_loss} with a teacher: the distillation loss "
            "replaces the model's own loss. Use distill_loss='chunked-kl' instead."
        )
    if self.fsdp:
        raise BadInputError(
            f"teacher with gpus={self.gpus}: memfit does not model sharding a teacher "
            "with FSDP2. Use gpus=1."
        )


def check_quantize(self: Workload) -> None:
    if self.prepare_kbit and self.quantize is None:
        raise BadInputError(
            "prepare_kbit applies peft's prepare_model_for_kbit_training to a quantized "
            "model, and quantize is not given. Add quantize='nf4', or drop prepare_kbit."
        )
    if self.quantize is None:
        return
    if self.training and self.lora is None:
        raise BadInputError(
            f"quantize={self.quantize!r} in training: quantized weights are frozen (no "
            "gradient flows into them), so only adapters can train. Add "
            "lora=LoraConfig(rank=16) for QLoRA, or use mode='inference'."
        )
    if self.fsdp:
        raise BadInputError(
            f"quantize={self.quantize!r} with gpus={self.gpus}: memfit does not model "
            "sharding quantized weights with FSDP2. Use gpus=1."
        )


def check_step_in_backward(self: Workload) -> None:
    if not self.optimizer_in_backward:
        return
    why = ""
    if self.optimizer == "none":
        why = "optimizer is 'none' (there is no step to move). Name an optimizer"
    elif self.grad_accum > 1:
        why = (
            f"grad_accum={self.grad_accum}: the step runs as each gradient lands, so "
            "gradients cannot accumulate over micro-batches. Use grad_accum=1"
        )
    elif precision_of(self.precision).scaler:
        why = (
            "precision='fp16-mixed': the GradScaler unscales and checks all gradients "
            "together before the step. Use bf16-mixed or bf16-true"
        )
    elif self.offload_optimizer or self.fsdp_cpu_offload:
        why = "the optimizer steps on the CPU after backward. Drop the offload"
    if why:
        raise BadInputError(
            f"optimizer_in_backward=True cannot combine with {why}, or drop optimizer_in_backward."
        )


def check_ddp(self: Workload) -> None:
    """DistributedDataParallel: several processes that train, each the whole model."""
    if not isinstance(self.ddp, bool):
        raise BadInputError(f"ddp must be True or False, got {self.ddp!r}.")
    if not self.ddp:
        return
    why = ""
    if self.gpus < 2:
        why = f"gpus={self.gpus}: DDP runs one process per GPU. Give gpus=N (N >= 2)"
    elif not self.training:
        why = f"mode={self.mode!r}: DDP synchronizes gradients, and there are none. Drop ddp"
    elif self.fsdp_cpu_offload:
        why = "fsdp_cpu_offload=True, an FSDP2 option. Drop it for DDP, or drop ddp for FSDP2"
    elif self.optimizer_in_backward:
        why = (
            "optimizer_in_backward=True: memfit does not model DDP's fused optimizer hook. "
            "Drop one of them"
        )
    if why:
        raise BadInputError(f"ddp=True cannot run with {why}.")
