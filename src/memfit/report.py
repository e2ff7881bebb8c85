"""Renderers of an `Estimate`: the JSON contract for scripts and the terminal report.

Binary units with honest labels (KiB, MiB, GiB = 1024^n) at display only; the JSON is integer
bytes.
"""

from __future__ import annotations

from typing import Any

from memfit.estimator import Estimate

#: The rule of thumb users apply today: fp32 weights (4 B) + gradients (4 B) + Adam's two fp32
#: moments (8 B) per parameter, plus activations, plus ~2 GB for CUDA context and framework.
RULE_OF_THUMB_BYTES_PER_PARAM = 16
RULE_OF_THUMB_RUNTIME_BYTES = 2 * 10**9


def format_bytes(n: int | None) -> str:
    """1536 -> "1.50 KiB"; binary units, labelled as such."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def grouped_modules(by_module: dict[str, int]) -> dict[str, int]:
    """Fold numbered siblings ("model.layers.0" ... ".31") into one row "model.layers.* (x32)"."""
    groups: dict[str, list[int]] = {}
    for path, b in by_module.items():
        parts = path.split(".")
        if len(parts) > 1 and parts[-1].isdigit():
            groups.setdefault(".".join(parts[:-1]) + ".*", []).append(b)
        else:
            groups.setdefault(path, []).append(b)
    out = {(k if len(v) == 1 else f"{k} (x{len(v)})"): sum(v) for k, v in groups.items()}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def category_lines(p: Any) -> list[str]:
    """The bytes of each category at a profile's peak, with its share of the peak."""
    total = max(p.peak_allocated_bytes, 1)
    return [
        f"  {cat:<22}{format_bytes(b):>14}  {100 * b / total:5.1f} %"
        for cat, b in p.breakdown.items()
        if b
    ]


def rule_of_thumb_bytes(est: Estimate) -> int:
    """What the usual rule of thumb says: 16 B/param + traced activations + 2 GB."""
    return (
        RULE_OF_THUMB_BYTES_PER_PARAM * est.parameter_count
        + est.profile.max_activation_bytes
        + RULE_OF_THUMB_RUNTIME_BYTES
    )


def to_json(est: Estimate) -> dict[str, Any]:
    """The stable JSON contract of `memfit estimate --json` (see shared/DESIGN.md)."""
    p = est.profile
    w = est.workload
    breakdown = dict(p.breakdown)
    breakdown["allocator_cache"] = p.device_breakdown.get("allocator_cache", 0)
    breakdown["cuda_context"] = p.device_breakdown.get("cuda_context", 0) + p.device_breakdown.get(
        "nccl", 0
    )
    return {
        "peak_allocated_bytes": p.peak_allocated_bytes,
        "peak_reserved_bytes": p.peak_reserved_bytes,
        "device_total_bytes": p.device_total_bytes,
        "device_total_range_bytes": list(est.device_total_range)
        if est.device_total_range
        else None,
        "fits": est.fits,
        "gpu_capacity_bytes": est.gpu.total_memory_bytes if est.gpu is not None else None,
        "oom": est.oom,
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
        "rule_of_thumb_bytes": rule_of_thumb_bytes(est),
        "workload": {
            "model": est.model,
            "parameter_count": est.parameter_count,
            "trainable_parameter_count": est.trainable_parameter_count,
            "batch_size": w.batch_size,
            "seq_len": w.seq_len,
            "image_size": w.image_size,
            "mode": w.mode,
            "precision": w.precision,
            "optimizer": w.optimizer,
            "grad_accum": w.grad_accum,
            "checkpointing": w.checkpointing,
            "attention": w.attention,
            "attention_kernel": est.attention_backend,
            "techniques": w.techniques(),
            "gpu": est.gpu.name if est.gpu is not None else None,
            "gpus": w.gpus,
            "repeated_blocks": est.num_blocks,
            "replayed": est.replayed,
        },
        "trace_seconds": round(est.trace_seconds, 3),
        "notes": est.notes,
    }


def render_text(est: Estimate, *, top_modules: int = 8) -> str:
    """The terminal report, as plain text (the CLI prints it through rich)."""
    p = est.profile
    w = est.workload
    lines: list[str] = []
    shape = f"batch {w.batch_size}"
    if w.seq_len:
        shape += f" x {w.seq_len} tokens"
    if w.image_size:
        shape += f", {w.image_size}x{w.image_size} images"
    opt = "no optimizer" if not w.training else f"optimizer {w.optimizer}"
    lines.append(
        f"{est.model}: {est.parameter_count:,} parameters "
        f"({est.trainable_parameter_count:,} trainable), {w.mode}, {shape}, {w.precision}, {opt}"
    )
    extra = ", ".join(w.techniques())
    if extra:
        lines.append(f"techniques: {extra}")
    if est.attention_backend:
        lines.append(f"attention kernel (as CUDA would pick): {est.attention_backend}")
    lines.append("")
    lines.append(f"  {'peak allocated':<22}{format_bytes(p.peak_allocated_bytes):>14}   "
                 "(torch.cuda.max_memory_allocated)")  # fmt: skip
    lines.append(f"  {'peak reserved':<22}{format_bytes(p.peak_reserved_bytes):>14}   "
                 "(torch.cuda.max_memory_reserved)")  # fmt: skip
    rng = ""
    if est.device_total_range:
        lo, hi = est.device_total_range
        rng = f", range {format_bytes(lo)} - {format_bytes(hi)}"
    lines.append(f"  {'device total':<22}{format_bytes(p.device_total_bytes):>14}   "
                 f"(nvidia-smi{rng})")  # fmt: skip
    lines.append("")
    lines.append(
        f"peak during {p.peak_phase} of step {p.peak_step} (step 0 is warm-up), at op "
        f"{p.peak_op} in {p.peak_module or '<top>'}"
    )
    lines.append("")
    lines.append("at the peak, by category:")
    lines += category_lines(p)
    dev = p.device_breakdown
    for key in ("allocator_cache", "cuda_context", "nccl"):
        if dev.get(key):
            lines.append(f"  {key:<22}{format_bytes(dev[key]):>14}  (outside allocated)")
    lines.append("")
    lines.append("at the peak, by module:")
    for mod, b in list(grouped_modules(p.modules_at_depth(3)).items())[:top_modules]:
        lines.append(f"  {mod:<40}{format_bytes(b):>14}")
    lines.append("")
    lines.append(
        f"rule of thumb (16 B/param + activations + 2 GB) would say "
        f"{format_bytes(rule_of_thumb_bytes(est))}; the trace says "
        f"{format_bytes(p.device_total_bytes)} on the device."
    )
    if est.gpu is not None:
        cap = est.gpu.total_memory_bytes
        verdict = "FITS" if est.fits else "DOES NOT FIT"
        share = 100 * (p.device_total_bytes or 0) / cap
        lines.append(
            f"{verdict} on {est.gpu.display_name} ({format_bytes(cap)}): device total "
            f"{format_bytes(p.device_total_bytes)}, {share:.1f} % of capacity "
            "(5 % margin required)."
        )
        if est.oom:
            lines.append(f"simulated: {est.oom}")
    for note in est.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)
