"""The work of a step for the cost model (`memfit.planner.cost.StepWork`), read from an
estimate: FLOPs by phase, the bytes of the optimizer update, and the bytes that cross PCIe or
HBM because of a technique (optimizer or activation offload, a paged optimizer's evictions,
FSDP2's CPU offload, dequantized weights).
"""

from __future__ import annotations

from memfit.estimator.device_memory import FIT_MARGIN_FRACTION
from memfit.estimator.estimate import Estimate
from memfit.planner.cost import StepWork


def work_of(est: Estimate) -> StepWork:
    """The step's work for the cost model, from an estimate (per GPU)."""
    w = est.workload
    flops = est.flops
    rec = est.records_summary
    tokens = w.batch_size * (w.seq_len or 1)
    # The update runs on the CPU (optimizer offload, FSDP2's CPU offload) when state is there.
    cpu_update = w.optimizer_on_cpu and rec["host_optimizer_state"] > 0
    return StepWork(
        forward_flops=flops.get("forward", 0),
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
        # FSDP2 all-gathers each shard in every micro-batch's forward and backward and
        # reduce-scatters the gradients once: each GPU receives (N - 1) shards each time.
        sharded_bytes_per_step=(2 * w.grad_accum + 1) * rec["parameters"] * (w.gpus - 1),
        **lean_work(est),
    )


def lean_work(est: Estimate) -> dict[str, int]:
    """The cost-model terms of the lean techniques (memfit.planner.cost.StepWork)."""
    w = est.workload
    rec = est.records_summary
    out: dict[str, int] = {}
    if w.offload_activations:
        out["activation_offload_bytes_per_step"] = 2 * rec["offloaded_activations"] * w.grad_accum
    if w.optimizer.startswith("paged-") and est.gpu is not None:
        # Pages stay resident while the device has room beside everything else.
        room = int(est.gpu.total_memory_bytes * (1 - FIT_MARGIN_FRACTION))
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
