"""Renderers of an `Estimate`: the JSON contract for scripts and the terminal report.

Binary units with honest labels (KiB, MiB, GiB = 1024^n) at display only; the JSON is integer
bytes.
"""

from __future__ import annotations

from typing import Any

from memfit.estimator import Estimate
from memfit.techniques import labels as technique_labels
from memfit.units import format_bytes

#: The rule of thumb users apply today: fp32 weights (4 B) + gradients (4 B) + Adam's two fp32
#: moments (8 B) per parameter, plus activations, plus ~2 GB for CUDA context and framework.
RULE_OF_THUMB_BYTES_PER_PARAM = 16
RULE_OF_THUMB_RUNTIME_BYTES = 2 * 10**9
#: The rule of thumb for serving: the weights as stored, plus 20 % for everything else
#: (M = P x bytes per parameter x 1.2, as the popular "how much GPU memory to serve an LLM"
#: formula writes it). Used for inference and generation, where nothing is trained.
RULE_OF_THUMB_SERVING_OVERHEAD = 1.2


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
    """What the usual rule of thumb says. Training: 16 B/param + traced activations + 2 GB.
    Inference and generation: the weights as stored x 1.2 (nothing has gradients or optimizer
    state there)."""
    if not est.workload.training:
        weights = est.profile.breakdown.get("parameters", 0)
        return int(weights * RULE_OF_THUMB_SERVING_OVERHEAD)
    return (
        RULE_OF_THUMB_BYTES_PER_PARAM * est.parameter_count
        + est.profile.max_activation_bytes
        + RULE_OF_THUMB_RUNTIME_BYTES
    )


def host_lines(est: Estimate) -> list[str]:
    """What the step keeps in host RAM, when it keeps something there."""
    host = est.host
    if host is None or not host.worth_reporting:
        return []
    budget = ""
    if host.budget_bytes is not None:
        source = "--host-memory" if host.budget_source == "host_memory" else "this machine"
        budget = f" of {format_bytes(host.budget_bytes)} ({source})"
    out = [
        "",
        f"host memory (CPU RAM){budget}: {format_bytes(host.peak_bytes)}, of which "
        f"{format_bytes(host.pinned_bytes)} pinned; not counting the process itself",
    ]
    for cat, b in sorted(host.by_category.items(), key=lambda kv: -kv[1]):
        out.append(f"  {cat!s:<22}{format_bytes(b):>14}")
    return out


def generation_lines(est: Estimate) -> list[str]:
    """With mode="generate": prefill vs decode, the KV cache, the weights (issue 14)."""
    gen = est.generation
    if gen is None:
        return []
    p = est.profile
    weights = p.breakdown.get("parameters", 0) + p.breakdown.get("buffers", 0)
    per_layer = max(gen.kv_bytes_by_layer) if gen.kv_bytes_by_layer else 0
    out = [
        "",
        f"generation: {gen.cache} cache, {gen.num_beams} beam(s), "
        f"{gen.kv_tokens} cached positions at the end",
        f"  {'peak in prefill':<22}{format_bytes(gen.prefill_peak_bytes):>14}",
        f"  {'peak in decode':<22}{format_bytes(gen.decode_peak_bytes):>14}   "
        f"({gen.limiting_phase} limits)",
        f"  {'KV cache':<22}{format_bytes(gen.kv_cache_bytes):>14}   "
        f"({len(gen.kv_bytes_by_layer)} layers, up to {format_bytes(per_layer)} each; "
        f"{format_bytes(gen.kv_bytes_per_token)} per position)",
        f"  {'weights':<22}{format_bytes(weights):>14}",
    ]
    if gen.max_kv_tokens is not None and est.gpu is not None:
        out.append(
            f"  cache positions that fit on {est.gpu.display_name} at this batch: "
            f"{gen.max_kv_tokens} (everything else as traced)"
        )
    return out


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
    gen = est.generation
    if gen is not None:
        shape += f", prompt {gen.prompt_len} + {gen.new_tokens} new tokens"
    opt = "no optimizer" if not w.training else f"optimizer {w.optimizer}"
    lines.append(
        f"{est.model}: {est.parameter_count:,} parameters "
        f"({est.trainable_parameter_count:,} trainable), {w.mode}, {shape}, {w.precision}, {opt}"
    )
    extra = ", ".join(technique_labels(w))
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
    when = f"of step {p.peak_step} (step 0 is warm-up)"
    if gen is not None:  # steps are model calls: 0 the prefill, 1.. the decode steps
        when = f"(model call {p.peak_step} of {gen.new_tokens})"
    lines.append(
        f"peak during {p.peak_phase} {when}, at op {p.peak_op} in {p.peak_module or '<top>'}"
    )
    lines += generation_lines(est)
    lines.append("")
    lines.append("at the peak, by category:")
    lines += category_lines(p)
    dev = p.device_breakdown
    for key in ("allocator_cache", "cuda_context", "nccl"):
        if dev.get(key):
            lines.append(f"  {key:<22}{format_bytes(dev[key]):>14}  (outside allocated)")
    lines += host_lines(est)
    lines.append("")
    lines.append("at the peak, by module:")
    for mod, b in list(grouped_modules(p.modules_at_depth(3)).items())[:top_modules]:
        lines.append(f"  {mod:<40}{format_bytes(b):>14}")
    lines.append("")
    rule = (
        "16 B/param + activations + 2 GB"
        if est.workload.training
        else f"weights x {RULE_OF_THUMB_SERVING_OVERHEAD}"
    )
    lines.append(
        f"rule of thumb ({rule}) would say "
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
