"""The work of a step for the cost model (`memfit.planner.cost.StepWork`), read from an
estimate: FLOPs by phase, the bytes of the optimizer update, and the bytes that cross PCIe or
HBM because of a technique (optimizer or activation offload, a paged optimizer's evictions,
FSDP2's CPU offload, dequantized weights, a distillation teacher's quantized weights or offline
logits).

A distillation teacher's forward is in the trace's forward FLOPs (it runs under no_grad in the
forward phase; with "chunked-kl" its output head runs again in each chunk's recomputation); an
offline top-k distillation has no teacher forward at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from memfit.estimator import Estimate
from memfit.models.sources import resolve_model
from memfit.optimizers import is_paged
from memfit.planner.cost import StepWork
from memfit.techniques.distillation.config import DTYPES, config_from_workload
from memfit.techniques.quantize.config import QuantizeConfig, targets


def work_of(est: Estimate) -> StepWork:
    """The step's work for the cost model, from an estimate (per GPU)."""
    w = est.workload
    flops = est.flops
    rec = est.records_summary
    tokens = w.batch_size * (w.seq_len or 1)
    # The update runs on the CPU (optimizer offload, FSDP2's CPU offload) when state is there.
    cpu_update = w.optimizer_on_cpu and rec["host_optimizer_state"] > 0
    extra_flops, teacher_terms = teacher_work(est)
    terms = lean_work(est)
    for name, value in teacher_terms.items():
        terms[name] = terms.get(name, 0) + value
    return StepWork(
        forward_flops=flops.get("forward", 0) + extra_flops,
        backward_flops=flops.get("backward", 0) + flops.get("recompute", 0),
        recompute_flops=flops.get("recompute", 0),
        optimizer_flops=flops.get("optimizer", 0),
        micro_batches=w.grad_accum,
        tokens_per_micro_batch=tokens,
        compute_dtype=w.compute_dtype_name,
        # The update reads and writes the trainable parameters, as large as their gradients
        # (frozen weights, e.g. under LoRA, are not touched).
        parameter_bytes=rec["gradients"],
        gradient_bytes=rec["gradients"],
        optimizer_state_bytes=rec["optimizer_state"],
        offloaded_optimizer_bytes=rec["host_optimizer_state"] if cpu_update else 0,
        offloaded_parameter_count=est.trainable_parameter_count if cpu_update else 0,
        cpu_embedding_bytes_per_step=2 * rec["embedding_output"] * w.grad_accum
        if w.embedding_on_cpu
        else 0,
        n_gpus=w.gpus,
        sharded_bytes_per_step=_collective_bytes(w, rec),
        **terms,
    )


def _collective_bytes(w: Any, rec: dict[str, int]) -> int:
    """Bytes each GPU moves in the step's collectives. FSDP2 all-gathers each shard in every
    micro-batch's forward and backward and reduce-scatters the gradients once: each GPU
    receives (N - 1) shards each time. DDP all-reduces its buckets once a step (no_sync on
    the other micro-batches); a ring all-reduce sends and receives 2 (N - 1) / N of them."""
    if w.fsdp:
        return (2 * w.grad_accum + 1) * rec["parameters"] * (w.gpus - 1)
    if w.ddp:
        return 2 * (w.gpus - 1) * rec.get("ddp_buckets", 0) // w.gpus
    return 0


def lean_work(est: Estimate) -> dict[str, int]:
    """The cost-model terms of the lean techniques (memfit.planner.cost.StepWork)."""
    w = est.workload
    rec = est.records_summary
    out: dict[str, int] = {}
    if w.offload_activations:
        out["activation_offload_bytes_per_step"] = 2 * rec["offloaded_activations"] * w.grad_accum
    if is_paged(w.optimizer) and est.gpu is not None:
        # Pages stay resident while the device has room beside everything else.
        room = est.gpu.fit_limit
        room -= est.profile.device_total_bytes or 0
        state = rec["paged_optimizer_state"]
        out["paged_bytes_per_step"] = 2 * max(0, state - max(room, 0))
    if w.fsdp_cpu_offload:
        # The shards' bytes, not their pinned blocks (what crosses PCIe).
        host = rec["host_parameters"]
        out["fsdp_offload_bytes_per_step"] = max(0, 2 * w.grad_accum - 1) * host
    if w.quantize is not None:
        passes = 2 + (w.checkpointing != "off")
        sixteen_bit = 2 * est.parameter_count
        out["dequantized_bytes_per_step"] = (
            passes * w.grad_accum * (rec["parameters"] + 2 * sixteen_bit)
            if w.training
            else rec["parameters"] + 2 * sixteen_bit
        )
    return out


#: Bytes a position of offline distillation brings with the batch: K float32 logits and K int64
#: token ids (memfit.techniques.distillation.trace.DistillationTrace.add_inputs).
OFFLINE_LOGIT_BYTES = 4 + 8
#: HBM bytes LLM.int8 moves per token and feature of each int8 matmul, beyond its weights
#: (memfit.techniques.quantize.trace._Bnb8bitMatmul, as bitsandbytes runs it on CUDA): per input
#: feature the 16-bit activation read and its int8 row written (2 + 1); per output feature the
#: int32 product written and read, and its fp16 dequantized output written (4 + 4 + 2).
INT8_BYTES_PER_INPUT_FEATURE = 3
INT8_BYTES_PER_OUTPUT_FEATURE = 10


def teacher_work(est: Estimate) -> tuple[int, dict[str, int]]:
    """(forward FLOPs the trace does not count, cost-model terms) of a distillation teacher.

    - Offline top-k logits: PCIe bytes of the logits and ids each micro-batch brings.
    - An NF4 / FP4 teacher: each forward reads the packed weights and writes, then reads, a
      16-bit copy (dequantized bytes), once per micro-batch (no backward, no recomputation:
      the output head, which recomputes with "chunked-kl", is not quantized).
    - An LLM.int8 teacher: its int8 matmuls (2 x tokens x weights each micro-batch, which the
      trace's stand-in allocates without computing, so they are added here, priced at the
      compute dtype's rate: bitsandbytes' int8 path does not run faster than 16-bit matmuls on
      the GPUs memfit plans for) and the HBM bytes of quantizing activations and dequantizing
      outputs, with the int8 weights read once.
    """
    w = est.workload
    if w.teacher is None:
        return 0, {}
    tokens = w.batch_size * (w.seq_len or 1)
    if w.teacher_top_k is not None:
        per_micro = tokens * w.teacher_top_k * OFFLINE_LOGIT_BYTES
        return 0, {"offline_logits_bytes_per_step": w.grad_accum * per_micro}
    if w.teacher_quantize is None:
        return 0, {}
    config = config_from_workload(w)
    assert config is not None
    dtype = DTYPES[config.precision]  # the teacher is cast to it, then quantized
    linears = quantized_linears(w.teacher, w.teacher_quantize, dtype, w.attention)
    elements, ins, outs = linears.elements, linears.in_features, linears.out_features
    if w.teacher_quantize == "int8":
        moved = elements + tokens * (
            INT8_BYTES_PER_INPUT_FEATURE * ins + INT8_BYTES_PER_OUTPUT_FEATURE * outs
        )
        return w.grad_accum * 2 * tokens * elements, {
            "dequantized_bytes_per_step": w.grad_accum * moved
        }
    return 0, {"dequantized_bytes_per_step": w.grad_accum * (linears.packed + 2 * 2 * elements)}


@dataclass(frozen=True)
class QuantizedLinears:
    """The linear layers of a teacher that a method quantizes, summed: weight elements, input
    and output features, and the bytes of the library's storages of those weights (packed
    data and scales, memfit.techniques.quantize.layouts)."""

    elements: int
    in_features: int
    out_features: int
    packed: int


_LINEARS: dict[Any, QuantizedLinears] = {}


def quantized_linears(
    teacher: str, method: str, dtype: torch.dtype, attention: str = "sdpa"
) -> QuantizedLinears:
    """The linear layers of `teacher`, its weights in `dtype`, that `method` quantizes
    (memfit.techniques.quantize.config.targets, as the trace and `apply_` choose them), from the
    teacher built on the meta device. Kept per teacher config (`ModelSpec.cache_key`) for the
    plan's many candidates."""
    spec = resolve_model(teacher)
    key = (spec.cache_key, method, dtype) if spec.cache_key is not None else None
    if key is not None and key in _LINEARS:
        return _LINEARS[key]
    if spec.owns_model:
        with torch.device("meta"):
            model = spec.build(None, attention)
    else:
        model = spec.build(None, attention)
    config = QuantizeConfig(method=method)
    names, _ = targets(model, config)
    elements = ins = outs = packed = 0
    for name in names:
        module = model.get_submodule(name)
        weight = module.weight
        assert isinstance(weight, torch.Tensor)
        rows, cols = (int(d) for d in weight.shape)
        # GPT-2's Conv1D keeps its weight as (in, out), nn.Linear as (out, in).
        out_f, in_f = (cols, rows) if type(module).__name__ == "Conv1D" else (rows, cols)
        elements, ins, outs = elements + out_f * in_f, ins + in_f, outs + out_f
        packed += sum(s.nbytes for s in config.storages(out_f, in_f, dtype))
    found = QuantizedLinears(elements, ins, outs, packed)
    if key is not None:
        _LINEARS[key] = found
    return found
