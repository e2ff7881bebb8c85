"""`cache="offloaded"`: transformers' offloaded DynamicCache, its CUDA copies emulated on fake
tensors.

transformers 5's `generate(cache_implementation="offloaded")` builds `DynamicCache(config=...,
offloading=True)` (generation/utils.py `_prepare_cache_for_generation`; a DynamicCache offloads
every layer, sliding ones too: `offload_only_non_sliding=False`). Its `Cache.update(k, v, i)`
(cache_utils.py), run as it is during the trace:

1. `torch.cuda.default_stream(dev).wait_stream(prefetch_stream)` and the reverse wait;
2. `prefetch(i + 1)`: on the prefetch stream, the next offloaded layer (circling back to layer
   0 after the last) is copied to the device, `layer.keys.to(device, non_blocking=True)` (and
   the values): a new device tensor; the host copy is dropped;
3. the layer's own `update` (DynamicLayer: `torch.cat` of the prefetched keys and the new
   token, on the device);
4. `offload(i)`: `layer.keys.to("cpu", non_blocking=True)`, a new host tensor; the device
   tensor lives on while the attention uses it.

So at any moment the device holds the layer being computed and the one prefetched for the
next, and between model calls layer 0 (prefetched by the last layer for the next step); every
other layer is in host memory. `.to("cpu", non_blocking=True)` of a CUDA tensor allocates
pinned memory (aten `_to_copy`: `pin_out = non_blocking && self.is_cuda() && ...cpu`), through
the caching host allocator (memfit.estimator.host_memory).

What is emulated (fake tensors are CPU tensors: `.to("cpu")` and `.to(self.device)` would be
no-ops, and there are no CUDA streams):

- `CacheLayerMixin.offload` makes a host copy (`empty_like` + `copy_`, marked host memory and
  kv_cache, op OP_TO_HOST), as `_to_copy` allocates it; `prefetch` makes a device copy (op
  OP_TO_DEVICE) of a layer whose tensors are on the host, as transformers' `keys.device !=
  self.device` test decides;
- the streams: `torch.Stream()` and `torch.cuda.default_stream` are stand-ins whose
  `wait_stream` and context do nothing (the order of the copies is the program order).

Not modelled: the prefetch stream's own pool in the CUDA caching allocator (blocks freed by a
tensor allocated on the prefetch stream are reused by that stream only; memfit replays one
stream), and the time the copies take.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.events import Category

#: The ops of the copies' records: the host copy `offload` makes, the device copy of `prefetch`.
OP_TO_HOST = "kv_offload_to_host"
OP_TO_DEVICE = "kv_prefetch_to_device"


def check_offloaded(tp: int, num_beams: int) -> None:
    """What memfit does not model of the offloaded cache, refused with the value and the fix."""
    if tp > 1:
        raise BadInputError(
            f"cache='offloaded' with tp={tp} is not modelled: memfit traces the offloaded "
            "cache's copies on one GPU. Use tp=1 with cache='offloaded', or cache='dynamic' "
            "with tensor parallelism."
        )
    if num_beams > 1:
        raise BadInputError(
            f"cache='offloaded' with num_beams={num_beams} is not modelled: beam search "
            "reorders the offloaded layers on the CPU (pageable copies), which memfit does not "
            "trace. Use num_beams=1 with cache='offloaded', or cache='dynamic' for beam search."
        )


class _Stream:
    """A CUDA stream's stand-in: waits and `with stream:` do nothing on a fake trace."""

    def wait_stream(self, other: Any) -> None:
        del other

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


@contextlib.contextmanager
def emulated(tracker: Any) -> Iterator[None]:
    """Offloading as on CUDA, for the caches built while inside (see the module docstring)."""
    import transformers.cache_utils as cu

    mixin = cu.CacheLayerMixin
    offload, prefetch = mixin.offload, mixin.prefetch
    stream, default_stream = torch.Stream, torch.cuda.default_stream

    def on_host(t: torch.Tensor) -> bool:
        sid = tracker.sid_of(t)
        return sid is not None and tracker.records[sid].host

    def copy(t: torch.Tensor, *, host: bool) -> torch.Tensor:
        out = torch.empty_like(t)  # _to_copy: an empty tensor of the same layout, then copy_
        out.copy_(t)
        tracker.mark(out, Category.KV_CACHE, host=host)
        sid = tracker.sid_of(out)
        if sid is not None:
            tracker.records[sid].op = OP_TO_HOST if host else OP_TO_DEVICE
        return out

    def emulated_offload(self: Any) -> None:
        if self.is_initialized:
            self.keys = copy(self.keys, host=True)
            self.values = copy(self.values, host=True)

    def emulated_prefetch(self: Any) -> None:
        if self.is_initialized and on_host(self.keys):
            self.keys = copy(self.keys, host=False)
            self.values = copy(self.values, host=False)

    mixin.offload, mixin.prefetch = emulated_offload, emulated_prefetch  # type: ignore[method-assign]
    torch.Stream = _Stream  # type: ignore[assignment, misc]
    torch.cuda.default_stream = lambda device=None: _Stream()  # type: ignore[assignment, return-value]
    try:
        yield
    finally:
        mixin.offload, mixin.prefetch = offload, prefetch  # type: ignore[method-assign]
        torch.Stream = stream  # type: ignore[misc]
        torch.cuda.default_stream = default_stream
