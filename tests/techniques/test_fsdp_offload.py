"""FSDP2's CPU offload (`fsdp_cpu_offload`, FSDPConfig(cpu_offload=True)): bytes by hand.

The trace runs the real FSDP2 with CPUOffloadPolicy over a fake process group (one rank of N,
N = 1 included) and emulates the device copies a CPU mesh skips
(memfit.techniques.offload.fsdp_offload). Host: the parameter shards, the gradient shards and the
optimizer state. Device: the shard copied up before each all-gather, the unsharded parameters
while their unit runs, the unsharded gradients and the reduce-scatter buffers.
"""

from __future__ import annotations

import socket

import pytest
import torch

import memfit
from memfit.estimator.host_memory import power_of_two_ceil
from memfit.estimator.trace.step_runner import run_trace
from memfit.models.sources import resolve_model
from memfit.techniques import FSDPConfig, OptimizerConfig, configs_from_workload, labels
from memfit.techniques.offload.fsdp_offload import OP_GRAD_TO_HOST, OP_SHARD_TO_DEVICE
from tests.conftest import module_spec, tiny_gpt2

#: The cuBLAS workspace the estimate adds for rtx-4090 (two handles: forward and backward).
_WORKSPACES = 17039360


def _gpt2_shard_bytes(n: int) -> list[int]:
    """fp32 bytes of each parameter's shard on rank 0 of n (dim 0 split, all even here):
    tiny_gpt2(2): wte (100, 32) (tied with lm_head), wpe (32, 32), per block ln_1 (32,) x2,
    c_attn (32, 96) + (96,), c_proj (32, 32) + (32,), ln_2 (32,) x2, c_fc (32, 128) + (128,),
    mlp c_proj (128, 32) + (32,); ln_f (32,) x2."""
    block = [32, 32, 32 * 96, 96, 32 * 32, 32, 32, 32, 32 * 128, 128, 128 * 32, 32]
    numels = [100 * 32, 32 * 32, *block, *block, 32, 32]
    return [4 * k // n for k in numels]


@pytest.mark.parametrize("n", [1, 2])
def test_host_holds_the_shards_gradients_and_state(n):
    """Parameters, gradients and AdamW's moments on the host, each params/N bytes; nothing of
    them on the device."""
    w = memfit.Workload(batch_size=2, seq_len=16, attention="eager", optimizer="adamw", gpus=n,
                        fsdp_cpu_offload=True)  # fmt: skip
    est = memfit.estimate(tiny_gpt2(), w)
    shards = _gpt2_shard_bytes(n)
    assert sum(shards) == 4 * 29696 // n  # 29,696 parameters
    tr = run_trace(resolve_model(tiny_gpt2()), w, None)
    params = [r.nbytes for r in tr.records.values() if r.category == "parameters"]
    assert all(r.host for r in tr.records.values() if r.category == "parameters")
    assert sorted(params) == sorted(shards)
    last = [r for r in tr.records.values() if r.step == 1]
    grads = [r.nbytes for r in last if r.category == "gradients"]
    assert all(r.host and r.op == OP_GRAD_TO_HOST for r in last if r.category == "gradients")
    assert sorted(grads) == sorted(shards)
    # AdamW: exp_avg and exp_avg_sq per shard, plus its fp32 step counter (4 B) per tensor.
    rec = est.records_summary
    assert rec["host_optimizer_state"] == 2 * sum(shards) + 4 * len(shards)
    assert rec["parameters"] == rec["gradients"] == rec["optimizer_state"] == 0
    # Pinned (CPUOffloadPolicy(pin_memory=True)): each shard a power-of-two block of the
    # caching host allocator; the largest per-parameter CPU update's temporaries on top.
    assert est.host is not None
    assert est.host.by_category["parameters"] == sum(power_of_two_ceil(b) for b in shards)
    assert est.host.by_category["gradients"] == sum(power_of_two_ceil(b) for b in shards)
    assert est.host.by_category["temporaries"] == max(shards)


class _Stack(torch.nn.Module):
    """Two repeated blocks Linear(64, 64) and a head Linear(64, 8), no biases: W = 16,384 B per
    block weight, H = 2,048 B for the head (the root's unit)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(64, 64, bias=False) for _ in range(2)])
        self.head = torch.nn.Linear(64, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _stack_estimate(n: int, offload: bool, optimizer: str = "sgd") -> memfit.Estimate:
    spec = module_spec(_Stack(), lambda b: torch.zeros(b, 64))
    w = memfit.Workload(batch_size=4, gpus=n, fsdp_cpu_offload=offload, optimizer=optimizer)
    return memfit.estimate(spec, w, gpu="rtx-4090")


W, H, X = 64 * 64 * 4, 8 * 64 * 4, 4 * 64 * 4  # block weight, head weight, (4, 64) fp32
SCALAR_BLOCK = 512  # the caching allocator's smallest block (the loss and its gradient)


def test_one_gpu_device_peak_by_hand():
    """gpus=1: the peak is block 0's unshard in backward (op resize_). Alive: the input x, the
    loss and its ones_like (a 512 B block each), block 1's reduce-scatter input (FSDP2 keeps
    the last one until the next reduce-scatter), the root's unsharded head weight and its
    unsharded gradient (the root reduces last), the gradient of block 1's input, and block 0's
    shard copied to the device beside its unsharded weight being allocated."""
    est = _stack_estimate(1, True)
    by_hand = X + 2 * SCALAR_BLOCK + W + H + H + X + W + W
    assert est.profile.peak_allocated_bytes == _WORKSPACES + by_hand
    assert (est.profile.peak_phase, est.profile.peak_op) == ("backward", "resize_")
    assert est.host is not None
    assert est.host.by_category["parameters"] == 2 * W + H  # powers of two already


def test_copies_to_the_device_each_pass():
    """One shard copy per unit in forward and again in backward (blocks reshard after forward;
    the root too, as memfit shards it), each the size of the shard."""
    spec = module_spec(_Stack(), lambda b: torch.zeros(b, 64))
    for n in (1, 2):
        w = memfit.Workload(batch_size=4, gpus=n, fsdp_cpu_offload=True, optimizer="sgd")
        tr = run_trace(spec, w, None)
        ups = [r for r in tr.records.values() if r.op == OP_SHARD_TO_DEVICE and r.step == 1]
        by_phase = {ph: sorted(r.nbytes for r in ups if r.phase == ph)
                    for ph in ("forward", "backward")}  # fmt: skip
        assert by_phase == {ph: sorted([W // n, W // n, H // n]) for ph in by_phase}
        assert not any(r.host for r in ups)


def test_offload_saves_shards_and_state_on_two_gpus():
    """gpus=2, AdamW: offloading removes the device's parameter shards (W/2 + W/2 + H/2) and
    AdamW's two moments of each; the peak (block 1's reduce-scatter) holds the reduce-scatter
    output in both runs: the gradient shard without offload, the buffer before its copy down
    with it."""
    plain, off = _stack_estimate(2, False, "adamw"), _stack_estimate(2, True, "adamw")
    shards = W // 2 + W // 2 + H // 2
    assert plain.profile.breakdown["parameters"] == shards
    assert plain.profile.breakdown["optimizer_state"] == 2 * shards
    saved = plain.profile.peak_allocated_bytes - off.profile.peak_allocated_bytes
    assert saved == shards + 2 * shards
    assert off.profile.breakdown["parameters"] == off.profile.breakdown["optimizer_state"] == 0
    assert off.records_summary["host_optimizer_state"] == 2 * shards + 3 * 4  # + step counters


def test_configs_labels_and_refusals():
    w = memfit.Workload(fsdp_cpu_offload=True)
    fsdp = [c for c in configs_from_workload(w) if isinstance(c, FSDPConfig)]
    assert fsdp == [FSDPConfig(world_size=1, cpu_offload=True)]
    assert "FSDP2 CPU offload" in labels(w)
    assert "FSDP over 4 GPUs, FSDP2 CPU offload" in labels(w.with_(gpus=4))
    with pytest.raises(memfit.BadInputError, match="paged state is plain CPU memory"):
        memfit.Workload(fsdp_cpu_offload=True, optimizer="paged-adamw")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_apply_on_one_cpu_rank_trains_like_the_plain_model():
    """apply_ with fsdp_cpu_offload on a gloo group of one (pin_memory=False without CUDA):
    the shards and their gradients stay on the CPU, AdamW's state is made there, and the
    losses are those of the unsharded model."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    dist.init_process_group(
        "gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{_free_port()}"
    )
    try:
        ref = memfit.apply_(tiny_gpt2(), [OptimizerConfig()])
        model = tiny_gpt2()
        setup = memfit.apply_(model, memfit.Workload(fsdp_cpu_offload=True), lr=1e-3)
        assert "FSDP2 CPU offload" in setup.techniques
        g = torch.Generator().manual_seed(0)
        for _ in range(2):
            ids = torch.randint(0, 100, (2, 16), generator=g)
            b = {"input_ids": ids, "labels": ids.clone()}
            assert setup.step(b) == pytest.approx(ref.step(b), rel=1e-6)
        params = list(model.parameters())
        assert all(isinstance(p, DTensor) and p._local_tensor.device.type == "cpu" for p in params)
        assert setup.optimizer is not None and len(setup.optimizer.state) == len(params)
    finally:
        dist.destroy_process_group()
