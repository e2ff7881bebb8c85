"""Vocabulary coverage of a data set, the memory a pruned vocabulary saves, and the pruning.

A model's vocabulary costs memory in proportion to its rows: the input embedding and the
output layer (weights, gradients, optimizer state) and every logits tensor (batch x sequence x
vocabulary). A data set that uses a fraction of the ids can train with the rest removed:
`coverage` says how many ids cover 95 / 99 / 99.9 % of its tokens, `vocab_savings` what
removing the others saves, and `shrink_vocabulary` removes them from a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from memfit.errors import BadInputError
from memfit.optimizers import DEFAULT_OPTIMIZER, NO_OPTIMIZER, OPTIMIZERS, spec_of
from memfit.workload import Workload

#: The shares of the data's tokens `coverage` reports by default.
COVERAGES = (0.95, 0.99, 0.999)


def _state_per_element(optimizer: str) -> int | None:
    """Optimizer state per parameter element, in multiples of the parameter's own bytes, when it
    splits by rows (OptimizerSpec.row_copies: SGD's momentum and Lion's exp_avg are one
    `zeros_like(p)`, Adam(W)'s moments two; their step counters are per tensor, not per row);
    None for blockwise or factored state."""
    return 0 if optimizer == NO_OPTIMIZER else spec_of(optimizer).row_copies


#: Bytes of a 16-bit weight or logit (fp16, bf16), and of an fp32 one.
BYTES_16, BYTES_32 = 2, 4


@dataclass(frozen=True)
class VocabCoverage:
    """How many of the vocabulary's ids the data's tokens need.

    Attributes:
        vocab_size: ids the tokenizer has; total_tokens: tokens in the data; ids_seen: ids
            that occur at least once.
        needed: {share: the fewest ids (the most frequent) covering that share of tokens}.
    """

    vocab_size: int
    total_tokens: int
    ids_seen: int
    needed: dict[float, int]
    _order: Any = field(repr=False, compare=False)  # ids, most frequent first (ties: by id)
    _cumulative: Any = field(repr=False, compare=False)  # tokens covered by the first k + 1

    def ids_for(self, share: float) -> int:
        """The fewest ids (the most frequent) covering `share` of the tokens."""
        _check_share(share)
        return _needed(self._cumulative, share)

    def keep_ids(self, share: float) -> list[int]:
        """The ids to keep for `share` of the tokens, ascending (for `shrink_vocabulary`)."""
        return sorted(int(i) for i in self._order[: self.ids_for(share)])


def _check_share(share: float) -> None:
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
        raise BadInputError(f"A coverage share must be in (0, 1], got {share!r}: e.g. 0.99.")


def _needed(cumulative: Any, share: float) -> int:
    """The fewest ids whose cumulative count reaches `share` of the total (exactly: the share
    is read as the decimal it is written as, so 0.999 is 999/1000)."""
    import numpy as np

    total = int(cumulative[-1])
    need = math.ceil(Fraction(str(share)) * total)
    return int(np.searchsorted(cumulative, need, side="left")) + 1


def coverage(
    id_counts: Any, *, vocab_size: int | None = None, shares: tuple[float, ...] = COVERAGES
) -> VocabCoverage:
    """Coverage of the token ids counted in `id_counts` (index = id, value = occurrences; a
    `DataReport.id_counts`).

    Example:
        >>> cov = coverage([5, 0, 3, 2])  # id 0 five times, id 2 three times, id 3 twice
        >>> cov.needed[0.95], cov.ids_seen
        (3, 3)
    """
    import numpy as np

    counts = np.asarray(id_counts, dtype=np.int64)
    if counts.ndim != 1 or counts.size == 0 or int(counts.sum()) == 0:
        raise BadInputError(
            "coverage needs the count of each token id (a 1-D array with some tokens); the "
            "approximate tokenizer counts none: pass a tokenizer folder (--tokenizer)."
        )
    for s in shares:
        _check_share(s)
    order = np.argsort(-counts, kind="stable")  # most frequent first, ties by id
    cumulative = np.cumsum(counts[order])
    return VocabCoverage(
        vocab_size=max(vocab_size or 0, counts.size), total_tokens=int(cumulative[-1]),
        ids_seen=int(np.count_nonzero(counts)), needed={s: _needed(cumulative, s) for s in shares},
        _order=order, _cumulative=cumulative,
    )  # fmt: skip


@dataclass(frozen=True)
class VocabSavings:
    """Device memory that removing `removed` of the model's `vocab_size` rows saves.

    Attributes:
        hidden: the embedding width; tied: the output layer shares the input embedding's weight;
            head_bias: the output layer has a bias.
        parameters, gradients, optimizer_state: bytes of the removed rows (input embedding,
            and output layer unless tied), as the workload keeps them on the device.
        autocast_copy: with "-mixed" precision, the 16-bit copy of the output layer's weight
            autocast keeps for the step.
        logits_per_copy: bytes of the removed columns of one logits tensor of batch x seq; a
            training step holds several at its peak (the logits, and the loss's float32 copies).
    """

    vocab_size: int
    kept: int
    hidden: int
    tied: bool
    head_bias: bool
    parameters: int
    gradients: int
    optimizer_state: int
    autocast_copy: int
    logits_per_copy: int
    batch_size: int
    seq_len: int

    @property
    def removed(self) -> int:
        return self.vocab_size - self.kept

    @property
    def persistent(self) -> int:
        """Weights, gradients, optimizer state and autocast copy: saved for the whole step."""
        return self.parameters + self.gradients + self.optimizer_state + self.autocast_copy


def _embeddings(model: Any) -> tuple[Any, Any]:
    get_in = getattr(model, "get_input_embeddings", None)
    emb = get_in() if callable(get_in) else None
    if emb is None or not hasattr(emb, "num_embeddings"):
        raise BadInputError(
            f"{type(model).__name__} has no input embedding memfit can find (no "
            "get_input_embeddings() returning an nn.Embedding, as transformers models have). "
            "Pass a transformers model, or one with get_input_embeddings()."
        )
    get_out = getattr(model, "get_output_embeddings", None)
    return emb, get_out() if callable(get_out) else None


def _check_priced(w: Workload) -> None:
    if _state_per_element(w.optimizer) is None:
        priced = [n for n in OPTIMIZERS if _state_per_element(n) is not None]
        raise BadInputError(
            f"Vocabulary savings are priced for the optimizers {', '.join(priced)}; "
            f"optimizer={w.optimizer!r} keeps state whose rows memfit does not split (8-bit "
            f"blocks, factored rows). Price with optimizer={DEFAULT_OPTIMIZER!r} for an upper "
            "bound, or estimate both vocabularies."
        )
    if w.gpus > 1 or w.quantize is not None or w.fsdp_cpu_offload:
        raise BadInputError(
            "Vocabulary savings are priced for one GPU with unquantized weights; this workload "
            f"has gpus={w.gpus}, quantize={w.quantize!r}, fsdp_cpu_offload="
            f"{w.fsdp_cpu_offload}. Price it with gpus=1 and no quantization."
        )


def vocab_savings(
    model: Any, kept: int, workload: Workload, *, seq_len: int, task: str | None = None,
    highest_id: int | None = None,
) -> VocabSavings:  # fmt: skip
    """What keeping `kept` rows of `model`'s vocabulary saves on the device for `workload`
    (its precision, optimizer, mode, LoRA, micro-batch, placement, tied embeddings), logits
    at `seq_len`. `highest_id`, the largest token id in the data, is checked against the
    model's rows (a tokenizer with more ids is another model's).

    The model is built on the meta device (no memory). Known limits: frozen prefixes
    (`freeze`) are not read (the embedding is priced as trainable unless LoRA or inference);
    optimizers whose state does not split by rows, several GPUs and quantization are refused.

    Example:
        >>> vocab_savings("gpt2", 20000, memfit.Workload(batch_size=8), seq_len=1024).persistent
    """
    from memfit.models.sources import resolve_model

    _check_priced(workload)
    spec = resolve_model(model, task=task)
    emb, head = _embeddings(_meta_model(spec, workload.attention))
    vocab, hidden = int(emb.num_embeddings), int(emb.embedding_dim)
    if not 0 < kept <= vocab:
        raise BadInputError(
            f"kept={kept} must be between 1 and the model's vocabulary ({vocab} rows). A "
            "tokenizer with more ids than the model has rows is not this model's tokenizer."
        )
    if highest_id is not None and highest_id >= vocab:
        raise BadInputError(
            f"The data holds token id {highest_id}, and the model has {vocab} rows (ids 0.."
            f"{vocab - 1}): the tokenizer is not this model's. Pass the model's own tokenizer."
        )
    removed = vocab - kept
    tied = head is not None and (head.weight is emb.weight or workload.tie_embeddings)
    head_bias = head is not None and getattr(head, "bias", None) is not None
    elements = (0 if workload.embedding_on_cpu and not tied else removed * hidden) + (
        removed * hidden if head is not None and not tied else 0
    ) + (removed if head_bias else 0)  # fmt: skip
    true16 = workload.recipe.pure
    pb = BYTES_16 if true16 else BYTES_32
    trains = workload.mode == "train" and workload.lora is None
    state = 0 if workload.offload_optimizer else _state_per_element(workload.optimizer) or 0
    mixed = workload.recipe.mixed
    return VocabSavings(
        vocab_size=vocab, kept=kept, hidden=hidden, tied=tied, head_bias=head_bias,
        parameters=elements * pb, gradients=elements * pb if trains else 0,
        optimizer_state=elements * pb * state if trains else 0,
        autocast_copy=removed * hidden * BYTES_16 if mixed and head is not None else 0,
        logits_per_copy=workload.batch_size * seq_len * removed
        * (BYTES_32 if workload.precision == "fp32" else BYTES_16) if head is not None else 0,
        batch_size=workload.batch_size, seq_len=seq_len,
    )  # fmt: skip


def _meta_model(spec: Any, attention: str) -> Any:
    import torch

    if not spec.owns_model:
        return spec.build(None, attention)
    with torch.device("meta"):
        return spec.build(1 if spec.can_shorten else None, attention)


def shrink_vocabulary(model: Any, keep_ids: Any) -> Any:
    """Keep only the rows `keep_ids` of `model`'s input embedding and output layer, in place,
    and return the id map: a LongTensor `old_to_new` of the old vocabulary's size, holding each
    kept id's new id and -1 for a removed one. Token ids must be mapped before the model sees
    them (`old_to_new[input_ids]`), and generated ids mapped back (`keep_ids[new_id]`).

    A tied output layer stays tied; `config.vocab_size` is updated. A padding index that is
    removed is dropped. Works on transformers models (`get_input_embeddings`, and
    `get_output_embeddings` when there is a head).

    Example:
        >>> old_to_new = shrink_vocabulary(model, coverage(report.id_counts).keep_ids(0.999))
        >>> logits = model(old_to_new[input_ids]).logits
    """
    import torch

    emb, head = _embeddings(model)
    vocab = int(emb.num_embeddings)
    keep = _keep_tensor(keep_ids, vocab)
    old_to_new = torch.full((vocab,), -1, dtype=torch.long)
    old_to_new[keep] = torch.arange(keep.numel())
    tied = head is not None and head.weight is emb.weight
    model.set_input_embeddings(_shrunk_embedding(emb, keep, old_to_new))
    if head is not None:
        model.set_output_embeddings(_shrunk_head(head, keep, model.get_input_embeddings(), tied))
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "vocab_size"):
        config.vocab_size = keep.numel()
    return old_to_new


def _keep_tensor(keep_ids: Any, vocab: int) -> Any:
    import torch

    keep = torch.as_tensor(list(keep_ids), dtype=torch.long).unique(sorted=True)
    if keep.numel() == 0:
        raise BadInputError("keep_ids is empty: keep at least one token id.")
    if int(keep[0]) < 0 or int(keep[-1]) >= vocab:
        bad = int(keep[0]) if int(keep[0]) < 0 else int(keep[-1])
        raise BadInputError(
            f"keep_ids holds {bad}, outside the vocabulary's ids 0..{vocab - 1}: pass ids of "
            "this model's tokenizer."
        )
    return keep


def _shrunk_embedding(emb: Any, keep: Any, old_to_new: Any) -> Any:
    import torch

    pad = emb.padding_idx
    new_pad = None if pad is None or int(old_to_new[pad]) < 0 else int(old_to_new[pad])
    w = emb.weight
    out = torch.nn.Embedding(keep.numel(), w.shape[1], padding_idx=new_pad, device=w.device,
                             dtype=w.dtype)  # fmt: skip
    with torch.no_grad():
        out.weight.copy_(w[keep.to(w.device)])
    out.weight.requires_grad_(w.requires_grad)
    return out


def _shrunk_head(head: Any, keep: Any, new_emb: Any, tied: bool) -> Any:
    import torch

    w = head.weight
    bias = getattr(head, "bias", None)
    out = torch.nn.Linear(w.shape[1], keep.numel(), bias=bias is not None, device=w.device,
                          dtype=w.dtype)  # fmt: skip
    with torch.no_grad():
        if tied:
            out.weight = new_emb.weight
        else:
            out.weight.copy_(w[keep.to(w.device)])
            out.weight.requires_grad_(w.requires_grad)
        if bias is not None:
            out.bias.copy_(bias[keep.to(bias.device)])
    return out
