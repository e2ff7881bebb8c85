"""Knowledge distillation: a student trained on a frozen teacher's distribution over the
vocabulary, in one step with both models.

Each micro-batch runs the student's forward, then the teacher's forward under `torch.no_grad()`
(the order of torchtune's `KDRecipeSingleDevice._loss_step` and TRL's `GKDTrainer.compute_loss`),
and the loss

    loss = kd_ratio * KD + (1 - kd_ratio) * CE
    KD   = T^2 * mean over counted positions of KL(p_teacher || p_student)
         = T^2 * mean_i sum_v p_t(v | i) (log p_t(v | i) - log p_s(v | i)),  p = softmax(logits / T)

which is Hinton et al. 2015 ("Distilling the Knowledge in a Neural Network", the T^2 factor and
the weighted sum with the hard-label loss), computed as TRL's `generalized_jsd_loss` computes its
beta=0 case (`F.kl_div(student_log_probs, teacher_log_probs, reduction="none",
log_target=True)` summed over the vocabulary, masked where labels are -100, divided by the
positions counted) and as torchtune's `ForwardKLLoss` weights it (`kd_ratio`). Positions are
counted as transformers' `ForCausalLMLoss` counts them: position i counts when label i+1 is not
-100 (without labels, every position counts). CE is the model's own loss (given the labels).

Variants (`distill_loss`, `teacher_top_k`):
- "kl": both logits (B, S, V) alive for the loss, as above.
- "chunked-kl": the student and the teacher return their last hidden states (their forwards
  stop before the output head), and the loss runs over `chunks` pieces of the B*S positions,
  each piece's student logits, teacher logits (under no_grad) and KL computed under
  non-reentrant `torch.utils.checkpoint`, recomputed in backward: at most one chunk of either
  logits is alive (as memfit.techniques.chunked_loss does for the cross-entropy; torchtune's
  `ForwardKLWithChunkedOutputLoss` chunks the loss but keeps every chunk's logits).
- top-k (offline): the teacher ran beforehand; its top-k logits and their token ids come with
  the batch (`TOPK_LOGITS`, `TOPK_IDS`, each (B, S, K)), and no teacher runs in the step. The
  teacher's distribution is the softmax of its k logits (renormalised over them); the student's
  log-probabilities are its full-vocabulary log-softmax gathered at the k ids (the sparse
  distillation of offline-logit pipelines such as arcee-ai's DistillKit).

The teacher is the user's module (`apply_(student, plan, teacher=teacher)`): `apply_` casts it to
`precision`, quantizes it (`quantize`, as QLoRA bases are), moves it to the device, puts it in
eval mode and freezes it, all in place. Trace-time preparation: memfit.techniques.
distillation_trace.

Known limits: causal LMs with one output head (`check_causal_lm`) and the same vocabulary;
one GPU; the estimate assumes `kd_ratio` strictly between 0 and 1 (both losses computed) and
`temperature` does not change memory (the division allocates either way).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from memfit.errors import BadInputError
from memfit.techniques.checkpointing import region_listeners
from memfit.techniques.chunked_loss import IGNORE_INDEX, check_causal_lm
from memfit.techniques.registry import Build, handler, wrap_forward_once
from memfit.workload import DISTILL_LOSSES, QUANTIZE, TEACHER_PRECISIONS, Workload, check_choice

#: Chunks of the "chunked-kl" loss: torchtune's KD recipes' `num_output_chunks` (8).
DISTILL_CHUNKS = 8
#: Weight of the KD term against the hard-label cross-entropy: torchtune's KD recipes'
#: `kd_ratio` default (0.5).
DEFAULT_KD_RATIO = 0.5
#: Batch keys of offline top-k teacher logits: (B, S, K) float logits and int64 token ids.
TOPK_LOGITS = "teacher_topk_logits"
TOPK_IDS = "teacher_topk_ids"

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True, kw_only=True)
class DistillationConfig:
    """Train the model on a teacher's distribution (see the module docstring).

    Attributes:
        teacher: the teacher's model source, as reports name it (a catalog name, config.json
            or file.py:build); `apply_` takes the teacher module itself (`teacher=`).
        precision: the teacher's weights, one of workload.TEACHER_PRECISIONS.
        quantize: the teacher's weights quantized, one of workload.QUANTIZE, or None.
        loss: "kl" or "chunked-kl" (workload.DISTILL_LOSSES).
        top_k: offline top-k teacher logits in the batch instead of a teacher forward.
        chunks: pieces of the positions with "chunked-kl".
        temperature: T of the softmaxes (the KD term is scaled by T^2).
        kd_ratio: weight of the KD term; 1 - kd_ratio weighs the model's cross-entropy.
    """

    teacher: str
    precision: str = "bf16"
    quantize: str | None = None
    loss: str = "kl"
    top_k: int | None = None
    chunks: int = DISTILL_CHUNKS
    temperature: float = 1.0
    kd_ratio: float = DEFAULT_KD_RATIO

    def __post_init__(self) -> None:
        check_choice("teacher_precision", self.precision, TEACHER_PRECISIONS)
        if self.quantize is not None:
            check_choice("teacher_quantize", self.quantize, QUANTIZE)
        check_choice("distill_loss", self.loss, DISTILL_LOSSES)
        for name, low in (("top_k", 1), ("chunks", 2)):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < low):
                raise BadInputError(
                    f"DistillationConfig.{name} must be an integer >= {low}, got {v!r}."
                )
        t, r = self.temperature, self.kd_ratio
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0:
            raise BadInputError(f"temperature must be a positive number, got {t!r}.")
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r <= 1:
            raise BadInputError(f"kd_ratio must be a number in [0, 1], got {r!r}.")

    @property
    def label(self) -> str:
        how = f"top-{self.top_k} offline logits" if self.top_k else self.precision
        if self.quantize:
            how += f", {self.quantize}"
        return f"distillation from {self.teacher} ({how}, {self.loss})"

    @property
    def chunked(self) -> bool:
        return self.loss == "chunked-kl"


def config_from_workload(w: Workload) -> DistillationConfig | None:
    """The workload's distillation, or None. The teacher's precision defaults to the
    student's compute dtype."""
    if w.teacher is None:
        return None
    default = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[w.compute_dtype_name]
    return DistillationConfig(
        teacher=w.teacher,
        precision=w.teacher_precision or default,
        quantize=w.teacher_quantize,
        loss=w.distill_loss,
        top_k=w.teacher_top_k,
    )


# -- the loss -------------------------------------------------------------------------------


def _kl_per_position(s_logits: torch.Tensor, t: torch.Tensor, t_ids: torch.Tensor | None,
                     temperature: float) -> torch.Tensor:  # fmt: skip
    """KL(p_teacher || p_student) per position, (N,), from student logits (N, V) and the
    teacher's logits (N, V), or its top-k logits (N, K) at token ids `t_ids` (N, K)."""
    s = F.log_softmax(s_logits.float() / temperature, dim=-1)  # (N, V)
    if t_ids is not None:
        s = s.gather(-1, t_ids)  # (N, K)
    t_log = F.log_softmax(t.float() / temperature, dim=-1)  # (N, V) or (N, K)
    return F.kl_div(s, t_log, reduction="none", log_target=True).sum(-1) * temperature**2


def _counted(labels: torch.Tensor | None, n: int, device: torch.device) -> torch.Tensor:
    """(N,) 1.0 where the position counts (its next label is not -100), else 0.0."""
    if labels is None:
        return torch.ones(n, device=device)
    shifted = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]  # (B, S)
    return (shifted.reshape(-1) != IGNORE_INDEX).to(device, torch.float32)


class DistillationLoss:
    """`loss(student_output, batch)`: the step's loss, running the teacher (TrainSetup's
    `loss_fn`, and the traced step's). The teacher is called as a model of its own (not
    inside the student's forward), so `memfit.measure()` finds it as a second model."""

    def __init__(self, config: DistillationConfig, student: torch.nn.Module,
                 teacher: torch.nn.Module | None) -> None:  # fmt: skip
        self.config = config
        self.teacher = teacher
        self.student_head = _head(student)
        self.teacher_head = _head(teacher) if teacher is not None else None

    def __call__(self, out: Any, batch: Any) -> torch.Tensor:
        cfg = self.config
        labels = batch.get("labels")
        t_ids = batch.get(TOPK_IDS) if cfg.top_k else None
        if cfg.top_k:
            teacher_out = batch[TOPK_LOGITS]  # (B, S, K)
        else:
            assert self.teacher is not None
            inputs = {k: v for k, v in batch.items() if k not in _NOT_MODEL_INPUTS}
            inputs["use_cache"] = False  # no KV cache kept through the teacher's forward
            with torch.no_grad():
                t_out = self.teacher(**inputs)
            teacher_out = t_out.logits if not cfg.chunked else t_out.last_hidden_state
            del t_out
        if cfg.chunked:
            return self._chunked(out.last_hidden_state, teacher_out, t_ids, labels)
        s_logits = out.logits  # (B, S, V)
        n = s_logits.shape[0] * s_logits.shape[1]
        counted = _counted(labels, n, s_logits.device)
        kl = _kl_per_position(
            s_logits.reshape(n, -1), teacher_out.reshape(n, -1),
            t_ids.reshape(n, -1) if t_ids is not None else None, cfg.temperature,
        )  # fmt: skip
        del teacher_out
        kd = (kl * counted).sum() / counted.sum()
        if out.loss is None:
            return kd
        return cfg.kd_ratio * kd + (1 - cfg.kd_ratio) * out.loss

    def _chunked(self, h_s: torch.Tensor, t: torch.Tensor, t_ids: torch.Tensor | None,
                 labels: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        cfg = self.config
        n = h_s.shape[0] * h_s.shape[1]
        counted = _counted(labels, n, h_s.device)
        shifted = None
        if labels is not None and cfg.kd_ratio < 1:
            shifted = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].reshape(-1)
        pieces = [
            torch.tensor_split(x.reshape(n, *x.shape[2:]), cfg.chunks) if x is not None
            else [None] * cfg.chunks
            for x in (h_s, t, t_ids, shifted)
        ]  # fmt: skip
        run = functools.partial(_chunk, self, counted)
        total = None
        for i, (h_i, t_i, ids_i, y_i) in enumerate(zip(*pieces, strict=True)):
            part = checkpoint(run, i, h_i, t_i, ids_i, y_i, use_reentrant=False)
            total = part if total is None else total + part
        assert total is not None
        return total / counted.sum()


def _chunk(loss: DistillationLoss, counted: torch.Tensor, i: int, h: torch.Tensor,
           t: torch.Tensor, t_ids: Any, y: Any) -> torch.Tensor:  # fmt: skip
    """One chunk of "chunked-kl": the summed KD (and cross-entropy) of its positions. The
    region listeners (the tracker) hear it as a checkpointed region, so its recomputation in
    backward is traced as one."""
    cfg = loss.config
    path = loss.student_head[0]
    for f in region_listeners:
        f(path, True)
    try:
        s_logits = loss.student_head[1](h)  # (n, V)
        if cfg.top_k is None:
            assert loss.teacher_head is not None
            with torch.no_grad():
                t = loss.teacher_head[1](t)  # (n, V)
        part = torch.tensor_split(counted, cfg.chunks)[i]
        kl = _kl_per_position(s_logits, t, t_ids, cfg.temperature)
        del t
        out = cfg.kd_ratio * (kl * part).sum()
        if y is not None:
            ce = F.cross_entropy(s_logits.float(), y, ignore_index=IGNORE_INDEX, reduction="sum")
            out = out + (1 - cfg.kd_ratio) * ce
        return out
    finally:
        for f in region_listeners:
            f(path, False)


#: Batch keys that are not the models' inputs.
_NOT_MODEL_INPUTS = frozenset({"labels", TOPK_LOGITS, TOPK_IDS})


def _inner(model: torch.nn.Module) -> torch.nn.Module:
    """A peft model's inner transformers model (peft's forward calls it), else the model."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def _head(model: torch.nn.Module) -> tuple[str, torch.nn.Module]:
    inner = _inner(model)
    _, head = check_causal_lm(inner)
    return next((n for n, m in inner.named_modules() if m is head), "lm_head"), head


# -- the forwards ---------------------------------------------------------------------------


def wrap_forward(model: torch.nn.Module, config: DistillationConfig, *, student: bool) -> None:
    """Make `model(**batch)` what the distillation step needs (in place; once): the batch's
    top-k keys dropped, the labels given to the student only when its cross-entropy counts,
    and with "chunked-kl" the last hidden states returned instead of logits."""
    inner = _inner(model)
    base, _ = check_causal_lm(inner)
    keep_labels = student and config.kd_ratio < 1
    wrap_forward_once(
        inner, "_memfit_distillation", config,
        lambda current: functools.partial(
            _forward, inner, current, base, config.chunked, keep_labels
        ),
    )  # fmt: skip


def _forward(model: torch.nn.Module, inner: Callable[..., Any] | None, base: torch.nn.Module,
             chunked: bool, keep_labels: bool, *args: Any, **kwargs: Any) -> Any:  # fmt: skip
    kwargs = {k: v for k, v in kwargs.items() if k not in (TOPK_LOGITS, TOPK_IDS)}
    if not keep_labels or chunked:
        kwargs.pop("labels", None)
    if chunked:
        from transformers.modeling_outputs import BaseModelOutput

        kwargs.setdefault("use_cache", False)
        return BaseModelOutput(last_hidden_state=base(*args, **kwargs)[0])  # (B, S, H)
    fwd = inner if inner is not None else functools.partial(type(model).forward, model)
    return fwd(*args, **kwargs)


def vocabulary(model: torch.nn.Module) -> int:
    """Tokens of a causal LM's output head (its weight's first dimension)."""
    weight = getattr(_head(model)[1], "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise BadInputError(f"{type(model).__name__}'s output head has no weight to read.")
    return int(weight.shape[0])


def check_vocabularies(student: torch.nn.Module, teacher: torch.nn.Module) -> None:
    """The KL compares distributions over one vocabulary: the heads' output sizes agree."""
    vs, vt = (vocabulary(m) for m in (student, teacher))
    if vs != vt:
        raise BadInputError(
            f"The teacher's vocabulary ({vt} tokens) differs from the student's ({vs}): the KL "
            "compares distributions over one vocabulary. Use a teacher of the same tokenizer."
        )


# -- apply_ ---------------------------------------------------------------------------------


@handler
def _distillation(config: DistillationConfig, build: Build) -> None:
    teacher = build.teacher
    if config.top_k is not None and teacher is not None:
        raise BadInputError(
            f"apply_(teacher=...) with top_k={config.top_k}: offline top-k logits come with "
            "the batch and the teacher does not run. Drop teacher=."
        )
    if config.top_k is None:
        if not isinstance(teacher, torch.nn.Module):
            raise BadInputError(
                f"{config.label} needs the teacher model: apply_(student, plan, "
                "teacher=teacher_model)."
            )
        check_vocabularies(build.model, teacher)
        _prepare_teacher(teacher, config, build.device)
        if config.chunked:
            wrap_forward(teacher, config, student=False)
    wrap_forward(build.model, config, student=True)
    build.loss_fn = DistillationLoss(config, build.model, teacher)
    build.applied.append(config.label)
    keys = f" (the batch carries {TOPK_LOGITS!r} and {TOPK_IDS!r})" if config.top_k else ""
    build.left_to_caller.append(
        f"distillation: setup.step computes the loss with setup.loss_fn(output, batch){keys}; "
        "another trainer must call it on the student's output."
    )


def _prepare_teacher(teacher: torch.nn.Module, config: DistillationConfig,
                     device: torch.device) -> None:  # fmt: skip
    """The teacher as the step runs it, in place: cast, quantized, on the device, frozen."""
    teacher.to(DTYPES[config.precision])  # floating parameters and buffers only
    teacher.requires_grad_(False)
    if config.quantize is not None:
        from memfit.techniques.quantize.config import QuantizeConfig, targets
        from memfit.techniques.quantize.real import quantize_in_place

        q = QuantizeConfig(method=config.quantize)
        names, _ = targets(teacher, q)
        quantize_in_place(teacher, q, device, names)
    teacher.to(device)
    teacher.eval()
