"""The step-time cost model: hand-computed values and the orderings a planner relies on."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memfit.cuda.target import get_gpu
from memfit.errors import BadInputError
from memfit.planner.cost import (
    COMMUNICATION_OVERLAP,
    CPU_MEMORY_BANDWIDTH_BYTES_PER_S,
    MAX_MATMUL_EFFICIENCY,
    MICRO_BATCH_OVERHEAD_S,
    NVLINK_BYTES_PER_S,
    NVLINK_EFFICIENCY,
    PCIE_EFFICIENCY,
    TOKENS_AT_HALF_EFFICIENCY,
    StepCost,
    StepWork,
    matmul_efficiency,
    matmul_peak_flops,
    step_cost,
)

A100 = get_gpu("a100-80gb")
H100 = get_gpu("h100-sxm")
T4 = get_gpu("t4")

GB = 10**9


def _work(**changes) -> StepWork:
    """A 1B-parameter-ish bf16 step: 4 micro-batches of 2048 tokens, AdamW state on the GPU."""
    base = StepWork(
        forward_flops=2 * 10**15,
        backward_flops=4 * 10**15,
        recompute_flops=0,
        optimizer_flops=12 * 10**9,
        micro_batches=4,
        tokens_per_micro_batch=2048,
        compute_dtype="bfloat16",
        parameter_bytes=4 * GB,
        gradient_bytes=4 * GB,
        optimizer_state_bytes=8 * GB,
    )
    return replace(base, **changes)


def _pure_compute(**changes) -> StepWork:
    """Forward + backward only: no optimizer update, no transfers."""
    return _work(optimizer_flops=0, optimizer_state_bytes=0, **changes)


def _total(cost: StepCost) -> float:
    return (
        cost.compute_seconds
        + cost.optimizer_seconds
        + cost.transfer_seconds
        + cost.communication_seconds
    )


# ------------------------------------------------------------------------ hand-computed values


def test_constants_are_in_their_documented_ranges():
    assert 0.4 <= MAX_MATMUL_EFFICIENCY <= 0.6  # PaLM / Megatron large-batch utilisation
    assert 100 <= TOKENS_AT_HALF_EFFICIENCY <= 1024
    assert 1e-3 <= MICRO_BATCH_OVERHEAD_S <= 1e-2
    assert 0.5 <= PCIE_EFFICIENCY <= 0.9
    assert 20 * GB <= CPU_MEMORY_BANDWIDTH_BYTES_PER_S <= 50 * GB
    assert 0.0 <= COMMUNICATION_OVERLAP <= 1.0


def test_efficiency_curve():
    assert matmul_efficiency(TOKENS_AT_HALF_EFFICIENCY) == pytest.approx(MAX_MATMUL_EFFICIENCY / 2)
    assert matmul_efficiency(2048) == pytest.approx(0.5 * 2048 / (2048 + 512))
    assert matmul_efficiency(10**9) == pytest.approx(MAX_MATMUL_EFFICIENCY, rel=1e-6)
    assert matmul_efficiency(0) == 0.0
    values = [matmul_efficiency(t) for t in (1, 16, 128, 512, 2048, 8192)]
    assert values == sorted(values)


def test_pure_compute_on_a100_by_hand():
    work = _pure_compute()
    cost = step_cost(work, A100)
    # A100 datasheet: 312 TFLOP/s dense bf16.
    assert A100.peak_bf16_flops == 312 * 10**12
    eff = MAX_MATMUL_EFFICIENCY * 2048 / (2048 + TOKENS_AT_HALF_EFFICIENCY)
    expected = (2e15 + 4e15) / (312e12 * eff) + 4 * MICRO_BATCH_OVERHEAD_S
    assert cost.efficiency == pytest.approx(eff, rel=1e-12)
    assert cost.compute_seconds == pytest.approx(expected, rel=1e-12)
    assert cost.seconds == pytest.approx(expected, rel=1e-12)
    # With the chosen constants: eff = 0.4 and 6e15 / (312e12 * 0.4) + 4 * 3 ms = 48.088 s.
    if (MAX_MATMUL_EFFICIENCY, TOKENS_AT_HALF_EFFICIENCY, MICRO_BATCH_OVERHEAD_S) == (
        0.5,
        512,
        3e-3,
    ):
        assert cost.seconds == pytest.approx(6e15 / (312e12 * 0.4) + 0.012, rel=1e-12)
    assert cost.memory_seconds == cost.optimizer_seconds == 0.0
    assert cost.transfer_seconds == cost.communication_seconds == 0.0
    assert cost.tokens_per_second == pytest.approx(4 * 2048 / expected, rel=1e-12)


def test_optimizer_is_a_memory_bound_roofline():
    cost = step_cost(_work(), A100)
    # Read params, grads, state; write params and state.
    update_bytes = 2 * (4 * GB + 8 * GB) + 4 * GB
    assert cost.memory_seconds == pytest.approx(update_bytes / (2039 * GB), rel=1e-12)
    assert cost.optimizer_seconds == pytest.approx(cost.memory_seconds, rel=1e-12)
    assert "memory-bound" in " ".join(cost.notes)
    # An absurd FLOP count flips the roofline to the FLOP side (fp32 vector rate).
    heavy = step_cost(_work(optimizer_flops=10**15), A100)
    assert heavy.optimizer_seconds == pytest.approx(1e15 / A100.peak_fp32_flops, rel=1e-12)
    assert heavy.optimizer_seconds > heavy.memory_seconds
    assert cost.seconds == pytest.approx(_total(cost), rel=1e-12)


def test_no_optimizer_means_no_update():
    cost = step_cost(_work(optimizer_flops=0, optimizer_state_bytes=0), A100)
    assert cost.optimizer_seconds == 0.0 and cost.memory_seconds == 0.0


def test_tokens_per_second_counts_every_gpu():
    one = step_cost(_pure_compute(), A100)
    eight = step_cost(_pure_compute(n_gpus=8), A100)
    assert eight.seconds == pytest.approx(one.seconds)
    assert eight.tokens_per_second == pytest.approx(8 * one.tokens_per_second)


# ------------------------------------------------------------------------------- orderings


def test_fp32_slower_than_bf16_and_tf32_faster_than_plain_fp32():
    bf16 = step_cost(_work(), A100)
    fp32 = step_cost(_work(compute_dtype="float32"), A100)
    plain = step_cost(_work(compute_dtype="float32"), A100, tf32=False)
    assert bf16.seconds < fp32.seconds < plain.seconds
    assert matmul_peak_flops(A100, "float32") == (156 * 10**12, "TF32 tensor-core")
    assert matmul_peak_flops(A100, "float32", tf32=False)[0] == A100.peak_fp32_flops
    assert any("TF32" in n for n in fp32.notes)
    # The T4 has no TF32: float32 runs at the fp32 rate either way.
    assert step_cost(_work(compute_dtype="float32"), T4).seconds == pytest.approx(
        step_cost(_work(compute_dtype="float32"), T4, tf32=False).seconds
    )


def test_bf16_without_native_support_falls_back_to_fp32_rate():
    assert matmul_peak_flops(T4, "bfloat16")[0] == T4.peak_fp32_flops
    bf16 = step_cost(_work(), T4)
    fp16 = step_cost(_work(compute_dtype="float16"), T4)
    assert fp16.seconds < bf16.seconds
    assert any("no native bf16" in n for n in bf16.notes)


def test_small_micro_batches_are_less_efficient_per_token():
    # The same 8192 tokens and FLOPs per step, split into 1, 4 or 32 micro-batches.
    big = step_cost(_pure_compute(micro_batches=1, tokens_per_micro_batch=8192), A100)
    mid = step_cost(_pure_compute(micro_batches=4, tokens_per_micro_batch=2048), A100)
    small = step_cost(_pure_compute(micro_batches=32, tokens_per_micro_batch=256), A100)
    assert big.efficiency > mid.efficiency > small.efficiency
    assert big.tokens_per_second > mid.tokens_per_second > small.tokens_per_second
    assert any("small micro-batch" in n for n in small.notes)


def test_checkpointing_costs_more_time():
    plain = _work()
    # Recomputing the forward once more: backward grows by the forward FLOPs.
    ckpt = _work(backward_flops=4 * 10**15 + 2 * 10**15, recompute_flops=2 * 10**15)
    a, b = step_cost(plain, A100), step_cost(ckpt, A100)
    assert b.seconds > a.seconds
    assert b.compute_seconds - a.compute_seconds == pytest.approx(2e15 / (312e12 * a.efficiency))
    assert any("recomputation" in n for n in b.notes)


def test_cpu_offload_adds_pcie_and_cpu_time_by_hand():
    params = 10**9
    on_gpu = _work()
    # ZeRO-Offload style: fp32 master + exp_avg + exp_avg_sq on the CPU (12 B/param); the GPU
    # keeps bf16 params and grads and runs no update.
    offload = _work(
        parameter_bytes=2 * params,
        gradient_bytes=2 * params,
        optimizer_flops=0,
        optimizer_state_bytes=0,
        offloaded_optimizer_bytes=12 * params,
        offloaded_parameter_count=params,
    )
    a, b = step_cost(on_gpu, A100), step_cost(offload, A100)
    pcie_bytes = 2 * params * 2  # bf16 grads down + bf16 params up
    pcie = A100.pcie_bandwidth_bytes_per_s * PCIE_EFFICIENCY
    cpu_bytes = 2 * 12 * params + pcie_bytes
    assert b.transfer_seconds == pytest.approx(pcie_bytes / pcie, rel=1e-12)
    assert b.optimizer_seconds == pytest.approx(
        cpu_bytes / CPU_MEMORY_BANDWIDTH_BYTES_PER_S, rel=1e-12
    )
    assert b.memory_seconds == 0.0
    assert b.compute_seconds == pytest.approx(a.compute_seconds)
    assert b.seconds > a.seconds
    assert b.seconds == pytest.approx(_total(b), rel=1e-12)
    assert any("not overlapped" in n for n in b.notes)


def test_cpu_embedding_crosses_pcie():
    cost = step_cost(_pure_compute(cpu_embedding_bytes_per_step=3 * GB), A100)
    expected = 3 * GB / (A100.pcie_bandwidth_bytes_per_s * PCIE_EFFICIENCY)
    assert cost.transfer_seconds == pytest.approx(expected, rel=1e-12)
    assert cost.seconds > step_cost(_pure_compute(), A100).seconds


def test_sharding_over_nvlink_is_cheaper_than_over_pcie():
    work = _pure_compute(n_gpus=8, sharded_bytes_per_step=100 * GB)
    sxm = step_cost(work, A100)  # NVLink
    pcie_card = get_gpu("a100-pcie-80gb")  # no NVLink
    pcie = step_cost(work, pcie_card)
    nv_total = 100 * GB / (NVLINK_BYTES_PER_S["ampere"] * NVLINK_EFFICIENCY)
    assert sxm.communication_seconds == pytest.approx(
        nv_total * (1 - COMMUNICATION_OVERLAP), rel=1e-12
    )
    pcie_total = 100 * GB / (pcie_card.pcie_bandwidth_bytes_per_s * PCIE_EFFICIENCY)
    assert pcie.communication_seconds == pytest.approx(
        pcie_total * (1 - COMMUNICATION_OVERLAP), rel=1e-12
    )
    assert sxm.seconds < pcie.seconds


def test_overlap_never_hides_more_than_the_compute():
    work = _pure_compute(
        forward_flops=10**9, backward_flops=2 * 10**9, sharded_bytes_per_step=1000 * GB
    )
    cost = step_cost(work, A100)
    total = 1000 * GB / (NVLINK_BYTES_PER_S["ampere"] * NVLINK_EFFICIENCY)
    assert cost.communication_seconds == pytest.approx(total - cost.compute_seconds, rel=1e-12)


def test_ranking_is_monotonic_in_flops():
    times = [
        step_cost(_work(forward_flops=f, backward_flops=2 * f), A100).seconds
        for f in (10**12, 10**13, 10**14, 10**15, 10**16)
    ]
    assert times == sorted(times) and len(set(times)) == len(times)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_h100_faster_than_a100_faster_than_t4(dtype):
    work = _work(compute_dtype=dtype)
    h, a, t = (step_cost(work, g).seconds for g in (H100, A100, T4))
    assert h < a < t


# ------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "changes",
    [
        {"forward_flops": -1},
        {"micro_batches": 0},
        {"tokens_per_micro_batch": 0},
        {"n_gpus": 0},
        {"compute_dtype": "fp8"},
        {"recompute_flops": 5 * 10**15},
        {"gradient_bytes": 1.5},
        {"offloaded_optimizer_bytes": GB},  # no offloaded_parameter_count
    ],
)
def test_bad_step_work_is_rejected(changes):
    with pytest.raises(BadInputError):
        _work(**changes)


def test_frozen_and_keyword_only():
    work = _work()
    with pytest.raises(AttributeError):
        work.micro_batches = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        StepWork(1, 2, 0, 0, 1, 1, "float32", 0, 0, 0)  # type: ignore[misc]
