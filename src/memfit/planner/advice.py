"""What would make a plan fit when nothing does: a bigger GPU, a shorter sequence, more GPUs,
or the opt-in techniques the user has not decided on yet.
"""

from __future__ import annotations

from typing import Any

from memfit.cuda.target import list_gpus
from memfit.models.sources import ModelSpec
from memfit.units import format_bytes


def _device_fits(miss: Any, gpu: Any) -> bool:
    """Whether the candidate's device figures alone fit (the estimate's margin)."""
    limit = gpu.fit_limit
    return miss.estimate.oom is None and miss.device_total_bytes <= limit


def what_would_fit(
    spec: ModelSpec,
    seq_len: int | None,
    gpu: Any,
    miss: Any,
    decided: set[str],
    n_gpus: int,
) -> list[str]:
    """What would make it fit; `decided`: the techniques allowed or forbidden already."""
    out = []
    host = miss.estimate.host if miss is not None else None
    if host is not None and host.fits is False and _device_fits(miss, gpu):
        # The device is not the limit: the CPU's RAM is.
        where = "--host-memory" if host.budget_source == "host_memory" else "this machine's RAM"
        out.append(
            f"More host RAM: the closest configuration fits the device "
            f"({format_bytes(miss.device_total_bytes)}) but keeps "
            f"{format_bytes(host.peak_bytes)} on the CPU ({format_bytes(host.pinned_bytes)} "
            f"pinned), more than {where} ({format_bytes(host.budget_bytes or 0)}). If the "
            "machine that trains has more, give it with --host-memory SIZE."
        )
    elif miss is not None:
        need = miss.device_total_bytes
        needs_bf16 = miss.workload.recipe.bf16
        bigger = sorted(
            (
                g
                for g in list_gpus()
                if g.total_memory_bytes * 0.95 >= need
                and (g.bf16 or not needs_bf16)
                and not g.rocm  # memfit cannot estimate for it yet (cuda/overhead.py)
            ),
            key=lambda g: g.total_memory_bytes,
        )
        if bigger:
            out.append(
                f"A GPU with at least {format_bytes(need)}: e.g. {bigger[0].name} "
                f"({format_bytes(bigger[0].total_memory_bytes)})."
            )
        out.append(
            f"The closest configuration needs {format_bytes(need)} on the device; "
            f"{gpu.name} has {format_bytes(gpu.total_memory_bytes)}."
        )
    gpus = f" --gpus {n_gpus}" if n_gpus > 1 else ""
    if seq_len and seq_len > 128:
        out.append(f"A shorter sequence (`memfit max-seq {spec.name} --gpu {gpu.name}{gpus}`).")
    out.append(
        f"More GPUs (`--gpus {2 * n_gpus}`): FSDP2 shards parameters, gradients and optimizer "
        "state over them."
    )
    names = ["pure-precision", "lora", "qlora"]
    if miss is not None and miss.workload.teacher is not None:
        names += ["quantized-teacher", "offline-logits"]  # the distillation's opt-in savers
    opt_in = [f"--allow {name}" for name in names if name not in decided]
    if opt_in:
        out.append(
            "Techniques that change the training, if you accept that: " + ", ".join(opt_in) + "."
        )
    return out
