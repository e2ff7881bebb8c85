"""Exact byte counts of the tracer, checked against sizes worked out by hand.

Every expected number below is computed in the test from tensor shapes, dtypes and the CUDA
caching allocator's 512-byte rounding (CUDACachingAllocator.cpp kMinBlockSize), with the
arithmetic written out in comments. None is copied from memfit's output.

The tiny model used throughout is

    nn.Sequential(Linear(64, 32, bias=False), ReLU(), Linear(32, 16, bias=False))

    W1: 32 x 64 = 2048 elements      W2: 16 x 32 = 512 elements

fp32:  W1 = 2048 * 4 = 8192 B = 16 * 512      W2 = 512 * 4 = 2048 B = 4 * 512
bf16:  W1 = 2048 * 2 = 4096 B =  8 * 512      W2 = 512 * 2 = 1024 B = 2 * 512

so no rounding is involved for the weights themselves; rounding shows up in scalars (step
counters, the loss) and in the deliberately odd-sized model of `test_block_rounding_*`.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import memfit
from memfit import Workload
from memfit.cuda.allocator_config import K_MIN_BLOCK_SIZE as CUDA_BLOCK_ROUNDING
from memfit.cuda.allocator_config import cuda_block_size
from memfit.estimator.trace.step_runner import run_trace
from memfit.profile import MemoryProfile
from tests.conftest import module_spec

BATCH = 8

# Hand-computed sizes of the tiny model (see the module docstring).
W1_FP32 = 32 * 64 * 4  # 8192
W2_FP32 = 16 * 32 * 4  # 2048
P_FP32 = W1_FP32 + W2_FP32  # 10240
W1_BF16 = 32 * 64 * 2  # 4096
W2_BF16 = 16 * 32 * 2  # 1024
P_BF16 = W1_BF16 + W2_BF16  # 5120
# A 0-dim fp32 tensor (Adam's step counter, a scalar loss) holds 4 bytes: one 512-byte block.
SCALAR_BLOCK = 512


def tiny_model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 32, bias=False), nn.ReLU(), nn.Linear(32, 16, bias=False))


def spec_for(module: nn.Module, in_features: int, dtype: torch.dtype = torch.float32):
    """resolve_model(nn.Module) (loss "sum") with a batch factory of (BATCH, in_features)."""
    spec = module_spec(module, lambda b: torch.randn(b, in_features, dtype=dtype))
    assert spec.loss == "sum"
    return spec


def trace(module: nn.Module, in_features: int, **workload):
    prec = workload.get("precision", "fp32")
    dtype = torch.bfloat16 if prec == "bf16-true" else torch.float32
    w = Workload(batch_size=BATCH, **workload)
    tr = run_trace(spec_for(module, in_features, dtype), w, (8, 0))
    return tr, MemoryProfile.from_events(tr.records, tr.events)


def category_bytes(tr, category: str, *, step: int | None = None) -> int:
    """Rounded bytes of every device storage the trace put in `category` (not only at the peak)."""
    return sum(
        cuda_block_size(r.nbytes)
        for r in tr.records.values()
        if r.category == category and not r.host and (step is None or r.step == step)
    )


# ------------------------------------------------------------------------------ rounding


def test_cuda_block_size_rounds_up_to_512() -> None:
    assert CUDA_BLOCK_ROUNDING == 512
    assert cuda_block_size(0) == 0  # a zero-byte request allocates nothing
    assert cuda_block_size(1) == 512
    assert cuda_block_size(4) == 512  # an fp32 scalar
    assert cuda_block_size(512) == 512
    assert cuda_block_size(513) == 1024
    assert cuda_block_size(8192) == 8192


def test_block_rounding_of_odd_sized_parameters() -> None:
    # Linear(3, 5): weight 5 x 3 = 15 fp32 = 60 B -> one 512-B block; bias 5 fp32 = 20 B -> one
    # block. Raw bytes 80, device bytes 1024.
    tr, _ = trace(nn.Linear(3, 5), 3, optimizer="adamw")
    assert tr.parameter_count == 15 + 5
    assert sum(r.nbytes for r in tr.records.values() if r.category == "parameters") == 80
    assert category_bytes(tr, "parameters") == 2 * 512
    # Each Adam moment is rounded the same way: 2 moments x 2 tensors x 512 B.
    assert category_bytes(tr, "optimizer_state") == 4 * 512


# ---------------------------------------------------------- parameters, grads, opt state


# optimizer -> optimizer-state bytes for the tiny model, as a function of the parameter bytes
# P (same dtype as the parameters) and of the fp32 sizes (adamw-8bit keeps fp32 states here).
OPT_STATE = {
    # exp_avg + exp_avg_sq, same dtype as the parameter. foreach Adam keeps `step` as a CPU
    # scalar (Adam._init_group), so the step counters are host memory and not counted.
    "adamw": lambda p: 2 * p,
    "adam": lambda p: 2 * p,
    # fused=True keeps `step` on the device: one fp32 scalar (4 B -> 512 B) per parameter.
    "adamw-fused": lambda p: 2 * p + 2 * SCALAR_BLOCK,
    "sgd": lambda p: 0,
    # One momentum_buffer per parameter (a clone of the first gradient).
    "sgd-momentum": lambda p: p,
    # Lion: one exp_avg per parameter.
    "lion": lambda p: p,
    # Adafactor (foreach, factored second moment for 2-D params): row_var (R, 1) and
    # col_var (1, C) in fp32 = grad dtype here. W1 32x64: 32*4 = 128 B -> 512, 64*4 = 256 B
    # -> 512. W2 16x32: 16*4 = 64 B -> 512, 32*4 = 128 B -> 512. Step is a host scalar.
    # (In bf16-true the vectors are half as large and still one block each.)
    "adafactor": lambda p: 4 * 512,
    # bitsandbytes keeps 32-bit states for tensors under 4096 elements (both are): two fp32
    # states per parameter whatever the parameter dtype: 2 * (2048 + 512) * 4 = 20480.
    "adamw-8bit": lambda p: 2 * (2048 + 512) * 4,
}


@pytest.mark.parametrize("optimizer", list(OPT_STATE))
@pytest.mark.parametrize("precision", ["fp32", "bf16-true"])
def test_parameters_gradients_optimizer_state(optimizer: str, precision: str) -> None:
    tr, prof = trace(tiny_model(), 64, optimizer=optimizer, precision=precision)
    p = P_FP32 if precision == "fp32" else P_BF16
    assert tr.parameter_count == 2048 + 512
    assert category_bytes(tr, "parameters") == p
    # One gradient per parameter per step, same dtype as the parameter.
    assert category_bytes(tr, "gradients", step=0) == p
    assert category_bytes(tr, "gradients", step=1) == p
    assert category_bytes(tr, "optimizer_state") == OPT_STATE[optimizer](p)
    # Steady state: when step 1's backward ends, parameters, gradients and the whole optimizer
    # state are live (the batch and activations are gone), and nothing else but the loss.
    end_of_backward = max(i for i, key in enumerate(prof.timeline_phases) if key == (1, "backward"))
    assert prof.timeline[end_of_backward] == 2 * p + OPT_STATE[optimizer](p)


def test_adam_step_counters_are_host_for_foreach_and_device_for_fused() -> None:
    tr_foreach, _ = trace(tiny_model(), 64, optimizer="adamw")
    tr_fused, _ = trace(tiny_model(), 64, optimizer="adamw-fused")
    # The step counters are the 4-byte optimizer-state storages (one per parameter).
    steps_foreach = [
        r for r in tr_foreach.records.values() if r.category == "optimizer_state" and r.nbytes == 4
    ]
    steps_fused = [
        r for r in tr_fused.records.values() if r.category == "optimizer_state" and r.nbytes == 4
    ]
    assert len(steps_foreach) == len(steps_fused) == 2
    assert all(r.host for r in steps_foreach)
    assert not any(r.host for r in steps_fused)


def test_adamw_8bit_blockwise_layout() -> None:
    # W1: Linear(128, 64) = 64 x 128 = 8192 elements >= 4096 -> 8-bit states.
    #   state1, state2: uint8, 8192 B each (16 blocks of 512).
    #   absmax1, absmax2: ceil(8192 / 256) = 32 fp32 = 128 B -> 512 B each.
    #   qmap1, qmap2: bitsandbytes' "dynamic" and "udynamic" maps, 256 fp32 = 1024 B each, shared
    #   by every 8-bit parameter (fill_qmap).
    # W2: Linear(64, 16) = 16 x 64 = 1024 elements < 4096 -> two fp32 states, 4096 B each.
    model = nn.Sequential(nn.Linear(128, 64, bias=False), nn.ReLU(), nn.Linear(64, 16, bias=False))
    tr, _ = trace(model, 128, optimizer="adamw-8bit")
    expected = (8192 + 8192) + (512 + 512) + 2 * 1024 + (4096 + 4096)  # 27648
    assert category_bytes(tr, "optimizer_state") == expected
    # The 8-bit state is about a quarter of AdamW's 2 * 4 bytes per element for W1.
    assert 8192 + 8192 < 2 * 8192 * 4


# -------------------------------------------------------------------- whole-step peaks


def test_sgd_peak_is_in_backward_and_exact() -> None:
    # SGD (foreach, no momentum) updates in place with no temporaries, so the peak is in
    # backward. Live bytes, step by step (batch 8, fp32):
    #   parameters                                   P = 10240
    #   input x: 8 x 64 fp32 = 2048 B                      2048
    #   forward: h = x @ W1.T (8x32 = 1024 B), r = relu(h) (1024 B, saved for backward:
    #     threshold_backward reads the output), h freed; y = r @ W2.T (8x16 = 512 B);
    #     loss = y.sum() (4 B -> 512), y freed (sum saves no input).
    #   backward: ones_like(loss) 512; grad W2 = g.T @ r 2048 B; grad r = g @ W2 1024 B;
    #     threshold_backward 1024 B; grad r freed; r freed (512-B rounded sizes are exact);
    #     grad W1 = g1.T @ x 8192 B  <- peak here.
    peak = P_FP32 + 2048 + 512 + 512 + W2_FP32 + 1024 + W1_FP32
    assert peak == 24576
    _, prof = trace(tiny_model(), 64, optimizer="sgd")
    assert prof.peak_allocated_bytes == peak
    assert prof.peak_phase == "backward"
    assert prof.breakdown["parameters"] == P_FP32
    assert prof.breakdown["gradients"] == W1_FP32 + W2_FP32
    assert prof.breakdown["inputs"] == 2048
    assert prof.breakdown["activations"] == 512  # the loss outlives the forward
    assert prof.breakdown["temporaries"] == 512 + 1024  # ones_like + threshold_backward
    assert prof.breakdown["optimizer_state"] == 0


def test_adamw_peak_is_the_foreach_sqrt_and_exact() -> None:
    # foreach AdamW (torch/optim/adam.py _multi_tensor_adam, not capturable): lerp_/mul_/
    # addcmul_ update the moments in place, then `_foreach_sqrt(exp_avg_sqs)` allocates one
    # temporary per parameter (P bytes in all) before div_/add_/addcdiv_ (in place).
    # The batch was released after backward, so at that moment the live set is
    #   parameters P + gradients P + exp_avg P + exp_avg_sq P + sqrt temporaries P = 5 P.
    # (The `torch.tensor(1.0)` increment of the CPU step counters is freed before the sqrt.)
    _, prof = trace(tiny_model(), 64, optimizer="adamw")
    assert prof.peak_allocated_bytes == 5 * P_FP32 == 51200
    assert prof.peak_phase == "optimizer"
    assert prof.peak_op.startswith("_foreach_sqrt")
    assert prof.breakdown == {
        "parameters": P_FP32,
        "buffers": 0,
        "gradients": P_FP32,
        "optimizer_state": 2 * P_FP32,
        "inputs": 0,
        "activations": 0,
        "temporaries": P_FP32,
        "workspaces": 0,
        "kv_cache": 0,
    }


def test_estimate_api_adds_only_the_cublas_workspace() -> None:
    # memfit.estimate on an nn.Module: the same stream plus the cuBLAS workspace, which counts
    # as allocated memory from the first matmul on.
    spec = spec_for(tiny_model(), 64)
    est = memfit.estimate(spec, Workload(batch_size=BATCH, optimizer="adamw"))
    ws = est.profile.breakdown["workspaces"]
    # PyTorch's default CUBLAS_WORKSPACE_CONFIG ":4096:2:16:8" on sm80 (the default GPU is an
    # A100): 2 x 4096 KiB + 8 x 16 KiB = 8,519,680 B per workspace; training has two (the
    # forward thread's and autograd's backward thread's).
    assert ws == 2 * (2 * 4096 + 8 * 16) * 1024 == 17_039_360
    assert est.profile.peak_allocated_bytes == 5 * P_FP32 + ws
    assert est.parameter_count == 2048 + 512
    assert est.replayed is False


def test_bf16_true_halves_parameters_gradients_and_adam_state() -> None:
    tr32, prof32 = trace(tiny_model(), 64, optimizer="adamw", precision="fp32")
    tr16, prof16 = trace(tiny_model(), 64, optimizer="adamw", precision="bf16-true")
    for cat in ("parameters", "optimizer_state"):
        assert category_bytes(tr16, cat) * 2 == category_bytes(tr32, cat)
    assert category_bytes(tr16, "gradients", step=1) * 2 == category_bytes(
        tr32, "gradients", step=1
    )

    # The optimizer step has the same structure in both (see the fp32 test): 5 P, with the
    # bf16 sizes 4096 and 1024 still multiples of 512.
    def optimizer_peak(prof: MemoryProfile) -> int:
        return next(x.peak_bytes for x in prof.phases if (x.step, x.phase) == (1, "optimizer"))

    assert optimizer_peak(prof32) == 5 * P_FP32
    assert optimizer_peak(prof16) == 5 * P_BF16


# ------------------------------------------------------------------------- tied weights


class Tied(nn.Module):
    """Two Linear layers sharing one weight (like tied input/output embeddings)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(32, 32, bias=False)
        self.b = nn.Linear(32, 32, bias=False)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_tied_weights_counted_once() -> None:
    # One 32 x 32 fp32 weight = 1024 elements = 4096 B, however many modules use it.
    w_bytes = 32 * 32 * 4
    tr, _ = trace(Tied(), 32, optimizer="adamw")
    assert tr.parameter_count == 32 * 32
    assert category_bytes(tr, "parameters") == w_bytes
    # Both uses accumulate into the same .grad: one gradient storage per step.
    assert category_bytes(tr, "gradients", step=1) == w_bytes
    # One parameter -> one exp_avg and one exp_avg_sq.
    assert category_bytes(tr, "optimizer_state") == 2 * w_bytes

    est = memfit.estimate(spec_for(Tied(), 32), Workload(batch_size=BATCH))
    assert est.parameter_count == 32 * 32


# ---------------------------------------------------------------------- llama-2-7b (catalog)

LLAMA2_7B_PARAMS = 6_738_415_616
# By hand: hidden 4096, intermediate 11008, 32 layers, vocab 32000, untied head.
#   per layer: q, k, v, o 4 * 4096^2 = 67,108,864; gate, up, down 3 * 4096 * 11008 =
#   135,266,304; two RMSNorm weights 2 * 4096 = 8,192 -> 202,383,360; x 32 = 6,476,267,520
#   embed_tokens + lm_head 2 * 32000 * 4096 = 262,144,000; final norm 4096.
#   total 6,476,267,520 + 262,144,000 + 4,096 = 6,738,415,616.
# Every Llama-2-7b tensor has a dimension of 4096, and 4096 bf16 = 8192 B = 16 * 512, so each
# tensor's byte size is a multiple of 512: no rounding, and the device bytes of the parameters
# are exactly 2 bytes * 6,738,415,616.
LLAMA2_7B_TENSORS = 32 * 9 + 3  # 9 tensors per layer + embed_tokens, norm, lm_head


@pytest.fixture(scope="module")
def llama7b():
    """One estimate of llama-2-7b (bf16-true, AdamW, H100), with the stream it was built from."""
    import memfit.estimator.estimation as estimator_mod

    per_layer = 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    assert 32 * per_layer + 2 * 32000 * 4096 + 4096 == LLAMA2_7B_PARAMS

    captured = {}
    real_trace_spec = estimator_mod.trace_spec

    def spy(*args, **kwargs):
        out = real_trace_spec(*args, **kwargs)
        captured["trace"] = out[0]
        return out

    w = Workload(batch_size=1, seq_len=2048, precision="bf16-true", optimizer="adamw")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(estimator_mod, "trace_spec", spy)
        est = memfit.estimate("llama-2-7b", w, gpu="h100-sxm")
    return est, captured["trace"]


def test_llama2_7b_parameter_count(llama7b) -> None:
    est, _ = llama7b
    assert est.parameter_count == LLAMA2_7B_PARAMS
    assert est.trainable_parameter_count == LLAMA2_7B_PARAMS
    assert est.num_blocks == 32
    assert est.replayed is True


def test_llama2_7b_sizes_from_the_whole_stream(llama7b) -> None:
    _, tr = llama7b
    p = LLAMA2_7B_PARAMS
    params = [r for r in tr.records.values() if r.category == "parameters"]
    assert len(params) == LLAMA2_7B_TENSORS
    assert all(r.nbytes % 512 == 0 for r in params)  # the reasoning above
    assert category_bytes(tr, "parameters") == 2 * p
    assert category_bytes(tr, "gradients", step=1) == 2 * p
    # exp_avg and exp_avg_sq in bf16 (pure bf16: the state follows the parameter dtype).
    assert category_bytes(tr, "optimizer_state") == 4 * p
    # foreach AdamW keeps one fp32 step counter per tensor on the host.
    steps = [r for r in tr.records.values() if r.category == "optimizer_state" and r.host]
    assert len(steps) == LLAMA2_7B_TENSORS
    assert all(r.nbytes == 4 for r in steps)


def test_llama2_7b_peak_breakdown(llama7b) -> None:
    est, _ = llama7b
    prof = est.profile
    p = LLAMA2_7B_PARAMS
    assert prof.peak_phase == "optimizer"
    assert prof.peak_op.startswith("_foreach_sqrt")
    assert prof.breakdown["parameters"] == 2 * p
    assert prof.breakdown["gradients"] == 2 * p
    assert prof.breakdown["optimizer_state"] == 4 * p
    # _foreach_sqrt(exp_avg_sqs): one bf16 temporary per tensor, 2 * p bytes in all.
    assert prof.breakdown["temporaries"] == 2 * p
    # The batch was released after backward; nothing from the forward is alive.
    assert prof.breakdown["inputs"] == 0
    assert prof.breakdown["activations"] == 0
    assert prof.peak_allocated_bytes == sum(prof.breakdown.values())
    assert prof.peak_allocated_bytes > 2 * p + 2 * p + 4 * p
