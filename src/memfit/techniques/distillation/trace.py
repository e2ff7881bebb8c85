"""The trace-time preparation of knowledge distillation (memfit.techniques.distillation.config): the
teacher built from its spec on fake tensors as the student is, cast and quantized as `apply_`
casts and quantizes the user's teacher, its storages filed by the tracker, and the step's loss.

How reports name the teacher's memory: its weights are `parameters` (and `buffers`) of modules
under the prefix `teacher.` (`by_module` shows `teacher.model.layers.0.mlp`, ...); what its
forward allocates is filed as any no_grad forward's is (temporaries, freed before the loss
ends; its logits among them), attributed to `teacher.*` modules. The teacher is traced whole
(its blocks are not replayed) and its FLOPs count in the forward phase.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from memfit.events import Category
from memfit.techniques.distillation.config import (
    DTYPES,
    TOPK_IDS,
    TOPK_LOGITS,
    DistillationConfig,
    DistillationLoss,
    check_vocabularies,
    config_from_workload,
    vocabulary,
    wrap_forward,
)
from memfit.workload import Workload

#: Module-path prefix of the teacher's modules in reports.
TEACHER_PREFIX = "teacher"


class DistillationTrace:
    """The teacher (or the offline top-k inputs) of a traced distillation step.

    Built before the tracker starts (`for_trace`); `register` files the teacher's storages,
    `add_inputs` adds offline top-k logits to a micro-batch, `loss` is the step's loss.
    """

    def __init__(self, config: DistillationConfig, student: torch.nn.Module,
                 teacher: torch.nn.Module | None, notes: list[str]) -> None:  # fmt: skip
        self.config = config
        self.teacher = teacher
        self.notes = notes
        self.loss = DistillationLoss(config, student, teacher)
        self.vocab = vocabulary(student)

    def register(self, tracker: Any) -> None:
        """File the teacher's weights as parameters (buffers) of `teacher.*` modules."""
        if self.teacher is None:
            return
        holder = torch.nn.Module()
        holder.add_module(TEACHER_PREFIX, self.teacher)
        tracker.add_model(holder)
        for n, p in self.teacher.named_parameters():
            mod = n.rsplit(".", 1)[0] if "." in n else ""
            tracker.register(p, Category.PARAMETERS, _path(mod))
        for n, b in self.teacher.named_buffers():
            mod = n.rsplit(".", 1)[0] if "." in n else ""
            tracker.register(b, Category.BUFFERS, _path(mod))

    def add_inputs(self, batch: Any) -> Any:
        """With offline top-k logits, the batch carries them: (B, S, K) float32 logits and
        int64 token ids."""
        k = self.config.top_k
        if k is None:
            return batch
        ids = batch["input_ids"]  # (B, S)
        b, s = ids.shape
        batch[TOPK_LOGITS] = torch.empty(b, s, k, dtype=torch.float32)  # (B, S, K)
        batch[TOPK_IDS] = torch.randint(0, self.vocab, (b, s, k))  # (B, S, K)
        return batch


def _path(mod: str) -> str:
    return f"{TEACHER_PREFIX}.{mod}" if mod else TEACHER_PREFIX


def for_trace(
    student: torch.nn.Module,
    w: Workload,
    fake_mode: Any,
    materialize: Callable[[torch.nn.Module, torch.dtype, bool], torch.nn.Module],
) -> DistillationTrace | None:
    """What `apply_` will do for `w.teacher`, done on fake tensors; None without a teacher.

    `materialize(model, dtype, copy)` swaps a built model's tensors for fake ones (the
    estimator's `materialize_fake`)."""
    config = config_from_workload(w)
    if config is None or not w.training:
        return None
    teacher = None
    notes: list[str] = []
    if config.top_k is None:
        from memfit.models.sources import resolve_model

        spec = resolve_model(config.teacher)
        if spec.owns_model:
            with torch.device("meta"):
                teacher = spec.build(None, w.attention)
        else:
            teacher = spec.build(None, w.attention)
        teacher = materialize(teacher, DTYPES[config.precision], not spec.owns_model)
        teacher.requires_grad_(False)
        check_vocabularies(student, teacher)
        if config.quantize is not None:
            from memfit.techniques.quantize.config import QuantizeConfig
            from memfit.techniques.quantize.trace import quantize_for_trace

            q = QuantizeConfig(method=config.quantize)
            notes += [f"teacher: {n}" for n in quantize_for_trace(teacher, q, fake_mode, False)]
        teacher.eval()
        cfg = getattr(teacher, "config", None)
        if cfg is not None and hasattr(cfg, "use_cache"):
            cfg.use_cache = False
        if config.chunked:
            wrap_forward(teacher, config, student=False)
        count = sum(p.numel() for p in teacher.parameters())
        notes.append(
            f"{config.label}: the teacher's {count:,} stored parameter elements are filed as "
            f"parameters of '{TEACHER_PREFIX}.*' modules; its forward runs under no_grad after "
            "the student's."
        )
    wrap_forward(student, config, student=True)
    return DistillationTrace(config, student, teacher, notes)
