"""What `generate` reads from tensors a fake trace has no values for, answered as a generation of
exactly `new_tokens` tokens from memfit's synthetic prompt answers it (memfit.estimator.generation).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from memfit.errors import TraceError
from memfit.estimator.tracker import Tracker


class GenerationTracker(Tracker):
    """The tracker, answering the value reads `generate` makes on a synthetic prompt.

    Outside the patched stopping checks (`Oracle`), `generate` reads a value to inspect its
    inputs: `(attention_mask == 1).all()` (is there padding?) and `(ids < 0).any()` (dummy
    ids?), and with a batch of prompts and a pad token `sum(ids[:, -1] == pad) > 0` (right
    padding?). memfit's prompt has no padding and no negative or special ids, so an `all` is
    True, an `any` False, and that comparison False. After its loop, beam search crops its
    outputs (views) to the generated length, `max_generated_length = (...).sum(dim=1).max()`
    and `prompt + max_generated_length`: new_tokens and prompt_len + new_tokens. Any other
    read is an error naming the op.
    """

    #: Set by the trace: the oracle of the generation and the prompt length.
    oracle: Oracle
    prompt_len: int

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            sid = self.sid_of(args[0])
            op = self.records[sid].op if sid is not None else "?"
            finished = self.oracle.calls >= self.oracle.new_tokens
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

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        import transformers.cache_utils as cu
        import transformers.generation.utils as gu

        oracle = self
        stop_check = gu.StopCheck.__call__
        beams_unfinished = gu.GenerationMixin._beam_search_has_unfinished_sequences
        reorder = cu.StaticLayer.reorder_cache

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

        setattr(gu.StopCheck, "__call__", stop_call)  # noqa: B010
        name = "_beam_search_has_unfinished_sequences"
        setattr(gu.GenerationMixin, name, staticmethod(beams_call))
        setattr(cu.StaticLayer, "reorder_cache", static_reorder)  # noqa: B010
        try:
            yield
        finally:
            gu.StopCheck.__call__ = stop_check  # type: ignore[method-assign]
            gu.GenerationMixin._beam_search_has_unfinished_sequences = staticmethod(  # type: ignore[method-assign]
                beams_unfinished
            )
            cu.StaticLayer.reorder_cache = reorder  # type: ignore[method-assign]
