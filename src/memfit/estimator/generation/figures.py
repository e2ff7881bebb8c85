"""`mode="generate"`: the installed transformers' own `generate` on fake tensors.

The trace runs `model.generate(input_ids, max_new_tokens=n, num_beams=K, ...)` under the tracker,
so what the real code does is what is measured: the prefill's logits (transformers 5 asks the
model for the last position only, `logits_to_keep`), a DynamicCache growing by `torch.cat` (old
and new keys alive together in each layer), a StaticCache allocated at its maximum length
(`max_length - 1` positions) and written in place, sliding-window layers that stop growing,
grouped-query attention (the cache holds `num_key_value_heads` heads), beam search's
`index_select` of every layer at every step. Each model call is one step of the stream: step 0
is the prefill (phase "prefill"), steps 1.. are decode steps (phase "decode").

Fake tensors have no values, so the few places where `generate` reads one are answered the way a
generation of exactly `new_tokens` tokens from memfit's synthetic prompt (no padding, no special
tokens) answers them (see memfit.estimator.generation.oracle.Oracle): no sequence stops before
`max_new_tokens`,
the worst case for memory. The quantized and offloaded caches run transformers' own code, with
what fake CPU tensors cannot do emulated (estimator.generation.kv_cache_quantized,
kv_cache_offload).

A generation of N tokens has N model calls. Only a few are traced (memfit.estimator.
decode_extension extends the stream to N and checks the extension against a longer trace).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from memfit._compat import generate_keeps_all_ones_mask
from memfit.errors import BadInputError, TraceError
from memfit.estimator.auto_precision import check_resolved
from memfit.estimator.generation import kv_cache_offload, kv_cache_quantized
from memfit.estimator.generation.decode_extension import (
    CALL_END_OP,
    EXTEND_ABOVE,
    KV_LAYER_ATTR,
    TRACED_CALLS,
    extend_decode,
)
from memfit.estimator.generation.kv_cache import CacheWatcher, check_tp, kv_geometry
from memfit.estimator.generation.oracle import (
    GenerationTracker,
    Oracle,
    check_transformers_generate,
    device_mask_checks,
    quiet_generate,
)
from memfit.estimator.trace.block_replay import TRACED_BLOCKS, ReplayMismatch, expand
from memfit.estimator.trace.fake_distributed import fake_world
from memfit.estimator.trace.step_runner import (
    DTYPES,
    Trace,
    _emulate_cuda,
    _register_model,
    _traced_model,
    _unpacked_synthetic_inputs,
)
from memfit.estimator.trace.tracker import Tracker, parameter_modules
from memfit.events import ALLOC, Category, Event, StorageRecord
from memfit.models.sources import ModelSpec
from memfit.models.structure import embedding_tied_to, input_embedding_path
from memfit.profile import MemoryProfile
from memfit.techniques.parallel.tensor_parallel import (
    check_tensor_parallel,
    parallelize_for_trace,
    real_waits,
)
from memfit.techniques.quantize.trace import logical_numel
from memfit.workload import Workload

_KV_LAYER = KV_LAYER_ATTR
#: The Trace attribute saying whether its decode steps were extended (decode_extension).
_EXTENDED = "_memfit_decode_extended"


@dataclass
class GenerationTrace:
    """A traced generation: the stream, and the model calls it made."""

    trace: Trace
    new_tokens: int
    #: Model calls made (1 prefill + new_tokens - 1 decode steps).
    calls: int
    #: Storage id -> cache layer index, for the KV cache's storages.
    kv_layer: dict[int, int] = field(default_factory=dict)


def check_generation(spec: ModelSpec, w: Workload) -> None:
    """What the trace cannot run, refused before tracing with the value and the fix."""
    check_transformers_generate()
    if w.tp > 1:
        config = _config_of(spec)
        if config is not None and hasattr(config, "num_attention_heads"):
            check_tp(kv_geometry(config), w.tp)
    check_tensor_parallel(w.tp, w.quantize)
    check_resolved(w)
    if w.cache == "offloaded":
        kv_cache_offload.check_offloaded(w.tp, w.num_beams)
    if w.cache == "quantized":
        config = _config_of(spec)
        has_heads = config is not None and hasattr(config, "num_attention_heads")
        kv_cache_quantized.check_quantized(kv_geometry(config) if has_heads else None, w.num_beams)
    if spec.task != "causal-lm" or spec.input_kind != "tokens":
        raise BadInputError(
            f"mode='generate' needs a decoder-only language model (task 'causal-lm'), and "
            f"{spec.name!r} has task {spec.task!r}. Use mode='inference' for one forward, or a "
            "causal-LM model."
        )
    if spec.batch_is_user_defined:
        raise BadInputError(
            f"mode='generate' makes its own prompt of prompt_len tokens, and {spec.name!r} has an "
            "input factory (make_batch). Drop the factory, or use mode='inference'."
        )
    prompt = prompt_len(w)
    total = prompt + w.new_tokens
    if spec.max_positions is not None and total > spec.max_positions:
        raise BadInputError(
            f"prompt_len={prompt} + new_tokens={w.new_tokens} = {total} positions, longer than "
            f"{spec.name!r} supports ({spec.max_positions}). Use prompt_len="
            f"{max(spec.max_positions - w.new_tokens, 1)} or less, or fewer new_tokens."
        )


def _config_of(spec: ModelSpec) -> Any:
    """The config of a catalog model (attributes read by kv_geometry), else None."""
    entry = spec.extra.get("entry")
    config = getattr(entry, "config", None)
    if config is None or getattr(entry, "model_type", None) is None:
        return None
    import types

    return types.SimpleNamespace(**dict(config))


#: The prompt length when none is given: the inference default sequence length (step_runner).
DEFAULT_PROMPT_LEN = 512


def prompt_len(w: Workload) -> int:
    return w.prompt_len if w.prompt_len is not None else DEFAULT_PROMPT_LEN


def generate_kwargs(w: Workload, new_tokens: int) -> dict[str, Any]:
    """The `generate` arguments of the workload, generating `new_tokens` tokens.

    A static cache is sized as `generate` sizes it for the whole workload (`max_length - 1`
    positions, transformers' `_prepare_cache_for_generation`), even when fewer tokens are
    traced: `max_cache_len` raises the length to that.
    """
    kwargs: dict[str, Any] = {
        "max_new_tokens": new_tokens,
        "min_new_tokens": None,
        "do_sample": False,
        "num_beams": w.num_beams,
        "num_return_sequences": 1,
        "use_cache": True,
    }
    if w.cache == "static":
        kwargs["cache_implementation"] = "static"
        kwargs["max_cache_len"] = prompt_len(w) + w.new_tokens - 1
    elif w.cache in ("quantized", "offloaded"):
        # QuantizedCache(backend="quanto"), DynamicCache(offloading=True)
        kwargs["cache_implementation"] = w.cache
    return kwargs


def trace_generation_once(
    spec: ModelSpec,
    w: Workload,
    capability: tuple[int, int] | None,
    *,
    num_layers: int | None,
    new_tokens: int,
) -> GenerationTrace:
    """One traced `generate` of `new_tokens` tokens (the cache sized for `w.new_tokens`); with
    `w.tp > 1`, of rank 0 of a tensor-parallel model over a fake process group."""
    if w.tp == 1:
        return _traced_once(spec, w, capability, num_layers, new_tokens, None)
    with fake_world(w.tp) as mesh, real_waits():
        return _traced_once(spec, w, capability, num_layers, new_tokens, mesh)


def _traced_once(spec: ModelSpec, w: Workload, capability: tuple[int, int] | None,
                 num_layers: int | None, new_tokens: int,
                 mesh: Any) -> GenerationTrace:  # fmt: skip
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    low = DTYPES[w.compute_dtype_name]
    model, blocks, prepared = _traced_model(spec, w, num_layers, fake_mode, low, None)
    notes = list(prepared.notes)
    if mesh is not None:  # as from_pretrained(distributed_config=DistributedConfig(tp_size=N))
        notes.append(parallelize_for_trace(model, w, mesh, fake_mode))
    config = getattr(model, "config", None)
    if config is not None:
        config.use_cache = True  # _traced_model turns it off for training and inference
        if w.cache == "quantized" and hasattr(config, "num_attention_heads"):
            kv_cache_quantized.check_quantized(kv_geometry(config), w.num_beams)
    params = list(dict.fromkeys(model.parameters()))
    tracker = GenerationTracker(model, blocks)
    emulation = _emulate_cuda(tracker, w, low, capability)
    watcher = CacheWatcher(tracker)
    oracle = Oracle(new_tokens)
    tracker.oracle, tracker.prompt_len = oracle, prompt_len(w)

    def before_call(module: Any, args: Any, kwargs: Any) -> None:
        tracker.step = oracle.calls
        if oracle.calls == 0:  # as memfit.measure files them: what the first call is given
            tracker.set_phase("forward", 0)
            for t in _tensors((args, kwargs)):
                if tracker.sid_of(t) is not None:
                    tracker.mark(t, Category.INPUTS)
        watcher.see(kwargs)

    def after_call(module: Any, args: Any, kwargs: Any, out: Any) -> None:
        oracle.calls += 1
        _call_end(tracker)

    handles = [
        model.register_forward_pre_hook(before_call, with_kwargs=True),
        model.register_forward_hook(after_call, with_kwargs=True),
    ]
    vocab = int(getattr(config, "vocab_size", 32000) or 32000)
    kept: list[Any] = []  # the generated ids outlive the trace, as a user's generate result does
    try:
        with fake_mode, tracker, oracle.patched(), _unpacked_synthetic_inputs(spec), \
                device_mask_checks(), _cache_emulation(w, tracker):  # fmt: skip
            _register_model(tracker, model, params, [], parameter_modules(model))
            try:
                tracker.set_phase("inputs", 0)
                ids = torch.randint(0, vocab, (w.batch_size, prompt_len(w)))  # (B, P)
                # Until the first model call, generate's own setup (phase "prefill", outside any
                # forward region, as memfit.measure sees it before the model runs).
                tracker.set_phase("prefill", 0)
                with torch.no_grad(), emulation, quiet_generate():
                    kept.append(cast(Any, model).generate(ids, **generate_kwargs(w, new_tokens)))
                emulation.clear_cache()
            except (BadInputError, TraceError):
                raise
            except Exception as e:  # an op the fake tracer cannot run
                from memfit.estimator.trace.step_runner import _trace_error

                raise _trace_error(e, tracker) from e
            finally:
                watcher.close()
                tracker.close()
    finally:
        for h in handles:
            h.remove()
    kept.clear()
    gc.collect()
    if oracle.calls != new_tokens:
        raise TraceError(
            f"generate called the model {oracle.calls} times for {new_tokens} new tokens "
            f"(expected {new_tokens}); memfit cannot tell prefill from decode in {spec.name!r}."
        )
    trace = Trace(
        records=tracker.records,
        events=tracker.events,
        parameter_count=sum(logical_numel(p) for p in params),
        trainable_parameter_count=0,
        block_paths=blocks,
        attention_backends=tracker.attention_backends,
        flops=tracker.flops,
        embedding_path=input_embedding_path(model),
        embedding_tied_to=embedding_tied_to(model),
        block_parameter_count=_block_params(model, blocks),
        module_types={n: type(m).__name__ for n, m in model.named_modules()},
        notes=notes,
    )
    setattr(trace, _KV_LAYER, dict(watcher.layer_of))
    return GenerationTrace(
        trace=trace, new_tokens=new_tokens, calls=oracle.calls, kv_layer=dict(watcher.layer_of)
    )


def _cache_emulation(w: Workload, tracker: Tracker) -> Any:
    """What the quantized and offloaded caches need emulated on a fake trace, else nothing."""
    import contextlib

    if w.cache == "offloaded":
        return kv_cache_offload.emulated(tracker)
    if w.cache == "quantized":
        return kv_cache_quantized.emulated()
    return contextlib.nullcontext()


def _block_params(model: torch.nn.Module, blocks: list[str]) -> int:
    if len(blocks) < 2:
        return 0
    return sum(logical_numel(p) for p in model.get_submodule(blocks[1]).parameters())


def _tensors(obj: Any) -> list[torch.Tensor]:
    from torch.utils import _pytree as pytree

    return [t for t in pytree.tree_leaves(obj) if isinstance(t, torch.Tensor)]


def _call_end(tracker: Tracker) -> None:
    """A zero-byte marker at the end of a model call (CALL_END_OP); never freed."""
    sid = tracker.ledger.new_id()
    tracker.records[sid] = StorageRecord(
        sid, 0, Category.TEMPORARIES, tracker.phase, tracker.step, CALL_END_OP, "", -1, 0
    )
    tracker.events.append(Event(ALLOC, sid, tracker.phase, tracker.step, CALL_END_OP, "", -1))


# -- the whole generation: repeated blocks replayed, phases named, KV read ---------------------


@dataclass(kw_only=True)
class GenerationFigures:
    """What a generation holds, besides the profile (`Estimate.generation`).

    Attributes:
        prompt_len, new_tokens, num_beams, cache: the generation estimated.
        kv_tokens: positions the cache holds at the end (prompt_len + new_tokens - 1: the
            last token is never fed back; a static cache is allocated at that length).
        kv_cache_bytes: the cache's bytes at the end of the last model call, all layers,
            wherever they are (an offloaded cache's host copies included; a quantized cache's
            packed data, scales and shifts, and full-precision residual).
        kv_bytes_by_layer: the same by layer (index in the model's layer stack).
        kv_host_bytes: of kv_cache_bytes, the bytes in host memory (cache="offloaded": every
            layer but the one prefetched for the next step); 0 for the other caches.
        kv_bytes_per_token: kv_cache_bytes over the positions held (exact for a plain cache).
        prefill_peak_bytes / decode_peak_bytes: peak allocated during the prefill (the
            first model call and generate's setup) and during the decode steps.
        limiting_phase: "prefill" or "decode", whichever peaks higher.
        max_kv_tokens: when a GPU is named, the cache positions that fit (kv_tokens plus the
            headroom below the fit limit over the device bytes per position: kv_bytes_per_token,
            or for an offloaded cache the two layers on the device at once); None otherwise.
        decode_extended: the decode steps were rebuilt from a few traced model calls
            (memfit.estimator.generation.decode_extension), not each traced.
    """

    prompt_len: int
    new_tokens: int
    num_beams: int
    cache: str
    kv_tokens: int
    kv_cache_bytes: int
    kv_bytes_by_layer: list[int]
    kv_bytes_per_token: int
    prefill_peak_bytes: int
    decode_peak_bytes: int
    limiting_phase: str
    max_kv_tokens: int | None = None
    decode_extended: bool = False
    kv_host_bytes: int = 0


def name_phases(trace: Trace) -> None:
    """Model call 0 is the prefill, calls 1.. decode steps: the traced "forward" becomes
    "prefill" (step 0) or "decode" (steps >= 1), in events and records."""

    def name(phase: str, step: int) -> str:
        if phase != "forward":
            return phase
        return "prefill" if step == 0 else "decode"

    trace.events = [ev._replace(phase=name(ev.phase, ev.step)) for ev in trace.events]
    for rec in trace.records.values():
        # An offloaded layer's host copy keeps "forward", where it was made: host storages
        # made in a forward are pinned (host_memory.is_pinned), as `.to("cpu",
        # non_blocking=True)` pins them (estimator.generation.kv_cache_offload).
        if not rec.host:
            rec.phase = name(rec.phase, rec.step)


def kv_at_last_call(trace: Trace, n_layers: int) -> tuple[list[int], int]:
    """KV bytes per layer alive at the end of the last model call (its CALL_END_OP marker),
    on the device and in host memory, and the host bytes among them.

    The layer of a storage is its repeated block (record owner); a model without repeated
    blocks counts its cache as layer 0. An offloaded cache's prefetched copy is made in the
    block before its layer's (the last block prefetches layer 0).
    """
    records = trace.records
    last = max(i for i, ev in enumerate(trace.events) if ev.op == CALL_END_OP)
    alive: dict[int, None] = {}
    for ev in trace.events[: last + 1]:
        if ev.kind == ALLOC:
            alive[ev.sid] = None
        else:
            alive.pop(ev.sid, None)
    by_layer = [0] * max(n_layers, 1)
    host = 0
    # Beam search reorders each layer outside its block (owner -1): the watcher's layer then.
    layer_of: dict[int, int] = getattr(trace, _KV_LAYER, {})
    for sid in alive:
        rec = records[sid]
        if rec.category == Category.KV_CACHE:
            layer = rec.owner if rec.owner >= 0 else layer_of.get(sid, 0)
            if rec.op == kv_cache_offload.OP_TO_DEVICE and rec.owner >= 0:
                layer = (layer + 1) % len(by_layer)
            by_layer[min(layer, len(by_layer) - 1)] += rec.nbytes
            host += rec.nbytes if rec.host else 0
    return by_layer, host


def without_markers(trace: Trace) -> tuple[dict[int, StorageRecord], list[Event]]:
    """The stream without its CALL_END_OP markers (zero bytes), for the allocator replay."""
    marks = {ev.sid for ev in trace.events if ev.op == CALL_END_OP}
    records = {sid: r for sid, r in trace.records.items() if sid not in marks}
    return records, [ev for ev in trace.events if ev.sid not in marks]


def trace_generation(
    spec: ModelSpec, w: Workload, capability: tuple[int, int] | None
) -> tuple[Trace, int, bool]:
    """Trace the generation of `w`; returns (trace, blocks, replayed) as `trace_spec` does.

    Repeated blocks are replayed as for a step (memfit.estimator.trace.block_replay): 3 of N layers
    are
    traced and expanded, checked against a 4-layer trace (same live-bytes timeline, event for
    event); otherwise the whole model is traced. Decode steps are extended from a few traced
    model calls, checked against a longer trace (memfit.estimator.generation.decode_extension);
    otherwise
    every call is traced. The phases are then named ("prefill", "decode"); the CALL_END_OP
    markers stay for `generation_figures`.
    """
    check_generation(spec, w)
    n = spec.num_layers
    # The replay is checked on the calls the decode extension traces first (all of a short one).
    first = TRACED_CALLS if w.new_tokens > EXTEND_ABOVE else w.new_tokens

    def traced(layers: int | None, calls: int, wl: Workload = w) -> Trace:
        return trace_generation_once(
            spec, wl, capability, num_layers=layers, new_tokens=calls
        ).trace

    if spec.can_shorten and n is not None and n > TRACED_BLOCKS + 1 and _uniform(spec):
        short = traced(TRACED_BLOCKS, first)
        if len(short.block_paths) == TRACED_BLOCKS and _replay_holds(
            spec, w, capability, short, first
        ):

            def expanded(calls: int, wl: Workload = w) -> Trace:
                tr = short if calls == first and wl is w else traced(TRACED_BLOCKS, calls, wl)
                records, events = expand(tr.records, tr.events, n, tr.block_paths)
                return replace(
                    tr, records=records, events=events,
                    parameter_count=tr.parameter_count
                    + (n - TRACED_BLOCKS) * tr.block_parameter_count,
                    flops={key: f * (1 + n - TRACED_BLOCKS) if key[2] == 1 else f
                           for key, f in tr.flops.items()},
                )  # fmt: skip

            try:
                ext = extend_decode(
                    expanded, w.new_tokens, why_not=_not_extended(w),
                    trace_filled=filled_tracer(w, expanded),
                )  # fmt: skip
            except ReplayMismatch:
                pass
            else:
                return _named(ext.trace, ext.extended, ext.why_not), n, True
    ext = extend_decode(
        lambda calls: traced(None, calls), w.new_tokens, why_not=_not_extended(w),
        trace_filled=filled_tracer(w, lambda calls, wl: traced(None, calls, wl)),
    )  # fmt: skip
    return _named(ext.trace, ext.extended, ext.why_not), len(ext.trace.block_paths), False


def filled_tracer(
    w: Workload, traced: Callable[[int, Workload], Trace]
) -> Callable[[int], Trace] | None:
    """For decode_extension: traces of n calls whose last call fills the static cache as the
    workload's last call does, when that call differs from the steps before it; else None.

    transformers < 5.18 pads generate's 2-D mask to the static cache's length on every call
    but the last (_compat.generate_keeps_all_ones_mask; masking_utils.prepare_padding_mask).
    A generation of n calls with a prompt longer by new_tokens - n has the same cache
    (max_cache_len = prompt_len + new_tokens - 1), and its decode step s holds what the
    workload's step s + new_tokens - n holds.
    """
    if w.cache != "static" or not generate_keeps_all_ones_mask():
        return None
    return lambda n: traced(n, w.with_(prompt_len=prompt_len(w) + w.new_tokens - n, new_tokens=n))


def _named(trace: Trace, extended: bool, why_not: str | None) -> Trace:
    """The trace with its phases named, and how its decode steps were made (`_EXTENDED`; a
    note when a long generation had to be traced call by call)."""
    name_phases(trace)
    setattr(trace, _EXTENDED, extended)
    if why_not is not None:
        trace.notes.append(
            f"every model call was traced: the decode steps did not extend from "
            f"{TRACED_CALLS} traced calls ({why_not})."
        )
    return trace


def _not_extended(w: Workload) -> str | None:
    """Why the decode steps of `w` are not linear in the step, or None when they may be.

    A quantized cache re-quantizes every `residual_length` decode steps: a generation with
    such a flush is traced call by call (one without is linear, and extended and checked as
    any other)."""
    residual = kv_cache_quantized.RESIDUAL_LENGTH
    if w.cache == "quantized" and w.new_tokens - 1 >= residual:
        return (
            f"the quantized cache re-quantizes every {residual} decode steps, and "
            f"{w.new_tokens - 1} decode steps include such a flush"
        )
    return None


def _uniform(spec: ModelSpec) -> bool:
    """False when the config gives layers different behaviour (sliding-window layers)."""
    entry = spec.extra.get("entry")
    if entry is None:
        return True
    types = dict(entry.config).get("layer_types")
    return not types or len(set(types)) <= 1


def _replay_holds(
    spec: ModelSpec, w: Workload, capability: tuple[int, int] | None, short: Trace, calls: int
) -> bool:
    """The 3-layer generation expanded to 4 layers equals a 4-layer trace, event for event."""
    four = trace_generation_once(
        spec, w, capability, num_layers=TRACED_BLOCKS + 1, new_tokens=calls
    ).trace
    try:
        records, events = expand(short.records, short.events, TRACED_BLOCKS + 1, short.block_paths)
    except ReplayMismatch:
        return False
    a = MemoryProfile.from_events(records, events)
    b = MemoryProfile.from_events(four.records, four.events)
    return a.timeline == b.timeline and a.breakdown == b.breakdown and a.by_module == b.by_module


def generation_figures(
    w: Workload, trace: Trace, n_layers: int, profile: MemoryProfile, headroom: int | None
) -> GenerationFigures:
    """The generation's figures from its (expanded) trace and its device profile.

    `headroom`: bytes left below the fit limit on the named GPU (negative when it does not
    fit), or None without a GPU.
    """
    by_layer, host = kv_at_last_call(trace, n_layers)
    prompt = prompt_len(w)
    tokens = prompt + w.new_tokens - 1
    total = sum(by_layer)
    per_token = total // tokens if tokens else 0
    # The device's bytes per position: an offloaded cache has two layers there at once.
    on_device = min(2, len(by_layer)) * max(by_layer) if w.cache == "offloaded" else total
    device_per_token = on_device // tokens if tokens else 0
    peaks = {"prefill": 0, "decode": 0}
    for ph in profile.phases:
        if ph.phase in peaks:
            peaks[ph.phase] = max(peaks[ph.phase], ph.peak_bytes)
    limiting = "decode" if peaks["decode"] > peaks["prefill"] else "prefill"
    max_tokens = None
    if headroom is not None and device_per_token > 0:
        max_tokens = max(tokens + headroom // device_per_token, 0)
    return GenerationFigures(
        prompt_len=prompt,
        new_tokens=w.new_tokens,
        num_beams=w.num_beams,
        cache=w.cache,
        kv_tokens=tokens,
        kv_cache_bytes=total,
        kv_bytes_by_layer=by_layer,
        kv_bytes_per_token=per_token,
        prefill_peak_bytes=peaks["prefill"],
        decode_peak_bytes=peaks["decode"],
        limiting_phase=limiting,
        max_kv_tokens=max_tokens,
        decode_extended=bool(getattr(trace, _EXTENDED, False)),
        kv_host_bytes=host,
    )
