"""The JSON contract (shared/DESIGN.md): one writer for a `MemoryProfile`, estimated or measured,
and the estimate's document around it (`memfit estimate --json`, `memfit profile --json`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from memfit.estimator import Estimate
from memfit.profile import MemoryProfile
from memfit.report.text import rule_of_thumb_bytes
from memfit.techniques import labels as technique_labels
from memfit.workload import LoraConfig, Workload


def profile_json(profile: MemoryProfile, **extra: Any) -> dict[str, Any]:
    """A profile as the contract writes it; `extra` keys (a measurement's `source`, `device`)
    come first.

    Device-only categories join the breakdown when known: `allocator_cache` is reserved minus
    allocated at the peak, `cuda_context` what nvidia-smi shows beyond the allocator (the CUDA
    context and NCCL's communicators), which only an estimate models.
    """
    p = profile
    breakdown: dict[str, int] = dict(p.breakdown)
    if p.peak_reserved_bytes is not None:
        breakdown["allocator_cache"] = p.peak_reserved_bytes - p.peak_allocated_bytes
    if p.device_breakdown:
        breakdown["cuda_context"] = p.device_breakdown.get(
            "cuda_context", 0
        ) + p.device_breakdown.get("nccl", 0)
    return {
        **extra,
        "peak_allocated_bytes": p.peak_allocated_bytes,
        "peak_reserved_bytes": p.peak_reserved_bytes,
        "device_total_bytes": p.device_total_bytes,
        "breakdown": breakdown,
        "peak_phase": p.peak_phase,
        "peak_step": p.peak_step,
        "peak_op": p.peak_op,
        "peak_module": p.peak_module,
        "by_module": p.by_module,
        "phases": [
            {"step": ph.step, "phase": ph.phase, "peak_bytes": ph.peak_bytes} for ph in p.phases
        ],
        "top_tensors": p.top_tensors,
    }


def host_json(host: Any) -> dict[str, Any] | None:
    """Host RAM of what the step keeps on the CPU (memfit.estimator.host_memory)."""
    if host is None:
        return None
    return {
        "peak_bytes": host.peak_bytes,
        "pinned_bytes": host.pinned_bytes,
        "pageable_bytes": host.pageable_bytes,
        "by_category": {str(k): v for k, v in host.by_category.items()},
        "budget_bytes": host.budget_bytes,
        "budget_source": host.budget_source,
        "fits": host.fits,
    }


def generation_json(est: Estimate) -> dict[str, Any]:
    """The generation keys of the contract (mode="generate" only): `kv_cache_bytes` (of which
    `kv_host_bytes` on the host: an offloaded cache), `prefill_peak_bytes`,
    `decode_peak_bytes`, `max_kv_tokens` (a GPU named), `generation`."""
    gen = est.generation
    if gen is None:
        return {}
    return {
        "kv_cache_bytes": gen.kv_cache_bytes,
        "kv_host_bytes": gen.kv_host_bytes,
        "prefill_peak_bytes": gen.prefill_peak_bytes,
        "decode_peak_bytes": gen.decode_peak_bytes,
        "max_kv_tokens": gen.max_kv_tokens,
        "generation": {
            "prompt_len": gen.prompt_len,
            "new_tokens": gen.new_tokens,
            "num_beams": gen.num_beams,
            "cache": gen.cache,
            "kv_tokens": gen.kv_tokens,
            "kv_bytes_by_layer": gen.kv_bytes_by_layer,
            "kv_bytes_per_token": gen.kv_bytes_per_token,
            "limiting_phase": gen.limiting_phase,
        },
    }


def workload_json(w: Workload) -> dict[str, Any]:
    """Every Workload field under its own name, in the dataclass's order (a LoraConfig as an
    object, tuples as lists): a field added to Workload reaches the contract, and
    `workload_from_json` rebuilds the Workload from it."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(Workload):
        if not f.init:
            continue
        value = getattr(w, f.name)
        if isinstance(value, LoraConfig):
            targets = [value.targets] if isinstance(value.targets, str) else list(value.targets)
            value = {"rank": value.rank, "alpha": value.alpha, "targets": targets}
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def workload_from_json(obj: dict[str, Any]) -> Workload:
    """The Workload an estimate's JSON "workload" object describes (`estimate_json`)."""
    names = {f.name for f in dataclasses.fields(Workload) if f.init}
    fields = {k: v for k, v in obj.items() if k in names}
    fields["freeze"] = tuple(fields.get("freeze") or ())
    lora = fields.get("lora")
    if lora is not None:
        fields["lora"] = LoraConfig(rank=lora["rank"], alpha=lora["alpha"],
                                    targets=tuple(lora["targets"]))  # fmt: skip
    return Workload(**fields)


def estimate_json(est: Estimate) -> dict[str, Any]:
    """The stable JSON contract of `memfit estimate --json` (see shared/DESIGN.md)."""
    w = est.workload
    out = profile_json(est.profile)
    # The contract always has these keys for an estimate (0 when no device was emulated).
    out["breakdown"].setdefault("allocator_cache", 0)
    out["breakdown"].setdefault("cuda_context", 0)
    return {
        **out,
        "device_total_range_bytes": list(est.device_total_range)
        if est.device_total_range
        else None,
        "fits": est.fits,
        "gpu_capacity_bytes": est.gpu.total_memory_bytes if est.gpu is not None else None,
        "oom": est.oom,
        "rule_of_thumb_bytes": rule_of_thumb_bytes(est),
        "workload": {
            "model": est.model,
            "parameter_count": est.parameter_count,
            "trainable_parameter_count": est.trainable_parameter_count,
            **workload_json(w),
            # The GPU as estimated (a budget-limited card has its own name); the kernel the
            # attention ran with, and the techniques as reports list them.
            "gpu": est.gpu.name if est.gpu is not None else None,
            "attention_kernel": est.attention_backend,
            "techniques": technique_labels(w),
            "repeated_blocks": est.num_blocks,
            "replayed": est.replayed,
        },
        "host_memory": host_json(est.host),
        **generation_json(est),
        "trace_seconds": round(est.trace_seconds, 3),
        "notes": est.notes,
    }
