"""Step-time cost model: about how long one optimizer step takes on a given GPU.

This is a pure function of numbers. It does no tracing and needs no GPU. The tracer measures what
one step does (a `StepWork`: FLOPs, bytes, micro-batches, offloaded state). `step_cost` turns that
into seconds on a catalog `GPU` (see `memfit.cuda.gpus`), using rooflines and the named constants
below.

**The absolute times are estimates. What matters is the ranking.** Real step time depends on
kernels, fusion, the input pipeline, driver and PyTorch version, clocks, and much more that
this model does not see. Expect the absolute figures to be off by a factor of up to about 2.
What the model is built to get right is the *order* of configurations of the same model: more
FLOPs cost more, smaller micro-batches use the GPU less well, recomputation and offload cost
time, and faster GPUs are faster. A planner should use it to pick the fastest configuration
that fits, not to promise a wall-clock time.

The model, per GPU and per optimizer step (every term below is in `StepCost`):

* ``compute_seconds``: (forward + backward) FLOPs / (matmul peak for the compute dtype x
  efficiency), plus `MICRO_BATCH_OVERHEAD_S` for each micro-batch. Backward FLOPs include any
  checkpoint recomputation. Efficiency grows with the tokens in a micro-batch:
  ``eff = MAX_MATMUL_EFFICIENCY * t / (t + TOKENS_AT_HALF_EFFICIENCY)``.
* ``optimizer_seconds``: the GPU update as a roofline, ``max(optimizer FLOPs / fp32 vector peak,
  memory_seconds)``, plus the CPU update time when the optimizer is offloaded. Optimizer FLOPs
  are element-wise (no tensor cores and no matmul efficiency), so they go here and not into
  compute.
* ``memory_seconds``: the bytes the GPU update reads and writes / HBM bandwidth. This is part of
  ``optimizer_seconds``, **not added again**. It is reported so a caller can see that the
  update is bandwidth-bound, which it nearly always is.
* ``transfer_seconds``: PCIe traffic. With CPU offload, gradients go down and updated parameters
  come up every step. An embedding kept on the CPU also sends its activations and gradients
  across; offloaded activations go down in forward and come back in backward; a paged
  optimizer's evicted pages come and go; FSDP2's CPU offload copies the parameters up for
  every all-gather; an offline distillation's top-k teacher logits come with each batch.
  (Dequantizing quantized weights is HBM traffic, added to compute.)
  Neither this nor the CPU update is assumed to overlap with GPU compute. That is
  conservative: DeepSpeed overlaps part of it.
* ``communication_seconds``: the *exposed* part of the sharding collectives (FSDP / ZeRO all-gather
  and reduce-scatter). They run over NVLink on SXM boards and over PCIe otherwise. A fraction
  `COMMUNICATION_OVERLAP` is hidden behind compute, and never more than ``compute_seconds``.

``seconds = compute_seconds + optimizer_seconds + transfer_seconds + communication_seconds``.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.cuda.gpus import GPU
from memfit.errors import BadInputError

__all__ = [
    "COMMUNICATION_OVERLAP",
    "CPU_MEMORY_BANDWIDTH_BYTES_PER_S",
    "MAX_MATMUL_EFFICIENCY",
    "MICRO_BATCH_OVERHEAD_S",
    "NVLINK_BYTES_PER_S",
    "NVLINK_EFFICIENCY",
    "PCIE_EFFICIENCY",
    "TOKENS_AT_HALF_EFFICIENCY",
    "StepCost",
    "StepWork",
    "matmul_efficiency",
    "matmul_peak_flops",
    "step_cost",
]

# --------------------------------------------------------------------------------- constants

#: The fraction of the tensor-core peak that large-batch training reaches, counting the FLOPs
#: actually run (recomputation included, i.e. "hardware FLOPs utilisation").
#: Published figures: PaLM (Chowdhery et al. 2022, Table 3 and App. B) gives 46.2 % MFU and
#: 57.8 % HFU on TPU v4, and 21.3 % MFU for GPT-3 and 30.2 % for Megatron-Turing NLG on GPUs.
#: Megatron-LM (Narayanan et al. 2021) gives 52 % of peak (163 of 312 TFLOP/s per A100) for a
#: 1T-parameter GPT. The Megatron-LM README (after Korthikanti et al. 2022, "Reducing Activation
#: Recomputation") gives 56.3 % MFU and 57.0 % HFU at 1T.
#: Those are hand-tuned multi-GPU runs with fused kernels. A plain PyTorch eager loop with
#: LayerNorm, softmax, GELU and dropout as separate memory-bound kernels does worse, so 0.5 is an
#: upper value that only large micro-batches approach.
MAX_MATMUL_EFFICIENCY = 0.5

#: Tokens per micro-batch at which efficiency is half of `MAX_MATMUL_EFFICIENCY`.
#: A weight GEMM (tokens x d) @ (d x d) has an arithmetic intensity of about ``tokens`` FLOP per
#: byte in 16-bit when tokens << d. It becomes compute-bound once tokens pass the GPU's ridge
#: point (peak / HBM bandwidth): about 150 FLOP/B for an A100 in bf16, about 300 for an H100
#: SXM and about 200 for a T4 in fp16. Wave quantisation (too few output tiles to fill 108-132
#: SMs) and the element-wise kernels between GEMMs push the practical half point higher. NVIDIA's
#: "Matrix Multiplication Background" guide shows GEMM throughput still climbing at M = 1-2k.
#: So 512 sits between one and two ridge points. Images pass images per micro-batch as
#: "tokens", which puts a CNN low on this curve. That makes its absolute time pessimistic, but it
#: ranks batch sizes of the same model the same way.
TOKENS_AT_HALF_EFFICIENCY = 512

#: Host-side cost per micro-batch (forward + backward), added on top of GPU time.
#: PyTorch eager spends a few microseconds of CPU time per operator (dispatcher, autograd,
#: cudaLaunchKernel, about 5-10 us). Horace He's "Making Deep Learning Go Brrrr From First
#: Principles" covers this overhead regime. A transformer micro-batch launches several hundred
#: to a few thousand kernels: a 12-layer GPT-2 has about 50 in the forward and twice that in the
#: backward per layer, so roughly 2k. Some of this hides behind long kernels, so a flat 3 ms is
#: used. It matters only for small models or tiny micro-batches, which is exactly where it is
#: real.
MICRO_BATCH_OVERHEAD_S = 3e-3

#: The achieved fraction of the PCIe link rate (`GPU.pcie_bandwidth_bytes_per_s`, one
#: direction, after 128b/130b encoding) for large pinned-memory copies. CUDA's bandwidthTest
#: sample typically measures about 12-13 GB/s on Gen3 x16 (15.75) and about 24-26 GB/s on
#: Gen4 x16 (31.5), roughly 0.8 of the link, because of TLP/DLLP protocol overhead.
#: Pageable copies reach about half that.
PCIE_EFFICIENCY = 0.8

#: DRAM bandwidth a CPU optimizer step gets. It is memory-bound: DeepSpeedCPUAdam or
#: torch.optim on CPU reads fp32 param, grad, exp_avg and exp_avg_sq and writes three of them
#: back, at about 1-1.5 FLOP per byte.
#: A server socket has 8-12 DDR4/DDR5 channels (200-460 GB/s theoretical, STREAM about 60-70 % of
#: that). One training process shares the socket with data loading, pinned-memory copies and
#: the other ranks on the node, and threaded Adam seldom saturates every channel. Typical
#: effective rates are 20-50 GB/s per process; 30 GB/s is used.
#: The ZeRO-Offload paper (Ren et al. 2021) reports DeepSpeedCPUAdam 5-7x faster than PyTorch's
#: CPU Adam, which this constant assumes is in use.
CPU_MEMORY_BANDWIDTH_BYTES_PER_S = 30 * 10**9

#: NVLink bandwidth per GPU, one direction, by architecture. NVIDIA quotes the bidirectional
#: total: V100 SXM2 300 GB/s, A100 SXM4 600 GB/s, H100/H200 SXM5 900 GB/s. The one-direction
#: figure is half of that.
NVLINK_BYTES_PER_S: dict[str, int] = {
    "volta": 150 * 10**9,
    "ampere": 300 * 10**9,
    "hopper": 450 * 10**9,
}
#: Architectures missing from the table (a future SXM part) get the Ampere figure.
NVLINK_DEFAULT_BYTES_PER_S = 300 * 10**9

#: The fraction of the NVLink rate NCCL collectives reach ("bus bandwidth" in nccl-tests).
#: Large all-gather and reduce-scatter on an 8-GPU NVSwitch board typically reach about
#: 75-85 % of the one-direction link rate.
NVLINK_EFFICIENCY = 0.8

#: The fraction of sharding communication hidden behind compute. FSDP prefetches the next
#: layer's all-gather during this layer's compute (forward_prefetch / backward_prefetch) and
#: reduce-scatters each layer's gradients while earlier layers run their backward. The first
#: all-gather, the last reduce-scatter and stream contention stay exposed. The PyTorch FSDP
#: paper (Zhao et al. 2023) shows overlap that is good but not complete. 0.5 is a middle
#: assumption, not a measurement.
COMMUNICATION_OVERLAP = 0.5

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
COMPUTE_DTYPES = tuple(_DTYPE_BYTES)


# ------------------------------------------------------------------------------ dataclasses


@dataclass(frozen=True, kw_only=True)
class StepWork:
    """What one optimizer step does on one GPU, as measured by the tracer.

    FLOPs and bytes are per GPU and per whole optimizer step (all micro-batches together).

    Attributes:
        forward_flops: forward FLOPs of all micro-batches.
        backward_flops: backward FLOPs, including checkpoint recomputation.
        recompute_flops: the part of ``backward_flops`` that is recomputed forward (reported in
            the notes; already counted in ``backward_flops``).
        optimizer_flops: FLOPs of the optimizer update run **on the GPU** (0 when the whole
            update runs on the CPU). A GPU update is modelled only when this or
            ``optimizer_state_bytes`` is non-zero.
        micro_batches: micro-batches per step (grad_accum).
        tokens_per_micro_batch: batch x seq for text, batch for images.
        compute_dtype: "float32", "float16" or "bfloat16" (the dtype of the matmuls).
        parameter_bytes: device bytes of parameters.
        gradient_bytes: device bytes of gradients.
        optimizer_state_bytes: device bytes of optimizer state.
        offloaded_optimizer_bytes: optimizer state (fp32 master weights included) kept on the
            CPU. Gradients go down and parameters come up over PCIe every step, and the CPU
            runs that part of the update.
        offloaded_parameter_count: parameters whose update runs on the CPU. Each sends one
            gradient down and receives one parameter back, both in the compute dtype, as
            ZeRO-Offload does.
        cpu_embedding_bytes_per_step: activations and gradients that cross PCIe each step for
            an embedding kept on the CPU.
        n_gpus: data-parallel GPUs (only scales ``tokens_per_second``).
        sharded_bytes_per_step: bytes each GPU all-gathers and reduce-scatters per step
            (FSDP / ZeRO). 0 without sharding. A DDP gradient all-reduce can be given here as
            about 2 x gradient bytes.
        activation_offload_bytes_per_step: saved activations copied to pinned host memory in
            forward and back in backward (both directions counted), all micro-batches.
        paged_bytes_per_step: unified-memory pages of a paged optimizer's state that do not
            stay resident on the device: evicted during forward/backward and brought back
            for the update (both directions counted).
        fsdp_offload_bytes_per_step: FSDP2 CPU offload's copies beyond one gradient down and
            one parameter up (which `offloaded_parameter_count` prices): the parameter shards
            copied to the device for every other forward and backward all-gather.
        dequantized_bytes_per_step: HBM bytes of dequantizing quantized weights: each matmul
            reads the packed weight and writes, then reads, a 16-bit copy, in every forward,
            backward and recomputation (a distillation teacher's: forward only; an LLM.int8
            teacher's: its activations quantized and its int32 outputs dequantized).
        offline_logits_bytes_per_step: an offline distillation's precomputed top-k teacher
            logits and token ids, copied to the device with each micro-batch.
    """

    forward_flops: int
    backward_flops: int
    recompute_flops: int
    optimizer_flops: int
    micro_batches: int
    tokens_per_micro_batch: int
    compute_dtype: str
    parameter_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    offloaded_optimizer_bytes: int = 0
    offloaded_parameter_count: int = 0
    cpu_embedding_bytes_per_step: int = 0
    n_gpus: int = 1
    sharded_bytes_per_step: int = 0
    activation_offload_bytes_per_step: int = 0
    paged_bytes_per_step: int = 0
    fsdp_offload_bytes_per_step: int = 0
    dequantized_bytes_per_step: int = 0
    offline_logits_bytes_per_step: int = 0

    def __post_init__(self) -> None:
        for name in (
            "forward_flops",
            "backward_flops",
            "recompute_flops",
            "optimizer_flops",
            "parameter_bytes",
            "gradient_bytes",
            "optimizer_state_bytes",
            "offloaded_optimizer_bytes",
            "offloaded_parameter_count",
            "cpu_embedding_bytes_per_step",
            "sharded_bytes_per_step",
            "activation_offload_bytes_per_step",
            "paged_bytes_per_step",
            "fsdp_offload_bytes_per_step",
            "dequantized_bytes_per_step",
            "offline_logits_bytes_per_step",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise BadInputError(
                    f"StepWork.{name} must be a non-negative integer, got {value!r}."
                )
        for name in ("micro_batches", "tokens_per_micro_batch", "n_gpus"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BadInputError(f"StepWork.{name} must be a positive integer, got {value!r}.")
        if self.compute_dtype not in _DTYPE_BYTES:
            raise BadInputError(
                f"StepWork.compute_dtype {self.compute_dtype!r} is not one of "
                f"{', '.join(COMPUTE_DTYPES)}."
            )
        if self.recompute_flops > self.backward_flops:
            raise BadInputError(
                f"StepWork.recompute_flops ({self.recompute_flops}) is part of backward_flops "
                f"({self.backward_flops}) and cannot exceed it."
            )
        if self.offloaded_optimizer_bytes > 0 and self.offloaded_parameter_count == 0:
            raise BadInputError(
                f"StepWork.offloaded_optimizer_bytes is {self.offloaded_optimizer_bytes} but "
                "offloaded_parameter_count is 0; give the number of parameters updated on the CPU."
            )


@dataclass(frozen=True, kw_only=True)
class StepCost:
    """Estimated time of one optimizer step on one GPU. Compare these; don't promise them.

    ``seconds = compute_seconds + optimizer_seconds + transfer_seconds + communication_seconds``.
    ``memory_seconds`` is the byte-time of the GPU optimizer update. It is already inside
    ``optimizer_seconds`` (the roofline max), shown so a caller can see what bounds the update.
    ``communication_seconds`` is the exposed (not overlapped) part of the sharding collectives.
    """

    seconds: float
    compute_seconds: float
    memory_seconds: float
    optimizer_seconds: float
    transfer_seconds: float
    communication_seconds: float
    efficiency: float  # the assumed fraction of peak FLOP/s for the matmul work
    tokens_per_second: float
    notes: tuple[str, ...]


# ------------------------------------------------------------------------------- the model


def matmul_efficiency(tokens_per_micro_batch: int) -> float:
    """The assumed fraction of the matmul peak reached by a micro-batch of this many tokens."""
    t = max(int(tokens_per_micro_batch), 0)
    return MAX_MATMUL_EFFICIENCY * t / (t + TOKENS_AT_HALF_EFFICIENCY)


def matmul_peak_flops(gpu: GPU, compute_dtype: str, *, tf32: bool = True) -> tuple[int, str]:
    """The peak FLOP/s a GPU offers matmuls in ``compute_dtype``, and the name of that rate.

    16-bit dtypes use the tensor-core rate. bfloat16 on a card without native bf16 (before
    sm80) falls back to the fp32 rate. float32 uses TF32 tensor cores when ``tf32`` is set and
    the card has them, and the fp32 CUDA-core rate otherwise.
    """
    if compute_dtype == "bfloat16":
        if gpu.peak_bf16_flops > 0:
            return gpu.peak_bf16_flops, "bf16 tensor-core"
        return gpu.peak_fp32_flops, "fp32 (no native bf16)"
    if compute_dtype == "float16":
        if gpu.peak_fp16_flops > 0:
            return gpu.peak_fp16_flops, "fp16 tensor-core"
        return gpu.peak_fp32_flops, "fp32 (no fp16 tensor cores)"
    if compute_dtype == "float32":
        if tf32 and gpu.peak_tf32_flops > 0:
            return gpu.peak_tf32_flops, "TF32 tensor-core"
        return gpu.peak_fp32_flops, "fp32"
    raise BadInputError(
        f"compute_dtype {compute_dtype!r} is not one of {', '.join(COMPUTE_DTYPES)}."
    )


def _tflops(flops: float) -> str:
    return f"{flops / 1e12:.1f} TFLOP/s"


def step_cost(work: StepWork, gpu: GPU, *, tf32: bool = True) -> StepCost:
    """Estimate one optimizer step of ``work`` on ``gpu``. Use it to rank configurations.

    ``tf32``: whether float32 matmuls run on TF32 tensor cores. That needs
    ``torch.backends.cuda.matmul.allow_tf32 = True`` or
    ``torch.set_float32_matmul_precision("high")``. PyTorch's default since 1.12 is "highest",
    i.e. the plain fp32 rate, so pass ``tf32=False`` to model an untouched fp32 script.
    """
    notes: list[str] = []
    compute_seconds, efficiency = _compute(work, gpu, tf32, notes)
    memory_seconds, optimizer_seconds = _optimizer_update(work, gpu, notes)
    transfer_seconds, cpu_seconds = _host_traffic(work, gpu, notes)
    optimizer_seconds += cpu_seconds
    communication_seconds = _communication(work, gpu, compute_seconds, notes)
    seconds = compute_seconds + optimizer_seconds + transfer_seconds + communication_seconds
    tokens = work.micro_batches * work.tokens_per_micro_batch * work.n_gpus
    notes.append("absolute times are estimates; use them to rank configurations")
    return StepCost(
        seconds=seconds,
        compute_seconds=compute_seconds,
        memory_seconds=memory_seconds,
        optimizer_seconds=optimizer_seconds,
        transfer_seconds=transfer_seconds,
        communication_seconds=communication_seconds,
        efficiency=efficiency,
        tokens_per_second=tokens / seconds,
        notes=tuple(notes),
    )


def _compute(work: StepWork, gpu: GPU, tf32: bool, notes: list[str]) -> tuple[float, float]:
    """Forward + backward matmul work at a batch-size-dependent fraction of peak, plus the
    launch overhead of each micro-batch: (seconds, efficiency)."""
    peak, rate_name = matmul_peak_flops(gpu, work.compute_dtype, tf32=tf32)
    efficiency = matmul_efficiency(work.tokens_per_micro_batch)
    matmul_flops = work.forward_flops + work.backward_flops
    compute_seconds = matmul_flops / (peak * efficiency) + (
        work.micro_batches * MICRO_BATCH_OVERHEAD_S
    )
    notes.append(
        f"matmuls at {efficiency:.0%} of the {rate_name} peak ({_tflops(peak)}) for "
        f"{work.tokens_per_micro_batch} tokens per micro-batch, plus "
        f"{MICRO_BATCH_OVERHEAD_S * 1e3:g} ms launch overhead per micro-batch"
    )
    if work.compute_dtype == "float32" and rate_name.startswith("TF32"):
        notes.append(
            "float32 matmuls modelled on TF32 tensor cores; PyTorch does that only with "
            "torch.set_float32_matmul_precision('high') (default 'highest' is "
            f"{_tflops(gpu.peak_fp32_flops)})"
        )
    if "no native bf16" in rate_name:
        notes.append(f"{gpu.name} has no native bf16: bfloat16 matmuls run at the fp32 rate")
    if efficiency < 0.8 * MAX_MATMUL_EFFICIENCY:
        notes.append(
            f"small micro-batch: {work.tokens_per_micro_batch} tokens reach "
            f"{efficiency / MAX_MATMUL_EFFICIENCY:.0%} of large-batch efficiency"
        )
    if work.dequantized_bytes_per_step:
        dequant_seconds = work.dequantized_bytes_per_step / gpu.memory_bandwidth_bytes_per_s
        compute_seconds += dequant_seconds
        notes.append(f"dequantizing weights: {dequant_seconds * 1e3:.1f} ms of HBM traffic")
    if work.recompute_flops:
        notes.append(
            f"checkpoint recomputation adds {work.recompute_flops / 1e12:.2f} TFLOP "
            f"({work.recompute_flops / max(matmul_flops, 1):.0%} of forward + backward)"
        )
    return compute_seconds, efficiency


def _optimizer_update(work: StepWork, gpu: GPU, notes: list[str]) -> tuple[float, float]:
    """The GPU optimizer update as a roofline of element-wise FLOPs against bytes read and
    written (param, grad and state read; param and state written): (memory s, update s)."""
    if work.optimizer_flops <= 0 and work.optimizer_state_bytes <= 0:
        return 0.0, 0.0
    update_bytes = 2 * (work.parameter_bytes + work.optimizer_state_bytes) + work.gradient_bytes
    memory_seconds = update_bytes / gpu.memory_bandwidth_bytes_per_s
    flop_seconds = work.optimizer_flops / gpu.peak_fp32_flops
    optimizer_seconds = max(flop_seconds, memory_seconds)
    bound = "memory" if memory_seconds >= flop_seconds else "compute"
    notes.append(f"GPU optimizer update is {bound}-bound ({optimizer_seconds * 1e3:.2f} ms)")
    return memory_seconds, optimizer_seconds


def _host_traffic(work: StepWork, gpu: GPU, notes: list[str]) -> tuple[float, float]:
    """CPU offload (grads down and params up over PCIe, then the update on the CPU, not
    overlapped) and the CPU embedding's transfers: (PCIe s, CPU update s)."""
    pcie = gpu.pcie_bandwidth_bytes_per_s * PCIE_EFFICIENCY
    transfer_seconds = cpu_seconds = 0.0
    if work.offloaded_parameter_count > 0:
        element = _DTYPE_BYTES[work.compute_dtype]
        pcie_bytes = 2 * work.offloaded_parameter_count * element
        offload_pcie_seconds = pcie_bytes / pcie
        cpu_bytes = 2 * work.offloaded_optimizer_bytes + pcie_bytes
        cpu_seconds = cpu_bytes / CPU_MEMORY_BANDWIDTH_BYTES_PER_S
        transfer_seconds += offload_pcie_seconds
        notes.append(
            f"CPU offload: {offload_pcie_seconds * 1e3:.1f} ms over PCIe + "
            f"{cpu_seconds * 1e3:.1f} ms CPU update, not overlapped with GPU compute "
            "(conservative)"
        )
    for nbytes, what in (
        (work.cpu_embedding_bytes_per_step, "CPU embedding"),
        (work.activation_offload_bytes_per_step, "offloaded activations"),
        (work.paged_bytes_per_step, "paged optimizer state that does not stay on the device"),
        (work.fsdp_offload_bytes_per_step, "FSDP2 CPU offload's parameter copies"),
        (work.offline_logits_bytes_per_step, "offline teacher logits with the batch"),
    ):
        if nbytes > 0:
            seconds = nbytes / pcie
            transfer_seconds += seconds
            notes.append(f"{what}: {seconds * 1e3:.1f} ms over PCIe, not overlapped")
    return transfer_seconds, cpu_seconds


def _communication(work: StepWork, gpu: GPU, compute_seconds: float, notes: list[str]) -> float:
    """Sharding collectives over NVLink on SXM boards, else PCIe, partly hidden behind
    compute: the exposed seconds."""
    if work.sharded_bytes_per_step <= 0:
        return 0.0
    if gpu.nvlink:
        nvlink = NVLINK_BYTES_PER_S.get(gpu.architecture, NVLINK_DEFAULT_BYTES_PER_S)
        link = nvlink * NVLINK_EFFICIENCY
        link_name = "NVLink"
    else:
        link = gpu.pcie_bandwidth_bytes_per_s * PCIE_EFFICIENCY
        link_name = "PCIe"
    total = work.sharded_bytes_per_step / link
    hidden = min(COMMUNICATION_OVERLAP * total, compute_seconds)
    exposed = total - hidden
    notes.append(
        f"sharding: {total * 1e3:.1f} ms of collectives over {link_name}, "
        f"{exposed * 1e3:.1f} ms exposed"
    )
    return exposed
