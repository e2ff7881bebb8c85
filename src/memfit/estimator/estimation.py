"""`memfit.estimate`: peak GPU memory of a step, without a GPU.

Example:
    >>> import memfit
    >>> est = memfit.estimate("gpt2", memfit.Workload(batch_size=8, seq_len=1024), gpu="rtx-4090")
    >>> est.profile.peak_allocated_bytes, est.fits
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass, field
from typing import Any

from memfit.cuda.allocator_config import AllocatorConfig
from memfit.cuda.gpus import card_notes
from memfit.cuda.target import get_gpu, list_gpus
from memfit.errors import BadInputError
from memfit.estimator.auto_precision import resolve_precision
from memfit.estimator.ddp import with_ddp_buckets
from memfit.estimator.device_memory import device_memory
from memfit.estimator.generation.figures import (
    generation_figures,
    prompt_len,
    trace_generation,
    without_markers,
)
from memfit.estimator.host_memory import HostMemory
from memfit.estimator.parallel import run_all
from memfit.estimator.trace.attention import attention_class
from memfit.estimator.trace.block_replay import TRACED_BLOCKS, ReplayMismatch, expand
from memfit.estimator.trace.cache import (
    cached_trace,
    check_environment,
    key_of,
    lookup,
    pack_trace,
    unpack_trace,
)
from memfit.estimator.trace.step_runner import Trace, run_trace, traced_micro_batches
from memfit.models.sources import ModelSpec, resolve_model
from memfit.profile import MemoryProfile
from memfit.techniques.offload.activations import offload_note
from memfit.techniques.offload.embedding_on_cpu import tied_embedding_message
from memfit.techniques.prequantized import bind_prequantized
from memfit.units import format_bytes
from memfit.workload import Workload


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """The result of `estimate`: the profile plus what was assumed to produce it. Built once,
    when everything is known (`estimate_from_trace`), and not changed after."""

    model: str
    workload: Workload
    profile: MemoryProfile
    parameter_count: int
    trainable_parameter_count: int
    num_blocks: int
    replayed: bool
    attention_backend: str | None
    trace_seconds: float
    gpu: Any = None
    fits: bool | None = None
    oom: str | None = None
    device_total_range: tuple[int, int] | None = None
    overhead: Any = None
    embedding_path: str | None = None
    #: Device bytes of parameters, gradients, optimizer state (see device.summarize).
    records_summary: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: FLOPs of the steady-state step by phase ("forward", "backward", "recompute", ...).
    flops: dict[str, int] = field(default_factory=dict)
    #: Host RAM for what the step keeps on the CPU (memfit.estimator.host_memory).
    host: HostMemory | None = None
    #: With mode="generate": KV cache, prefill and decode peaks (generation.GenerationFigures).
    generation: Any = None

    def __repr__(self) -> str:
        """The headline, not the dataclass dump (the profile alone is thousands of events):
        Estimate('gpt2': peak allocated 2.13 GiB, reserved 2.40 GiB, device total 2.93 GiB,
        fits rtx-4090)."""
        p = self.profile
        verdict = ""
        if self.gpu is not None:
            verdict = f", {'fits' if self.fits else 'does not fit'} {self.gpu.name}"
        return (
            f"Estimate({self.model!r}: peak allocated {format_bytes(p.peak_allocated_bytes)}, "
            f"reserved {format_bytes(p.peak_reserved_bytes)}, "
            f"device total {format_bytes(p.device_total_bytes)}{verdict})"
        )


def steady_flops(flops: dict[tuple[int, str, int], int], scale: float = 1.0) -> dict[str, int]:
    """FLOPs of the last traced step (steady state), summed over blocks, by phase.

    `scale` multiplies forward, backward and recompute FLOPs: the step has `grad_accum`
    micro-batches, of which at most 2 are traced (trace.MAX_TRACED_MICRO_BATCHES).
    """
    if not flops:
        return {}
    last = max(k[0] for k in flops)
    out: dict[str, int] = {}
    for (step, phase, _owner), f in flops.items():
        if step == last:
            out[phase] = out.get(phase, 0) + f
    for phase in ("forward", "backward", "recompute"):
        if phase in out:
            out[phase] = round(out[phase] * scale)
    return out


#: Input kinds (ModelSpec.input_kind) whose inputs memfit makes from `seq_len` tokens.
_SEQUENCE_INPUTS = {
    "tokens": "a text model",
    "seq2seq-tokens": "a text model",
    "audio": "an audio model",
}


def check_model_options(spec: ModelSpec, w: Workload) -> None:
    """A workload option the model has no use for is an error, not ignored: `seq_len` for an
    image model, `image_size` for a text model, either for a model that makes its own inputs;
    a sequence longer than the model's positions. Checked before anything is traced."""
    given = [
        f"{k}={v}"
        for k, v, takes in (
            ("seq_len", w.seq_len, spec.batch_takes_seq_len),
            ("image_size", w.image_size, spec.batch_takes_image_size),
        )
        if v and not takes
    ]
    if spec.batch_is_user_defined and given:
        raise BadInputError(
            f"{' and '.join(given)} cannot reach {spec.name!r}: its inputs come from its own "
            "make_batch(batch_size). Drop it, or give make_batch a parameter of that name "
            "(make_batch(batch_size, seq_len))."
        )
    if spec.batch_is_user_defined:
        return  # the user's make_batch decides the shape it takes
    kind = spec.input_kind
    if w.seq_len is not None and kind == "image":
        raise BadInputError(
            f"seq_len={w.seq_len} does not apply to {spec.name!r}, an image model (its input is "
            f"an image, {spec.image_size or 224} pixels square unless image_size says). Drop "
            "seq_len, or give image_size."
        )
    if w.image_size is not None and kind in _SEQUENCE_INPUTS:
        raise BadInputError(
            f"image_size={w.image_size} does not apply to {spec.name!r}, "
            f"{_SEQUENCE_INPUTS[kind]} (its input is a sequence of seq_len tokens). Drop "
            "image_size, or give seq_len."
        )
    if w.seq_len is not None and spec.max_positions and w.seq_len > spec.max_positions:
        raise BadInputError(
            f"seq_len={w.seq_len} is longer than {spec.name!r} supports ({spec.max_positions} "
            f"positions). Use seq_len={spec.max_positions} or less."
        )


def trace_spec(
    spec: ModelSpec, w: Workload, capability: tuple[int, int] | None, *, verify: bool = True
) -> tuple[Trace, int, bool]:
    """Trace `spec`, replaying repeated blocks when possible; returns (trace, blocks, replayed).

    The replay is used only when the traced blocks prove identical (see
    memfit.estimator.trace.block_replay);
    otherwise, and for models memfit cannot shorten (an nn.Module passed in), the whole model
    is traced. Options the model has no use for are refused first (`check_model_options`).
    The result is cached (memfit.estimator.trace.cache) when the model can be named.
    """

    check_model_options(spec, w)
    spec = bind_prequantized(spec, w, capability)  # a checkpoint's quantization_config
    key = trace_key(spec, w, capability, verify)
    return cached_trace(key, lambda: _with_ddp(w, _trace_spec(spec, w, capability, verify)))


def _with_ddp(w: Workload, traced: tuple[Trace, int, bool]) -> tuple[Trace, int, bool]:
    """With `w.ddp`, the step of one DDP process: its gradient buckets added (estimator.ddp)."""
    if not w.ddp:
        return traced
    tr, n, replayed = traced
    return with_ddp_buckets(tr), n, replayed


def trace_key(
    spec: ModelSpec, w: Workload, capability: tuple[int, int] | None, *detail: Any
) -> str | None:
    """The cache key of `trace_spec(spec, w, capability, verify=detail[0])` (or of another
    trace of `w` that `detail` names), or None (not cached: a model or teacher memfit cannot
    name, a user's batch factory)."""
    if spec.cache_key is None or spec.make_batch is not None:
        return None
    teacher = None
    if w.teacher is not None:
        teacher = resolve_model(w.teacher).cache_key
        if teacher is None:
            return None
    # The GPU's name and the host's RAM are read after the trace, not by it.
    traced = w.with_(gpu=None, host_memory=None)
    # GPUs whose kernel choices agree trace alike (attention.attention_class).
    return key_of("trace", spec.cache_key, teacher, traced, attention_class(capability), *detail)


def _trace_spec(
    spec: ModelSpec, w: Workload, capability: tuple[int, int] | None, verify: bool
) -> tuple[Trace, int, bool]:
    if w.mode == "generate":
        return trace_generation(spec, w, capability)
    n = replayable_blocks(spec, w)
    if n is not None:
        four, tr = _short_traces(spec, w, capability, verify)
        if len(tr.block_paths) == TRACED_BLOCKS:
            try:
                if four is None or _replay_verified(tr, four):
                    return _expanded(tr, n), n, True
            except ReplayMismatch:
                pass
    tr = run_trace(spec, w, capability)
    return tr, len(tr.block_paths), False


def replayable_blocks(spec: ModelSpec, w: Workload) -> int | None:
    """The model's block count when a trace of `TRACED_BLOCKS` of them may be replayed to all
    (memfit.estimator.trace.block_replay), else None: a model memfit cannot shorten, too few blocks,
    blocks that differ (the first k checkpointed; layers that differ and repeat in no runs,
    memfit.models.layers: `spec.can_shorten` says so)."""
    n = spec.num_layers
    partial_ckpt = w.checkpoint_first is not None and w.checkpoint_first < (n or 0)
    if spec.layer_units is not None and w.checkpoint_first is not None:
        partial_ckpt = True  # checkpoint_first counts layers, the replay units of layers
    if not spec.can_shorten or n is None or n <= TRACED_BLOCKS + 1 or partial_ckpt:
        return None
    return n


def _expanded(tr: Trace, n: int) -> Trace:
    """The trace of `TRACED_BLOCKS` blocks expanded to `n` (memfit.estimator.trace.block_replay)."""
    records, events = expand(tr.records, tr.events, n, tr.block_paths)
    extra = n - TRACED_BLOCKS
    return dataclasses.replace(
        tr,
        records=records,
        events=events,
        parameter_count=tr.parameter_count + extra * tr.block_parameter_count,
        trainable_parameter_count=(
            tr.trainable_parameter_count + extra * tr.block_trainable_parameter_count
        ),
        flops={key: f * (1 + extra) if key[2] == 1 else f for key, f in tr.flops.items()},
    )


def _profile_key(p: MemoryProfile) -> tuple:
    phases = sorted((ph.step, ph.phase, ph.peak_bytes) for ph in p.phases)
    return (p.peak_allocated_bytes, p.breakdown, p.by_module, phases, p.timeline)


def _short_traces(
    spec: ModelSpec, w: Workload, capability: tuple[int, int] | None, verify: bool
) -> tuple[Trace | None, Trace]:
    """The traces of `TRACED_BLOCKS + 1` blocks (None without `verify`) and of
    `TRACED_BLOCKS`: those cached read back, the others traced side by side where there are
    cores for it (memfit.estimator.parallel; a plan's recommendation has its 3-block trace
    already, and its 4-block one then runs here, not in a child)."""
    blocks = [TRACED_BLOCKS + 1, TRACED_BLOCKS] if verify else [TRACED_BLOCKS]
    found = {n: lookup("trace", trace_key(spec, w, capability, "blocks", n), unpack_trace)
             for n in blocks}  # fmt: skip
    missing = [n for n in blocks if found[n] is None]
    traces = run_all(
        [functools.partial(_short_trace, spec, w, capability, n) for n in missing],
        pack=lambda t: pack_trace((t, 0, False)),
        unpack=lambda packed: unpack_trace(packed)[0],
    )
    short = {n: hit[0] for n, hit in found.items() if hit is not None}
    short.update(zip(missing, traces, strict=True))
    return (short[TRACED_BLOCKS + 1] if verify else None), short[TRACED_BLOCKS]


def _short_trace(spec: ModelSpec, w: Workload, capability: tuple[int, int] | None, n: int) -> Trace:
    """The trace of `n` blocks, cached on its own: the planner's search (no replay check) and
    the check of its recommendation share the 3-block trace."""
    key = trace_key(spec, w, capability, "blocks", n)
    return cached_trace(key, lambda: (run_trace(spec, w, capability, num_layers=n), n, False))[0]


def _replay_verified(traced: Trace, four: Trace) -> bool:
    """Guard: expanding the 3-block trace to 4 blocks must match a real 4-block trace.

    Same live-bytes timeline, event for event, and so the same peak, breakdown, per-module
    bytes and per-phase peaks; otherwise the caller
    traces the whole model. This catches block patterns the expansion does not model (see
    docs/accuracy.md) at the cost of one more short trace.
    """

    records, events = expand(traced.records, traced.events, TRACED_BLOCKS + 1, traced.block_paths)
    expanded = MemoryProfile.from_events(records, events)
    actual = MemoryProfile.from_events(four.records, four.events)
    return _profile_key(expanded) == _profile_key(actual)


def estimate(
    model: Any,
    workload: Workload | None = None,
    *,
    gpu: str | None = None,
    task: str | None = None,
    alloc_conf: str | None = None,
) -> Estimate:
    """Estimate the peak memory of one step of `workload` on `model`.

    Args:
        model: a catalog name, an HF config.json path, "file.py:build", or an nn.Module.
        workload: the step; defaults to `Workload()` (batch 1, fp32, AdamW).
        gpu: a GPU name from the catalog (`memfit gpus`); decides the attention kernel and
            `fits`. Overrides `workload.gpu`.
        task: the head for catalog/config models (e.g. "seq-classification").
        alloc_conf: a PYTORCH_CUDA_ALLOC_CONF string for the allocator simulation, e.g.
            "expandable_segments:True".
    """

    if workload is not None and not isinstance(workload, Workload):
        raise BadInputError(
            f"workload must be a memfit.Workload, got {type(workload).__name__} {workload!r}. "
            "Pass e.g. memfit.Workload(batch_size=8, seq_len=1024)."
        )
    check_environment()
    w = workload or Workload()
    check_token_count(w)
    cfg = AllocatorConfig.from_string(alloc_conf) if alloc_conf else None
    if gpu is not None:
        w = w.with_(gpu=gpu)
    gpu_obj = None
    capability = None
    if w.gpu is not None:
        gpu_obj = get_gpu(w.gpu)
        capability = gpu_obj.compute_capability
    spec, w = resolve_precision(resolve_model(model, task=task), w)
    t0 = time.perf_counter()
    tr, n_blocks, replayed = trace_spec(spec, w, capability)
    seconds = time.perf_counter() - t0
    return estimate_from_trace(
        spec, w, tr, n_blocks=n_blocks, replayed=replayed, gpu=gpu_obj, alloc_conf=cfg,
        seconds=seconds,
    )  # fmt: skip


#: Bytes of one token id on the device: input_ids are int64.
TOKEN_ID_BYTES = 8


def check_token_count(w: Workload) -> None:
    """Refuse, before any work, a micro-batch whose token ids alone exceed the largest GPU in
    the catalog: no card can run it, and a trace of it fails inside torch (a storage size that
    overflows) with advice that does not apply."""
    if w.mode == "generate":
        per_row = prompt_len(w) + w.new_tokens
        rows = w.batch_size * w.num_beams
        what = f"batch {w.batch_size} x {w.num_beams} beams x {per_row} tokens"
    else:
        per_row = w.seq_len or 1
        rows = w.batch_size
        what = f"batch {w.batch_size} x {per_row} tokens"
    largest = max(list_gpus(), key=lambda g: g.total_memory_bytes)
    need = rows * per_row * TOKEN_ID_BYTES
    if need > largest.total_memory_bytes:
        raise BadInputError(
            f"{what}: their token ids alone ({TOKEN_ID_BYTES} B each) take "
            f"{format_bytes(need)}, more than the largest GPU memfit knows holds "
            f"({largest.display_name}, {format_bytes(largest.total_memory_bytes)}). Lower "
            "--batch or the sequence length."
        )


def estimate_from_trace(
    spec: ModelSpec,
    w: Workload,
    tr: Trace,
    *,
    n_blocks: int,
    replayed: bool,
    gpu: Any,
    alloc_conf: Any = None,
    seconds: float = 0.0,
) -> Estimate:
    """The Estimate of workload `w` from a trace of it (or of a workload that differs only in
    where storages live: offload_optimizer, embedding_on_cpu). The planner prices such variants
    from one trace this way."""

    backends = sorted(set(tr.attention_backends))
    scale = w.grad_accum / traced_micro_batches(w) if w.training else 1.0
    if w.embedding_on_cpu and tr.embedding_path is None:
        raise BadInputError(
            f"embedding_on_cpu=True needs an input embedding, and {spec.name!r} has none "
            "(get_input_embeddings() returned nothing)."
        )
    if w.embedding_on_cpu and tr.embedding_tied_to is not None:
        raise BadInputError(tied_embedding_message(tr.embedding_tied_to))
    notes: list[str] = []
    if gpu is not None:  # a dtype the card runs otherwise than natively
        notes.extend(card_notes(gpu, w.precision, w.quantize))
    notes.extend(spec.notes)  # e.g. the loss a model of unknown head is traced with
    notes.extend(tr.notes)  # e.g. which layers stayed unquantized
    records, events = without_markers(tr) if w.mode == "generate" else (tr.records, tr.events)
    # NCCL's buffers for the GPUs of FSDP2 and of tensor parallelism alike.
    device = device_memory(records, events, w, gpu=gpu, embedding_path=tr.embedding_path,
                           alloc_conf=alloc_conf, n_gpus=w.gpus * w.tp)  # fmt: skip
    notes.extend(device.notes)
    generation = None
    if w.mode == "generate":
        headroom = None
        if gpu is not None:
            headroom = gpu.fit_limit - (device.profile.device_total_bytes or 0)
        generation = generation_figures(w, tr, n_blocks, device.profile, headroom)
    if w.offload_activations:
        notes.append(offload_note(tr.records, scale))
    return Estimate(
        model=spec.name,
        workload=w,
        profile=device.profile,
        parameter_count=tr.parameter_count,
        trainable_parameter_count=tr.trainable_parameter_count,
        num_blocks=n_blocks,
        replayed=replayed,
        attention_backend=",".join(backends) if backends else None,
        trace_seconds=seconds,
        gpu=gpu,
        fits=device.fits,
        oom=device.oom,
        device_total_range=device.device_total_range,
        overhead=device.overhead,
        embedding_path=tr.embedding_path,
        records_summary=device.records_summary,
        notes=notes,
        flops=steady_flops(tr.flops, scale),
        host=device.host,
        generation=generation,
    )
