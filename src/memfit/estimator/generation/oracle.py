"""What `generate` reads from tensors a fake trace has no values for, answered as a generation of
exactly `new_tokens` tokens from memfit's synthetic prompt answers it
(memfit.estimator.generation.figures).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from memfit._compat import MIN_TRANSFORMERS_GENERATE, generate_keeps_all_ones_mask
from memfit.errors import BadInputError, TraceError
from memfit.estimator.trace.tracker import Tracker

#: The special tokens `GenerationMixin._prepare_special_tokens` turns into tensors
#: (`generation_config._<name>_token_tensor` from `<name>_token_id`).
SPECIAL_TOKENS = ("bos", "eos", "pad", "decoder_start")


def check_transformers_generate() -> None:
    """Refuse `mode="generate"` on a transformers without `generation.utils.StopCheck`, whose
    stopping decision the Oracle answers (added in MIN_TRANSFORMERS_GENERATE)."""
    import transformers.generation.utils as gu

    if not hasattr(gu, "StopCheck"):
        installed = importlib.metadata.version("transformers")
        raise BadInputError(
            f"generation needs transformers >= {MIN_TRANSFORMERS_GENERATE}; installed "
            f"{installed}. Upgrade with `pip install -U 'transformers>="
            f"{MIN_TRANSFORMERS_GENERATE}'`, or estimate one forward with mode='inference'."
        )


class GenerationTracker(Tracker):
    """The tracker, answering the value reads `generate` makes on a synthetic prompt.

    Outside the patched stopping checks (`Oracle`), `generate` reads a value to inspect its
    inputs: `(attention_mask == 1).all()` (is there padding?) and `(ids < 0).any()` (dummy
    ids?), and with a batch of prompts and a pad token `sum(ids[:, -1] == pad) > 0` (right
    padding?). memfit's prompt has no padding and no negative or special ids, so an `all` is
    True, an `any` False, and that comparison False. Beam search fills its output buffers with
    `pad_token_id or eos_token_id[0]`, reading special token tensors made from the generation
    config's ids: each such read is answered with its id (Oracle.token_value). After its loop,
    beam search crops its outputs (views) to the generated length,
    `max_generated_length = (...).sum(dim=1).max()` and `prompt + max_generated_length`:
    new_tokens and prompt_len + new_tokens. Any other read is an error naming the op.
    """

    #: Set by the trace: the oracle of the generation and the prompt length.
    oracle: Oracle
    prompt_len: int

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            sid = self.sid_of(args[0])
            op = self.records[sid].op if sid is not None else "?"
            finished = self.oracle.calls >= self.oracle.new_tokens
            token = self.oracle.token_value(args[0], self.sid_of)
            if token is not None:
                return token
            if op.startswith("all."):
                return True
            if op.startswith("any."):
                return False
            if op.startswith("gt.") and self.oracle.calls == 0:
                return False  # a batch's right-padding check: `sum(ids[:, -1] == pad) > 0`
            if finished and op.startswith("max."):
                return self.oracle.new_tokens
            if finished and op.startswith("add."):
                return self.prompt_len + self.oracle.new_tokens
            raise TraceError(
                f"generate read the value of a tensor made by {op!r}, which a fake trace "
                "cannot know. memfit models greedy search and beam search of exactly "
                "new_tokens tokens; a custom logits processor or stopping criterion is not "
                "modelled."
            )
        return super().__torch_dispatch__(func, types, args, kwargs)


class Oracle:
    """The stopping decisions of a generation of exactly `new_tokens` tokens.

    The patched functions run the same tensor ops as transformers' (so the same storages come
    and go) and return what a run without early stopping returns: unfinished until the model
    has been called `new_tokens` times (one prefill, new_tokens - 1 decode steps).
    """

    def __init__(self, new_tokens: int) -> None:
        self.new_tokens = new_tokens
        self.calls = 0
        #: The special token tensors generate made from its config's ids, each with the ids
        #: its storage holds from the tensor's first element on. Weak references: the tensors
        #: are freed when generate drops them, as on the device.
        self.tokens: list[tuple[weakref.ref[torch.Tensor], list[int]]] = []

    def note_tokens(self, generation_config: Any) -> None:
        """Remember the special token tensors `_prepare_special_tokens` just made.

        Each `_<name>_token_tensor` is `torch.tensor(<name>_token_id)` (one id or a list), or,
        for a pad token the config does not set, `eos_token_tensor[0]` (a view of the eos
        tensor, whose storage is remembered with the eos ids). An id given as a tensor is not
        remembered: its values are not read here, and a read of it stays an error.
        """
        for name in SPECIAL_TOKENS:
            tensor = getattr(generation_config, f"_{name}_token_tensor", None)
            ids = getattr(generation_config, f"{name}_token_id", None)
            if isinstance(ids, bool) or not isinstance(tensor, torch.Tensor):
                continue
            if isinstance(ids, int):
                self.tokens.append((weakref.ref(tensor), [ids]))
            elif isinstance(ids, (list, tuple)) and all(type(i) is int for i in ids):
                self.tokens.append((weakref.ref(tensor), list(ids)))

    def token_value(self, read: torch.Tensor, sid_of: Callable[[torch.Tensor], int | None]
                    ) -> int | None:  # fmt: skip
        """The id a one-element read of a special token tensor (or a view of one) holds, by
        its place in the storage; None for any other tensor."""
        sid = sid_of(read)
        if sid is None or read.numel() != 1 or read.dtype != torch.long:
            return None
        for ref, ids in self.tokens:
            tensor = ref()
            if tensor is not None and sid_of(tensor) == sid:
                index = read.storage_offset() - tensor.storage_offset()
                if 0 <= index < len(ids):
                    return ids[index]
        return None

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        import transformers.cache_utils as cu
        import transformers.generation.utils as gu

        check_transformers_generate()
        oracle = self
        stop_check = gu.StopCheck.__call__
        beams_unfinished = gu.GenerationMixin._beam_search_has_unfinished_sequences
        reorder = cu.StaticLayer.reorder_cache
        prepare_tokens = gu.GenerationMixin._prepare_special_tokens

        def stop_call(
            self: Any, unfinished: torch.Tensor, tokens: torch.Tensor, length: int
        ) -> bool:
            # transformers: `return bool(unfinished_sequences.max() == 0)` (no streamer here).
            done = unfinished.max() == 0
            del done
            return oracle.calls >= oracle.new_tokens

        def beams_call(*args: Any, **kwargs: Any) -> bool:
            flag = beams_unfinished(*args, **kwargs)  # the same ops; the value is unknown
            del flag
            return oracle.calls < oracle.new_tokens

        def static_reorder(self: Any, beam_idx: torch.Tensor) -> None:
            # transformers' CacheLayerMixin.reorder_cache, whose `if self.get_seq_length() > 0`
            # holds after the prefill (the only time generate reorders).
            filled = self.get_seq_length() > 0
            del filled
            self.keys = self.keys.index_select(0, beam_idx.to(self.keys.device))
            self.values = self.values.index_select(0, beam_idx.to(self.values.device))

        def prepare_special(self: Any, generation_config: Any, *args: Any, **kwargs: Any) -> None:
            prepare_tokens(self, generation_config, *args, **kwargs)
            oracle.note_tokens(generation_config)

        setattr(gu.StopCheck, "__call__", stop_call)  # noqa: B010
        name = "_beam_search_has_unfinished_sequences"
        setattr(gu.GenerationMixin, name, staticmethod(beams_call))
        setattr(cu.StaticLayer, "reorder_cache", static_reorder)  # noqa: B010
        setattr(gu.GenerationMixin, "_prepare_special_tokens", prepare_special)  # noqa: B010
        try:
            yield
        finally:
            gu.StopCheck.__call__ = stop_check  # type: ignore[method-assign]
            gu.GenerationMixin._beam_search_has_unfinished_sequences = staticmethod(  # type: ignore[method-assign]
                beams_unfinished
            )
            cu.StaticLayer.reorder_cache = reorder  # type: ignore[method-assign]
            setattr(gu.GenerationMixin, "_prepare_special_tokens", prepare_tokens)  # noqa: B010
            self.tokens.clear()


@contextlib.contextmanager
def device_mask_checks() -> Iterator[None]:
    """transformers' mask functions decide on memfit's fake tensors as they do on the device.

    On transformers < 5.18 `generate` passes its all-ones 2-D attention mask to every model
    call (_compat.generate_keeps_all_ones_mask). masking_utils then asks
    `is_tracing(padding_mask)` before reading the mask, and `is_tracing` counts a FakeTensor as
    tracing, so on fake tensors the causal mask is never skipped: a bool (B, 1, q, kv) mask is
    built, SDPA loses `is_causal` and grouped K/V and leaves the flash kernel. On the device the
    mask is a real tensor: `_ignore_causal_mask_sdpa` reads it, finds no padding and skips the
    mask (the prefill runs is_causal flash; each decode step, one query, runs without a mask),
    and `create_recurrent_attention_mask` returns None for an all-ones mask. So, during memfit's
    generation traces on these versions only, masking_utils' `is_tracing` does not count
    memfit's FakeTensors (compiling, jit and stream capture still count: the device run would
    be tracing then), and the values those functions read are answered as the device reads
    them from memfit's prompt, which has no padding:
    - `x.all()` and `torch.all(...)`: True (GenerationTracker's rule for any `all`);
    - `fast_all(x)` (`x.sum() == x.numel()`, the same ops run here): True. Every tensor given
      to it comes from the all-ones mask: the mask itself, its first q_length positions, or
      the complement of what `prepare_padding_mask` pads it with up to a static cache's
      length (zeros, whose complement is all True; empty without a static cache).
    On 5.18+ no mask reaches these checks and nothing is changed. Restored on exit.
    """
    if not generate_keeps_all_ones_mask():
        yield
        return
    import transformers.masking_utils as mu

    is_tracing: Any = mu.is_tracing
    fast_all: Any = mu.fast_all

    def device_is_tracing(tensor: Any = None) -> bool:
        return bool(is_tracing(None if isinstance(tensor, FakeTensor) else tensor))

    def device_fast_all(tensor: torch.Tensor) -> bool:
        same_ops = fast_all(tensor)  # sum, then == numel: the device's ops, a fake result
        del same_ops
        return True

    setattr(mu, "is_tracing", device_is_tracing)  # noqa: B010
    setattr(mu, "fast_all", device_fast_all)  # noqa: B010
    try:
        yield
    finally:
        setattr(mu, "is_tracing", is_tracing)  # noqa: B010
        setattr(mu, "fast_all", fast_all)  # noqa: B010


@contextlib.contextmanager
def quiet_generate() -> Iterator[None]:
    """transformers' warnings about the synthetic prompt memfit traces `generate` with (no
    attention mask or pad token id, by design: memfit's prompt has no padding) kept from the
    user's terminal while the trace runs."""
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)
