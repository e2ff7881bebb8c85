"""Chunked cross-entropy for causal language models: the float32 logits are never all alive.

A causal-LM head computes logits (B, S, V) for every position, upcasts them to float32 and takes
the cross-entropy (transformers/loss/loss_utils.py `ForCausalLMLoss`); the logits, their float32
copy and the log-softmax saved for backward each hold B*S*V elements, the largest tensors of the
step for a big vocabulary. With `ChunkedLossConfig(chunks=N)` the model's forward, given
`labels`, runs the base model to its last hidden states and then, for each of N chunks of the
B*S token positions, `lm_head(h_chunk).float()` and the summed cross-entropy of the chunk under
non-reentrant `torch.utils.checkpoint`: a chunk's logits are freed once its loss is taken, and
recomputed in backward one chunk at a time. The loss is the sum over chunks divided by the
number of labels that are not -100, which is `ForCausalLMLoss` (labels padded on the right with
-100 and shifted by one, `ignore_index=-100`, mean over the tokens that count, or the sum over
`num_items_in_batch` when the trainer passes it).

What this follows and what differs: Liger Kernel's fused linear cross-entropy
(liger_kernel/ops/fused_linear_cross_entropy.py) also chunks the head's matmul, but computes
each chunk's gradients in forward and keeps the gradient of the hidden states instead of
recomputing; torchtune's `CEWithChunkedOutputLoss` (torchtune/modules/loss/ce_chunked_output_
loss.py) chunks the float32 upcast only, and keeps every chunk's logits for backward. Here the
head's matmul runs once more in backward (2 * B*S * hidden * V more FLOPs), and at most one
chunk of logits, its float32 copy and its softmax is alive at a time, in forward and backward.

The model returns a `CausalLMOutputWithPast` with the loss and no logits. Heads that change the
logits after the projection (Gemma's `final_logit_softcapping`, Cohere's `logit_scale`) or add
to the loss (a MoE router's auxiliary loss) are refused: the chunked loss would not be theirs.
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
from memfit.techniques.registry import Build, handler, wrap_forward_once
from memfit.workload import Workload

#: transformers' `ForCausalLMLoss` default `ignore_index` (transformers/loss/loss_utils.py).
IGNORE_INDEX = -100

#: Config attributes of heads whose logits or loss are not `lm_head(h)` and the plain
#: cross-entropy (transformers' Gemma2/3 `final_logit_softcapping`, Cohere `logit_scale`,
#: MoE `output_router_logits` adding the router's auxiliary loss).
_UNSUPPORTED_CONFIG = ("final_logit_softcapping", "logit_scale", "output_router_logits")


@dataclass(frozen=True, kw_only=True)
class ChunkedLossConfig:
    """Cross-entropy of a causal LM over `chunks` pieces of the token positions, each chunk's
    logits recomputed in backward, so that at most one chunk of logits is alive.

    Attributes:
        chunks: pieces of the B*S token positions (>= 2).
    """

    chunks: int = 8

    def __post_init__(self) -> None:
        if isinstance(self.chunks, bool) or not isinstance(self.chunks, int) or self.chunks < 2:
            raise BadInputError(
                f"ChunkedLossConfig.chunks must be an integer >= 2, got {self.chunks!r}. "
                "Pass e.g. ChunkedLossConfig(chunks=8)."
            )

    @property
    def label(self) -> str:
        """How reports name the technique."""
        return f"chunked loss ({self.chunks} chunks)"


def check_causal_lm(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(base model, output head) of a causal LM the chunked loss can replace the loss of; a
    BadInputError naming the model and why otherwise."""
    name = type(model).__name__
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    base = getattr(model, "base_model", None)
    if (
        not isinstance(head, torch.nn.Module)
        or not isinstance(base, torch.nn.Module)
        or base is model
    ):
        raise BadInputError(
            f"The chunked loss needs a causal language model with an output head "
            f"(get_output_embeddings()) over a base model, and {name} has none. Drop "
            "chunked_loss, or use a transformers *ForCausalLM / *LMHeadModel."
        )
    if "CausalLM" not in name and "LMHead" not in name:
        raise BadInputError(
            f"The chunked loss replaces a causal LM's shifted next-token cross-entropy; {name} "
            "is not a causal LM (*ForCausalLM / *LMHeadModel). Drop chunked_loss."
        )
    cfg = getattr(model, "config", None)
    for attr in _UNSUPPORTED_CONFIG:
        value = getattr(cfg, attr, None)
        if value not in (None, False, 1.0):
            raise BadInputError(
                f"{name} sets {attr}={value!r}: its loss is not the plain cross-entropy of "
                "lm_head(hidden), so the chunked loss would not equal it. Drop chunked_loss."
            )
    return base, head


def chunked_causal_lm_loss(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    labels: torch.Tensor,
    chunks: int,
    *,
    num_items_in_batch: Any = None,
    head_path: str = "lm_head",
) -> torch.Tensor:
    """`ForCausalLMLoss(head(hidden), labels)` computed over `chunks` pieces of the positions.

    hidden: (B, S, H) last hidden states; labels: (B, S) token ids, -100 where ignored.
    """
    labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]  # (B, S), shifted
    h = hidden.reshape(-1, hidden.shape[-1])  # (B*S, H)
    y = labels.reshape(-1).to(h.device)  # (B*S,)
    run = functools.partial(_chunk_loss, head, head_path)
    total = None
    for h_i, y_i in zip(torch.tensor_split(h, chunks), torch.tensor_split(y, chunks), strict=True):
        part = checkpoint(run, h_i, y_i, use_reentrant=False)
        total = part if total is None else total + part
    assert total is not None
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch
    return total / (y != IGNORE_INDEX).sum()


def _chunk_loss(head: torch.nn.Module, path: str, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One chunk: logits (n, V) upcast to float32, cross-entropy summed over its tokens. The
    region listeners (the tracker) hear it as a checkpointed region, so its recomputation in
    backward is traced as one."""
    for f in region_listeners:
        f(path, True)
    try:
        logits = head(h).float()  # (n, V)
        return F.cross_entropy(logits, y, ignore_index=IGNORE_INDEX, reduction="sum")
    finally:
        for f in region_listeners:
            f(path, False)


def chunk_loss_forward(model: torch.nn.Module, config: ChunkedLossConfig) -> None:
    """Make `model(..., labels=...)` compute its loss chunked (in place; once). Called without
    labels, or without gradients, the model runs as before. A peft model's inner model is
    wrapped (peft's forward calls it with the labels)."""
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base):
        model = get_base()
    base, head = check_causal_lm(model)
    path = next((n for n, m in model.named_modules() if m is head), "lm_head")
    wrap_forward_once(
        model, "_memfit_chunked_loss", config,
        lambda current: functools.partial(
            _chunked_forward, model, current, base, head, path, config.chunks
        ),
    )  # fmt: skip


def _chunked_forward(
    model: torch.nn.Module,
    inner: Callable[..., Any] | None,
    base: torch.nn.Module,
    head: torch.nn.Module,
    path: str,
    chunks: int,
    *args: Any,
    **kwargs: Any,
) -> Any:
    labels = kwargs.get("labels")
    if labels is None or not torch.is_grad_enabled():
        fwd = inner if inner is not None else functools.partial(type(model).forward, model)
        return fwd(*args, **kwargs)
    from transformers.modeling_outputs import CausalLMOutputWithPast

    kwargs = dict(kwargs)
    del kwargs["labels"]
    num_items = kwargs.pop("num_items_in_batch", None)
    keep = kwargs.pop("logits_to_keep", 0)
    if keep not in (0, None):
        raise BadInputError(
            f"logits_to_keep={keep!r} with labels: the chunked loss takes every position. "
            "Drop logits_to_keep."
        )
    kwargs.setdefault("use_cache", False)
    out = base(*args, **kwargs)
    hidden = out[0]  # (B, S, H)
    loss = chunked_causal_lm_loss(
        hidden, head, labels, chunks, num_items_in_batch=num_items, head_path=path
    )
    return CausalLMOutputWithPast(loss=loss, logits=None)


def chunk_loss_for_trace(model: torch.nn.Module, w: Workload) -> None:
    """What `apply_` will do to the model, done to the traced model."""
    if w.chunked_loss is not None and w.training:
        chunk_loss_forward(model, ChunkedLossConfig(chunks=w.chunked_loss))


@handler
def _chunked_loss(config: ChunkedLossConfig, build: Build) -> None:
    chunk_loss_forward(build.model, config)
    build.applied.append(config.label)
    build.left_to_caller.append(
        "chunked loss: model(..., labels=...) returns the loss and no logits; a loss computed "
        "outside the model from its logits is not chunked."
    )
