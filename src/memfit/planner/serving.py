"""Serving capacity: the KV cache a vLLM engine would allocate on a GPU, without starting it.

vLLM (vllm-project/vllm, the v1 engine) sizes its KV cache at start-up, and a user learns the
result from its log ("GPU KV cache size: N tokens", "Maximum concurrency for L tokens per
request: X"). memfit models the same arithmetic over its own estimate of the profiling run:

1. `requested = ceil(total x gpu_memory_utilization)`: the engine's share of the GPU's total
   memory (vllm/utils/mem_utils.py, `MemorySnapshot` / `request_memory`). vLLM refuses to start
   when less than that is free after the CUDA context (memfit's `cuda_context` overhead) is
   made.
2. A profiling run (vllm/v1/worker/gpu_worker.py, `determine_available_memory`;
   gpu_model_runner.py `profile_run` / `_dummy_run`): one forward of `max_num_batched_tokens`
   tokens spread evenly over `min(max_num_batched_tokens, max_num_seqs)` requests, before
   the KV cache exists. `non_kv = weights + torch peak increase + non-torch increase`.
   memfit traces the prefill of that batch (mode="generate" with new_tokens=1: transformers
   computes the logits of each request's last position only, as vLLM's sampler run does) and
   takes its peak allocated bytes with the KV cache left out (the trace's kv_cache storages do
   not exist in vLLM's profiling run). The weights are in that peak. The non-torch increase is
   taken as 0 (memfit's cuBLAS workspace goes through the allocator, so it is in the peak).
3. `available = requested - non_kv` (gpu_worker.py: `requested_memory -
   profile_result.non_kv_cache_memory`).
4. `num_blocks = available // page_size // num_layers` (vllm/v1/core/kv_cache_utils.py,
   `get_num_blocks`), with `page_size = 2 x block_size x kv_heads x head_dim x dtype bytes`
   per layer (vllm/v1/kv_cache_interface.py, `FullAttentionSpec.page_size_bytes`). memfit reads
   the bytes per position of each layer from the traced cache rather than from the config.
5. KV tokens `= num_blocks x block_size`; a request of `context_len` tokens needs
   `ceil(context_len / block_size)` blocks; vLLM's "maximum concurrency" is num_blocks over
   that; the longest model length that fits is `num_blocks x block_size`, capped by the model's
   positions (kv_cache_utils.py, `estimate_max_model_len`).

Not modelled: CUDA graphs (captured after the KV cache is allocated, from the memory outside
`requested`, unless VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS asks vLLM to subtract an
estimate; `--enforce-eager` has none), vLLM's own kernels (fused MoE, paged attention, the
sampler's fp32 buffers: memfit traces transformers' modules), sliding-window and hybrid models
(vLLM gives them separate KV groups: refused), tensor parallelism, prefix caching (shares
blocks, does not change their number), a KV cache dtype other than the model's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from memfit.cuda.allocator_config import cuda_block_size
from memfit.cuda.target import get_gpu
from memfit.errors import BadInputError
from memfit.estimator import estimate_from_trace, resolve_precision, trace_spec
from memfit.events import Category
from memfit.models.sources import resolve_model
from memfit.precision import PURE_BF16
from memfit.units import GIB
from memfit.workload import AUTO_PRECISION, Workload

#: vLLM's default `gpu_memory_utilization` (vllm/config/cache.py, CacheConfig).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
#: vLLM's default KV block size on CUDA, in tokens (vllm/platforms/cuda.py,
#: check_and_update_config: `cache_config.block_size = 16` when none is given).
DEFAULT_BLOCK_SIZE = 16
#: The block sizes vLLM accepts (vllm/config/cache.py, `BlockSize`).
BLOCK_SIZES = (1, 8, 16, 32, 64, 128)
#: `vllm serve`'s scheduler defaults (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults,
#: UsageContext.OPENAI_API_SERVER): on a GPU of at least LARGE_GPU_BYTES whose name has no
#: "a100", 8192 batched tokens and 1024 sequences; otherwise 2048 and 256.
LARGE_GPU_BYTES = 70 * GIB
LARGE_GPU_DEFAULTS = (8192, 1024)
OTHER_GPU_DEFAULTS = (2048, 256)


@dataclass(kw_only=True)
class ServingCapacity:
    """What a vLLM engine would hold on one GPU (see the module docstring for each step).

    Attributes:
        requested_bytes: ceil(total x gpu_memory_utilization).
        weights_bytes: parameters and buffers on the device.
        profile_peak_bytes: peak allocated in the profiling run, the KV cache left out (the
            weights included): vLLM's non-KV memory.
        profile_batch / profile_prompt_len: the profiling run's requests and tokens each.
        available_kv_bytes: requested - profile_peak_bytes (negative: nothing fits).
        kv_bytes_per_token: one position, all layers; block_bytes: one block, all layers.
        num_blocks, kv_tokens: vLLM's num_gpu_blocks and "GPU KV cache size".
        context_len: tokens per request for the concurrency figures.
        blocks_per_sequence: ceil(context_len / block_size).
        concurrent_sequences: whole requests of context_len that fit at once.
        max_concurrency: vLLM's "Maximum concurrency" (num_blocks / blocks_per_sequence).
        max_model_len: the longest request that fits (kv_tokens, capped by the model's
            positions); model_positions: the model's own maximum, or None.
    """

    model: str
    gpu: Any
    precision: str
    quantize: str | None
    gpu_memory_utilization: float
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    profile_batch: int
    profile_prompt_len: int
    requested_bytes: int
    outside_allocator_bytes: int
    weights_bytes: int
    profile_peak_bytes: int
    available_kv_bytes: int
    num_layers: int
    kv_bytes_per_token: int
    block_bytes: int
    num_blocks: int
    kv_tokens: int
    context_len: int
    blocks_per_sequence: int
    concurrent_sequences: int
    max_concurrency: float
    max_model_len: int
    model_positions: int | None
    seconds: float = 0.0


def scheduler_defaults(gpu: Any) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) as `vllm serve` picks them for `gpu`."""
    large = gpu.total_memory_bytes >= LARGE_GPU_BYTES and "a100" not in gpu.display_name.lower()
    return LARGE_GPU_DEFAULTS if large else OTHER_GPU_DEFAULTS


def serving_capacity(
    model: Any,
    gpu: str,
    *,
    precision: str = PURE_BF16,
    quantize: str | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    block_size: int = DEFAULT_BLOCK_SIZE,
    context_len: int | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    task: str | None = None,
) -> ServingCapacity:
    """The KV blocks, KV tokens and concurrent requests a vLLM engine would have on `gpu`.

    `precision` is the weights' and the KV cache's; "auto" is the checkpoint's dtype (the
    config's, as vLLM's dtype="auto" loads it; `ServingCapacity.precision` says which);
    `context_len` defaults to the model's positions (vLLM's default
    max_model_len); the scheduler limits default to `vllm serve`'s (`scheduler_defaults`).

    Example:
        >>> cap = memfit.serving_capacity("llama-3.1-8b", "l4", context_len=8192)
        >>> cap.num_blocks, cap.kv_tokens, cap.concurrent_sequences
    """
    import time

    t0 = time.perf_counter()
    if not 0 < gpu_memory_utilization <= 1:
        raise BadInputError(
            f"gpu_memory_utilization={gpu_memory_utilization} is not a fraction of the GPU in "
            "(0, 1] (vLLM refuses it too). Use e.g. 0.9, vLLM's default."
        )
    if block_size not in BLOCK_SIZES:
        raise BadInputError(
            f"block_size={block_size} is not one vLLM accepts. Use one of {list(BLOCK_SIZES)} "
            f"(default {DEFAULT_BLOCK_SIZE})."
        )
    gpu_obj = get_gpu(gpu)
    spec = resolve_model(model, task=task)
    _refuse_sliding_windows(spec)
    default_tokens, default_seqs = scheduler_defaults(gpu_obj)
    tokens = default_tokens if max_num_batched_tokens is None else max_num_batched_tokens
    seqs = default_seqs if max_num_seqs is None else max_num_seqs
    for name, value in (("max_num_batched_tokens", tokens), ("max_num_seqs", seqs)):
        if value < 1:
            raise BadInputError(f"{name}={value} must be at least 1.")
    batch = min(tokens, seqs)
    if tokens % batch:
        raise BadInputError(
            f"max_num_batched_tokens={tokens} over {batch} requests: vLLM's profiling run gives "
            f"the last request {tokens % batch} more tokens than the others, and memfit traces "
            f"a rectangular batch. Use a multiple of {batch} (e.g. {tokens - tokens % batch})."
        )
    positions = spec.max_positions
    if context_len is not None and (isinstance(context_len, bool) or context_len < 1):
        raise BadInputError(
            f"context_len={context_len!r}: a request has at least one token. Give the tokens "
            f"of one request (vLLM's max_model_len), e.g. context_len={positions or 4096}."
        )
    context = context_len if context_len is not None else positions
    if context is None:
        raise BadInputError(
            f"{spec.name!r} declares no maximum length, so there is no default context length. "
            "Give context_len (the tokens of one request, vLLM's max_model_len)."
        )
    if positions is not None and context > positions:
        raise BadInputError(
            f"context_len={context} is longer than {spec.name!r} supports ({positions} "
            f"positions; vLLM refuses such a max_model_len). Use context_len={positions} or less."
        )

    prompt = tokens // batch
    w = Workload(
        mode="generate", batch_size=batch, prompt_len=prompt, new_tokens=1,
        precision=precision, quantize=quantize, gpu=gpu_obj.name,
    )  # fmt: skip
    spec, w = resolve_precision(spec, w)  # "auto": the checkpoint's, as vLLM's dtype="auto"
    if precision == AUTO_PRECISION and w.precision == "fp32":
        raise BadInputError(
            f"precision='auto' and {spec.name!r} is a float32 checkpoint, which vLLM's "
            "dtype='auto' does not serve in float32 (it picks a 16-bit dtype for the platform). "
            "Give the precision: 'bf16-true' or 'fp16-true' (or 'fp32', vLLM's --dtype float32)."
        )
    tr, n, replayed = trace_spec(spec, w, gpu_obj.compute_capability)
    est = estimate_from_trace(spec, w, tr, n_blocks=n, replayed=replayed, gpu=gpu_obj)
    by_layer = est.generation.kv_bytes_by_layer
    per_layer_token = {b // (batch * prompt) for b in by_layer}
    if len(per_layer_token) != 1 or 0 in per_layer_token:
        raise BadInputError(
            f"The layers of {spec.name!r} keep different KV bytes per position ({by_layer} for "
            f"{batch * prompt} positions): vLLM gives such layers separate KV cache groups, "
            "which memfit does not model."
        )
    # The profiling run's peak without the KV cache: its storages moved off the device.
    no_kv = replace(
        tr,
        records={
            sid: replace(r, host=True) if r.category == Category.KV_CACHE else r
            for sid, r in tr.records.items()
        },
    )
    bare = estimate_from_trace(spec, w, no_kv, n_blocks=n, replayed=replayed, gpu=gpu_obj)
    profile_peak = bare.profile.peak_allocated_bytes
    weights = sum(
        cuda_block_size(r.nbytes)
        for r in tr.records.values()
        if r.category in (Category.PARAMETERS, Category.BUFFERS) and not r.host
    )

    total = gpu_obj.total_memory_bytes
    requested = math.ceil(total * gpu_memory_utilization)  # as vLLM computes it (float)
    outside = est.overhead.outside_allocator_bytes() if est.overhead is not None else 0
    if requested > total - outside:
        most = math.floor((total - outside) / total * 100) / 100
        raise BadInputError(
            f"gpu_memory_utilization={gpu_memory_utilization} asks for {requested:,} B of the "
            f"{gpu_obj.display_name}'s {total:,} B, but the CUDA context holds {outside:,} B "
            f"before vLLM measures the free memory, and vLLM refuses to start. Use "
            f"gpu_memory_utilization={most} or less."
        )
    (per_token_layer,) = per_layer_token
    layers = len(by_layer)
    page = block_size * per_token_layer  # one block of one layer (page_size_bytes)
    available = requested - profile_peak
    num_blocks = max(available // page // layers, 0)
    kv_tokens = num_blocks * block_size
    per_seq = -(-context // block_size)
    return ServingCapacity(
        model=spec.name, gpu=gpu_obj, precision=w.precision, quantize=quantize,
        gpu_memory_utilization=gpu_memory_utilization, block_size=block_size,
        max_num_batched_tokens=tokens, max_num_seqs=seqs, profile_batch=batch,
        profile_prompt_len=prompt, requested_bytes=requested,
        outside_allocator_bytes=outside, weights_bytes=weights, profile_peak_bytes=profile_peak,
        available_kv_bytes=available, num_layers=layers,
        kv_bytes_per_token=per_token_layer * layers, block_bytes=page * layers,
        num_blocks=num_blocks, kv_tokens=kv_tokens, context_len=context,
        blocks_per_sequence=per_seq, concurrent_sequences=num_blocks // per_seq,
        max_concurrency=num_blocks / per_seq,
        max_model_len=kv_tokens if positions is None else min(kv_tokens, positions),
        model_positions=positions, seconds=time.perf_counter() - t0,
    )  # fmt: skip


def _refuse_sliding_windows(spec: Any) -> None:
    """Sliding-window (and other mixed) layers get their own KV groups in vLLM: refused."""
    entry = spec.extra.get("entry")
    types = dict(entry.config).get("layer_types") if entry is not None else None
    if types and set(types) != {"full_attention"}:
        kinds = sorted(set(types))
        raise BadInputError(
            f"{spec.name!r} mixes attention layers ({', '.join(kinds)}): vLLM gives them "
            "separate KV cache groups (its hybrid allocator), which memfit does not model. "
            "Estimate a generation instead (memfit estimate --mode generate)."
        )
