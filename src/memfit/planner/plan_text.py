"""Renderers of `Plan` and `Limit`: terminal text and JSON for scripts."""

from __future__ import annotations

import itertools
from typing import Any

from memfit.planner.limits import Limit
from memfit.planner.search import Candidate, Plan
from memfit.planner.shapes import PLAN_LOSS_CHUNKS, teacher_of
from memfit.techniques import labels as technique_labels
from memfit.units import format_bytes
from memfit.workload.code import workload_code


def _describe(c: Candidate) -> str:
    w = c.workload
    head = [f"micro-batch {w.batch_size} x {w.grad_accum} accumulation", w.precision, w.optimizer]
    return ", ".join(head + [t for t in technique_labels(w) if not t.startswith("grad-accum")])


def apply_code(c: Candidate, model: str, gpu: str) -> str:
    """The Python that applies this configuration to the user's model (memfit.apply_)."""
    w = c.workload
    head = ""
    if w.gpus > 1:
        head = (
            f"# launch: torchrun --nproc-per-node {w.gpus} train.py; in it, before apply_:\n"
            "# torch.distributed.init_process_group(); torch.cuda.set_device(local_rank)\n"
        )
    head += f"import memfit\nworkload = {workload_code(w)}\n"
    device = ', device="cuda"' if w.gpus > 1 else ""
    teacher, batch = "", ""
    if w.teacher is not None and w.teacher_top_k is None:
        teacher = ", teacher=teacher"  # the teacher module, cast and frozen in place
    elif w.teacher is not None:
        batch = "  # with the teacher's top-k logits and token ids, computed beforehand"
    return head + (
        f"setup = memfit.apply_(model, workload{device}{teacher})  # your nn.Module, changed "
        "in place\n"
        f"for batch in loader:{batch}\n"
        "    loss = setup.step(batch)  # micro-batches, autocast, optimizer step; a float"
    )


def _candidate_json(c: Candidate) -> dict[str, Any]:
    p = c.estimate.profile
    return {
        "micro_batch": c.workload.batch_size,
        "grad_accum": c.workload.grad_accum,
        "precision": c.workload.precision,
        "optimizer": c.workload.optimizer,
        "checkpointing": c.workload.checkpointing,
        "checkpoint_first": c.workload.checkpoint_first,
        "lora_rank": c.workload.lora.rank if c.workload.lora else None,
        "offload_optimizer": c.workload.offload_optimizer,
        "embedding_on_cpu": c.workload.embedding_on_cpu,
        "tie_embeddings": c.workload.tie_embeddings,
        "quantize": c.workload.quantize,
        "optimizer_in_backward": c.workload.optimizer_in_backward,
        "offload_activations": c.workload.offload_activations,
        "chunked_loss": c.workload.chunked_loss,
        "fsdp_cpu_offload": c.workload.fsdp_cpu_offload,
        "teacher": c.workload.teacher,
        "distill_loss": c.workload.distill_loss if c.workload.teacher else None,
        "teacher_quantize": c.workload.teacher_quantize,
        "teacher_top_k": c.workload.teacher_top_k,
        "host_bytes": c.estimate.host.peak_bytes if c.estimate.host is not None else None,
        "peak_allocated_bytes": p.peak_allocated_bytes,
        "peak_reserved_bytes": p.peak_reserved_bytes,
        "device_total_bytes": p.device_total_bytes,
        "fits": c.fits,
        "step_seconds": round(c.cost.seconds, 4),
        "tokens_per_second": round(c.cost.tokens_per_second, 1),
    }


def plan_to_json(plan: Plan) -> dict[str, Any]:
    return {
        "model": plan.model,
        "gpu": plan.gpu.name,
        "goal": {
            "global_batch": plan.goal.global_batch,
            "seq_len": plan.goal.seq_len,
            "precision": plan.goal.precision,
            "optimizer": plan.goal.optimizer,
            "teacher": teacher_of(plan.goal),
        },
        "fits": plan.best is not None,
        "widened": list(plan.widened),
        "best": _candidate_json(plan.best) if plan.best else None,
        "pareto": [_candidate_json(c) for c in plan.pareto],
        "baseline": _candidate_json(plan.baseline) if plan.baseline else None,
        "closest_miss": _candidate_json(plan.closest_miss) if plan.closest_miss else None,
        "suggestions": plan.suggestions,
        "evaluated": plan.evaluated,
        "traces": plan.traces,
        "seconds": round(plan.seconds, 2),
        "from_cache": plan.from_cache,
        "note": "Step times are estimates from a roofline cost model; the ranking is the point.",
    }


def _top_categories(c: Candidate, n: int = 3) -> str:
    b = c.estimate.profile.breakdown
    top = sorted(((v, k) for k, v in b.items() if v), reverse=True)[:n]
    return ", ".join(f"{k} {format_bytes(v)}" for v, k in top)


def _distillation_lines(plan: Plan) -> list[str]:
    """What the recommendation changes in the distillation, and why: the options it uses
    beyond the plain one (the KL of both full logits, the teacher online and unquantized)."""
    assert plan.best is not None
    w = plan.best.workload
    used = []
    if w.distill_loss == "chunked-kl":
        used.append(
            f"the KL over {PLAN_LOSS_CHUNKS} chunks of the positions (distill_loss='chunked-kl': "
            "one chunk's logits alive at a time, recomputed in backward; the same loss)"
        )
    if w.teacher_quantize is not None:
        used.append(
            f"the teacher quantized to {w.teacher_quantize} (teacher_quantize="
            f"{w.teacher_quantize!r}: its outputs change slightly)"
        )
    if w.teacher_top_k is not None:
        used.append(
            f"the teacher's top-{w.teacher_top_k} logits computed beforehand and read with the "
            f"batch (teacher_top_k={w.teacher_top_k}: no teacher in the step; one teacher pass "
            "over the data first)"
        )
    return ["  distillation: " + "; ".join(used)] if used else []


def render_plan(plan: Plan) -> str:
    g = plan.goal
    lines = [
        f"plan for {plan.model} on {plan.gpu.display_name} "
        f"({format_bytes(plan.gpu.total_memory_bytes)}): global batch {g.global_batch}"
        + (f" x {g.seq_len} tokens" if g.seq_len else ""),
        "",
    ]
    if plan.best is None:
        lines.append("NOTHING FITS with the allowed techniques.")
        if plan.closest_miss is not None:
            c = plan.closest_miss
            lines.append(
                f"closest: {_describe(c)}: {format_bytes(c.device_total_bytes)} on the device "
                f"({_top_categories(c)})"
            )
        lines.append("what would make it fit:")
        lines += [f"  - {s}" for s in plan.suggestions]
    else:
        b = plan.best
        p = b.estimate.profile
        lines += [
            f"recommended: {_describe(b)}",
            f"  device total {format_bytes(p.device_total_bytes)}, peak allocated "
            f"{format_bytes(p.peak_allocated_bytes)}, "
            f"reserved {format_bytes(p.peak_reserved_bytes)}",
            f"  predicted step {b.cost.seconds:.2f} s, {b.cost.tokens_per_second:,.0f} tokens/s "
            "(estimates: the ranking is the point)",
            f"  at the peak ({p.peak_phase}): {_top_categories(b)}",
        ]
        if plan.widened:
            names = ", ".join(plan.widened)
            lines.append(
                f"  nothing fits without {names}, so the plan uses it: it changes the numerics "
                "(16-bit weights, gradients and optimizer state, no fp32 master copy). Accept "
                f"it with --allow {names}, or refuse it with --forbid {names}."
            )
        lines += _distillation_lines(plan)
        if plan.other_optimizer is not None:
            o = plan.other_optimizer
            lines.append(
                f"  kept {b.workload.optimizer}: {o.workload.optimizer} would predict "
                f"{o.cost.seconds:.2f} s/step ({_describe(o)}), but it changes the training"
            )
        if plan.baseline is not None and not plan.baseline.fits:
            base = plan.baseline
            lines.append(
                f"  without the plan ({_describe(base)}) the device would need "
                f"{format_bytes(base.device_total_bytes)}: {_top_categories(base)}"
            )
        code = apply_code(b, plan.model, plan.gpu.name)
        lines += ["", "to use it:", *("  " + x for x in code.splitlines())]
        lines += ["", "alternatives (Pareto: less memory costs time):"]
        lines.append(f"  {'device total':>14}  {'step s':>8}  configuration")
        for c in plan.pareto:
            lines.append(
                f"  {format_bytes(c.device_total_bytes):>14}  {c.cost.seconds:8.2f}  {_describe(c)}"
            )
    lines.append("")
    searched = f"searched {plan.evaluated} configurations from {plan.traces} traces in "
    if plan.from_cache:
        lines.append(
            f"{searched}{plan.search_seconds or 0:.1f} s; read back from memfit's cache in "
            f"{plan.seconds:.1f} s (--no-cache searches again)"
        )
    else:
        lines.append(f"{searched}{plan.seconds:.1f} s")
    return "\n".join(lines)


def limit_to_json(limit: Limit) -> dict[str, Any]:
    """`largest` with `capped`: when capped, `largest` is a lower bound (the search's cap)."""
    return {
        "model": limit.model,
        "gpu": limit.gpu.name,
        "what": limit.what,
        "precision": limit.workload.precision if limit.workload is not None else None,
        "largest": limit.largest,
        "capped": limit.capped,
        "resolution": limit.resolution,
        "upper": limit.upper,
        "curve": [{"value": v, "device_total_bytes": b, "fits": f} for v, b, f in limit.curve],
        "seconds": round(limit.seconds, 2),
        # A generation's max_seq searches the prompt; the context adds the new tokens.
        "new_tokens": limit.new_tokens if limit.what == "prompt_len" else None,
        "largest_context": (
            limit.largest + limit.new_tokens
            if limit.what == "prompt_len" and limit.largest
            else None
        ),
    }


def _limit_answer(limit: Limit) -> str:
    """The largest value as a reader must take it: exact, a lower bound, or the model's own."""
    if limit.capped:
        return f"at least {limit.largest} (the search cap; more may fit)"
    if limit.what in ("seq_len", "prompt_len") and limit.largest == limit.upper:
        return f"{limit.largest} (every position the model has)"
    if limit.resolution > 1 and limit.largest is not None:
        return (
            f"{limit.largest} (to within {limit.resolution} tokens: "
            f"{limit.largest + limit.resolution} does not fit)"
        )
    return str(limit.largest)


_LIMIT_NAMES = {"batch_size": "micro-batch", "seq_len": "sequence length", "prompt_len": "prompt"}


def render_limit(limit: Limit) -> str:
    name = _LIMIT_NAMES[limit.what]
    on = limit.gpu.display_name
    if limit.workload is not None:  # the precision searched ("auto" resolved)
        on += f" in {limit.workload.precision}"
    head = (
        f"largest {name} of {limit.model} that fits {on}: {_limit_answer(limit)}"
        if limit.largest
        else f"no {name} of {limit.model} fits {on}"
    )
    if limit.smallest_peak is not None:
        value, peak = limit.smallest_peak
        head += (
            f"; even at {value} the peak is in {peak}: what does not depend on the "
            f"{name} does not fit (memfit plan searches the techniques that shrink it)"
        )
    if limit.what != "prompt_len":
        lines = [head, "", f"  {name:>16}  {'device total':>14}  fits"]
        for v, b, f in limit.curve:
            lines.append(f"  {v:>16}  {format_bytes(b):>14}  {'yes' if f else 'no'}")
        return "\n".join(lines + _curve_notes(limit))
    n = limit.new_tokens
    if limit.largest:
        head += (
            f" tokens, with {n} new tokens: a context of {limit.largest + n} tokens "
            "(prompt + new tokens)"
        )
    lines = [head, "", f"  {'prompt':>10}  {'context':>10}  {'device total':>14}  fits"]
    for v, b, f in limit.curve:
        lines.append(f"  {v:>10}  {v + n:>10}  {format_bytes(b):>14}  {'yes' if f else 'no'}")
    return "\n".join(lines + _curve_notes(limit))


def _curve_notes(limit: Limit) -> list[str]:
    """Why a device total can drop as the value grows: it counts the allocator's reserved
    segments, which pack the same requests differently at each size (a longer sequence can
    leave less cached in the segments it splits)."""
    totals = [b for _, b, _ in limit.curve]
    if all(a <= b for a, b in itertools.pairwise(totals)):
        return []
    return [
        "",
        "note: the device total is not monotone here: it counts the caching allocator's "
        "reserved segments, which the same kinds of requests fill differently at each size "
        "(rounding to 512 B and 2 MiB, block splitting), so a larger value can leave less "
        "cached; each row is the estimate at that value.",
    ]


def serving_to_json(cap: Any) -> dict[str, Any]:
    """`memfit serve --json`: every figure of a `ServingCapacity`, bytes as integers."""
    from dataclasses import asdict

    doc = {k: v for k, v in asdict(cap).items() if k not in ("gpu", "seconds")}
    return {"gpu": cap.gpu.name, **doc, "seconds": round(cap.seconds, 2)}


def render_serving(cap: Any) -> str:
    """A `ServingCapacity` as the figures vLLM's start-up log would give, and how they come."""
    g = cap.gpu
    quant = f", {cap.quantize}" if cap.quantize else ""
    fits = cap.concurrent_sequences >= 1
    lines = [
        f"serving {cap.model} on {g.display_name} ({format_bytes(g.total_memory_bytes)}), as "
        f"vLLM sizes its KV cache: {cap.precision}{quant}, gpu_memory_utilization "
        f"{cap.gpu_memory_utilization}, block size {cap.block_size}",
        "",
        f"  {'engine memory':<26}{format_bytes(cap.requested_bytes):>12}   "
        f"(total x {cap.gpu_memory_utilization})",
        f"  {'weights':<26}{format_bytes(cap.weights_bytes):>12}",
        f"  {'profiling run peak':<26}{format_bytes(cap.profile_peak_bytes):>12}   "
        f"(weights included; {cap.max_num_batched_tokens} tokens as {cap.profile_batch} "
        f"requests of {cap.profile_prompt_len})",
        f"  {'KV cache':<26}{format_bytes(max(cap.available_kv_bytes, 0)):>12}   "
        "(engine memory - profiling run peak)",
        f"  {'KV block':<26}{format_bytes(cap.block_bytes):>12}   ({cap.block_size} tokens x "
        f"{format_bytes(cap.kv_bytes_per_token)} per token, {cap.num_layers} layers)",
        "",
        f"  KV blocks                 {cap.num_blocks:>12,}",
        f"  KV tokens                 {cap.kv_tokens:>12,}   (vLLM: GPU KV cache size)",
        f"  sequences of {cap.context_len} tokens at once: {cap.concurrent_sequences:,} "
        f"(vLLM: maximum concurrency {cap.max_concurrency:.2f}x)",
        f"  longest sequence that fits: {cap.max_model_len:,} tokens"
        + (f" (the model has {cap.model_positions:,})" if cap.model_positions else ""),
    ]
    if not fits and cap.num_blocks < 1:
        short = cap.profile_peak_bytes - cap.requested_bytes + cap.block_bytes
        what = "the weights alone" if cap.weights_bytes > cap.requested_bytes else (
            "the weights and the profiling run")  # fmt: skip
        lines += [
            "",
            f"DOES NOT FIT: {what} leave no room for one KV block in the engine memory "
            f"({format_bytes(cap.requested_bytes)}; {format_bytes(short)} short of one block); "
            "vLLM would refuse to start at any context length. Use --quantize, a higher "
            "--gpu-memory-utilization, a card with more memory, or tensor parallelism.",
        ]
    elif not fits:
        lines += [
            "",
            f"DOES NOT FIT: one sequence of {cap.context_len} tokens needs "
            f"{cap.blocks_per_sequence:,} blocks; vLLM would refuse to start with max_model_len "
            f"{cap.context_len}. Use --context-len {cap.max_model_len} or less, a higher "
            "--gpu-memory-utilization, or --quantize.",
        ]
    lines += [
        "",
        "Not counted: CUDA graphs (captured after the KV cache, outside the engine memory), "
        "vLLM's own kernels and sampler buffers.",
    ]
    return "\n".join(lines)
