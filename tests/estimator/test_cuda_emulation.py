"""Each CUDA emulation memfit applies on CPU, and the difference it makes.

(a) foreach optimizers: CUDA's default implementation, with parameter-sized temporaries.
(b) the CUDA autocast op policy, which is not CPU autocast's.
(c) the autocast weight-cast cache.
(d) the SDPA backend CUDA would pick, and the memory that choice decides.
(e) which optimizer state CUDA keeps on the host (Adam's step counters).

Expected byte counts are worked out by hand in comments.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

import memfit.estimator.trace.step_runner as trace_mod
from memfit import Workload
from memfit.cuda.allocator_config import cuda_block_size
from memfit.estimator.trace.attention import EFFICIENT, FLASH, MATH, AttentionCall, choose_backend
from memfit.estimator.trace.cuda_emulation import CudaEmulation
from memfit.estimator.trace.tracker import Tracker
from memfit.events import ALLOC, FREE
from memfit.profile import MemoryProfile
from memfit.techniques.optimizer import host_state_keys, optimizer_for_trace
from tests.conftest import module_spec

# ---------------------------------------------------------------------------- helpers


class Recorder:
    """Fake tensors + memfit's Tracker (+ optionally the emulation), to count allocations."""

    def __init__(self, emulation: CudaEmulation | None = None) -> None:
        self.fake = FakeTensorMode()
        self.tracker = Tracker(nn.Module())
        self.emulation = emulation

    def tensor(self, *shape: int, dtype=torch.float32, requires_grad=False, param=False):
        with self.fake:
            t = torch.empty(*shape, dtype=dtype)
        if param:
            return nn.Parameter(t)
        return t.requires_grad_(requires_grad)

    def __enter__(self) -> Recorder:
        self.fake.__enter__()
        self.tracker.__enter__()
        if self.emulation is not None:
            self.emulation.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.emulation is not None:
            self.emulation.__exit__(*exc)
        self.tracker.__exit__(*exc)
        self.fake.__exit__(*exc)

    def allocs(self, start: int = 0) -> list[tuple[str, int]]:
        """(op, nbytes) of the allocations recorded since event index `start`."""
        return [
            (ev[4], self.tracker.records[ev[1]].nbytes)
            for ev in self.tracker.events[start:]
            if ev[0] == ALLOC
        ]

    def live_bytes(self, start: int = 0) -> int:
        """Rounded bytes allocated since `start` and not yet freed."""
        live: dict[int, int] = {}
        for ev in self.tracker.events[start:]:
            if ev[0] == ALLOC:
                live[ev[1]] = cuda_block_size(self.tracker.records[ev[1]].nbytes)
            elif ev[0] == FREE:
                live.pop(ev[1], None)
        return sum(live.values())


# ------------------------------------------------------------- (a) foreach optimizers

N_LAYERS = 16
LAYER_BYTES = 32 * 32 * 4  # Linear(32, 32, bias=False): 1024 fp32 = 4096 B (8 blocks of 512)
P = N_LAYERS * LAYER_BYTES  # 65536


def _adam_peak(monkeypatch, foreach: bool) -> int:
    model = nn.Sequential(*[nn.Linear(32, 32, bias=False) for _ in range(N_LAYERS)])
    spec = module_spec(model, lambda b: torch.randn(b, 32))
    monkeypatch.setattr(
        trace_mod,
        "optimizer_for_trace",
        lambda name, params: torch.optim.AdamW(params, lr=1e-4, foreach=foreach),
    )
    tr = trace_mod.run_trace(spec, Workload(batch_size=4, optimizer="adamw"), (8, 0))
    prof = MemoryProfile.from_events(tr.records, tr.events)
    return next(x.peak_bytes for x in prof.phases if (x.step, x.phase) == (1, "optimizer"))


def test_build_optimizer_asks_for_foreach_like_cuda() -> None:
    params = [nn.Parameter(torch.zeros(2))]
    for name in ("sgd", "sgd-momentum", "adam", "adamw", "adafactor"):
        assert optimizer_for_trace(name, params).defaults["foreach"] is True, name
    assert optimizer_for_trace("adamw-fused", params).defaults["fused"] is True


def test_foreach_adamw_temporaries_vs_per_tensor(monkeypatch) -> None:
    # Steady-state optimizer step (step 1). Live throughout: parameters P, gradients P,
    # exp_avg P, exp_avg_sq P = 4 P. The batch was released after backward.
    #
    # foreach (_multi_tensor_adam): `_foreach_sqrt(exp_avg_sqs)` makes one temporary per
    # parameter, all alive at once: + P.
    foreach_peak = 4 * P + P
    # per tensor (_single_tensor_adam), for each parameter in turn:
    #     denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    # sqrt() and the division each allocate a tensor of the parameter's size, while the
    # previous parameter's `denom` is still bound (rebinding happens after the right-hand side
    # is evaluated): 3 * 4096 at most.
    per_tensor_peak = 4 * P + 3 * LAYER_BYTES
    assert _adam_peak(monkeypatch, foreach=True) == foreach_peak == 327680
    assert _adam_peak(monkeypatch, foreach=False) == per_tensor_peak == 274432
    # The difference is the parameter bytes less a few parameter-sized tensors.
    assert foreach_peak - per_tensor_peak == P - 3 * LAYER_BYTES


# ----------------------------------------------------------- (b) CUDA autocast policy


def test_cuda_policy_layer_norm_fp32_linear_fp16() -> None:
    rec = Recorder(CudaEmulation(dtype=torch.float16, capability=(8, 0)))
    x16 = rec.tensor(4, 8, dtype=torch.float16)
    x32 = rec.tensor(4, 8)
    w = rec.tensor(16, 8)
    with rec:
        # AT_FORALL_FP32 (CUDA): layer_norm runs in fp32, whatever the input dtype.
        assert F.layer_norm(x16, (8,)).dtype == torch.float32
        # AT_FORALL_LOWER_PRECISION_FP: linear runs in fp16, even on fp32 inputs.
        assert F.linear(x32, w).dtype == torch.float16
        # Not in any list: elementwise ops keep their input dtype.
        assert torch.relu(x16).dtype == torch.float16


def test_cpu_autocast_policy_differs() -> None:
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    w = torch.randn(16, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # CPU autocast casts linear too ...
        assert F.linear(torch.randn(4, 8), w).dtype == torch.bfloat16
        # ... but leaves layer_norm and softmax in 16 bits: CUDA would give fp32.
        assert F.layer_norm(x, (8,)).dtype == torch.bfloat16
        assert torch.softmax(x, -1).dtype == torch.bfloat16
    with Recorder(CudaEmulation(dtype=torch.bfloat16, capability=(8, 0))) as rec:
        xf = rec.tensor(4, 8, dtype=torch.bfloat16)
        assert F.layer_norm(xf, (8,)).dtype == torch.float32
        assert torch.softmax(xf, -1).dtype == torch.float32


def test_cuda_autocast_does_nothing_to_cpu_tensors() -> None:
    # Why the emulation exists: autocast("cuda") leaves CPU (and fake CPU) tensors alone.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autocast("cuda", dtype=torch.float16):
            assert F.linear(torch.randn(4, 8), torch.randn(16, 8)).dtype == torch.float32


def test_fp16_softmax_to_fp32_without_input_copy() -> None:
    # A (4, 8, 64) fp16 input: 2048 elements. Its fp32 softmax output: 2048 * 4 = 8192 B.
    rec = Recorder(CudaEmulation(dtype=torch.float16, capability=(8, 0)))
    x = rec.tensor(4, 8, 64, dtype=torch.float16)
    with rec:
        start = len(rec.tracker.events)
        y = torch.softmax(x, -1)
        # CUDA runs _softmax(half_to_float=True): one fp32 output, no fp32 copy of the input.
        assert y.dtype == torch.float32
        assert rec.allocs(start) == [("_softmax.default", 8192)]
    # The generic `dtype=float32` path (CPU, or bf16 on CUDA) first copies the input to fp32.
    rec2 = Recorder()
    x2 = rec2.tensor(4, 8, 64, dtype=torch.float16)
    with rec2:
        y2 = torch.softmax(x2, -1, dtype=torch.float32)
        assert y2.dtype == torch.float32
        assert rec2.allocs() == [("_to_copy.default", 8192), ("_softmax.default", 8192)]
    # ATen softmax special-cases only Half: a bf16 input is converted first, as memfit does.
    rec3 = Recorder(CudaEmulation(dtype=torch.bfloat16, capability=(8, 0)))
    x3 = rec3.tensor(4, 8, 64, dtype=torch.bfloat16)
    with rec3:
        torch.softmax(x3, -1)
        assert rec3.allocs() == [("_to_copy.default", 8192), ("_softmax.default", 8192)]


# --------------------------------------------------------------- (c) weight-cast cache


def test_weight_cast_cache() -> None:
    # W: 16 x 8 fp32 Parameter; its fp16 cast is 128 * 2 = 256 B. x is already fp16, so the
    # only casts are of the weight.
    emu = CudaEmulation(dtype=torch.float16, capability=(8, 0))
    rec = Recorder(emu)
    w = rec.tensor(16, 8, param=True)
    x = rec.tensor(4, 8, dtype=torch.float16)
    cast = ("_to_copy.default", 16 * 8 * 2)
    with rec:
        F.linear(x, w)
        F.linear(x, w)
        # A leaf fp32 parameter is cast once per autocast region (autocast_mode.cpp
        # cached_cast), and the cast stays alive while the region lasts.
        casts = [a for a in rec.allocs() if a[0] == "_to_copy.default"]
        assert casts == [cast]
        cast_sid = next(ev[1] for ev in rec.tracker.events if ev[4] == "_to_copy.default")
        assert not any(ev[0] == FREE and ev[1] == cast_sid for ev in rec.tracker.events)

        # A non-leaf (here w * 1) is not cached: cast at every use.
        start = len(rec.tracker.events)
        w2 = w * 1.0
        F.linear(x, w2)
        F.linear(x, w2)
        casts = [a for a in rec.allocs(start) if a[0] == "_to_copy.default"]
        assert casts == [cast, cast]

        # End of the region: the cached cast is released, and the next use casts again.
        emu.clear_cache()
        assert any(ev[0] == FREE and ev[1] == cast_sid for ev in rec.tracker.events)
        start = len(rec.tracker.events)
        F.linear(x, w)
        assert [a for a in rec.allocs(start) if a[0] == "_to_copy.default"] == [cast]


# ------------------------------------------------------------------ (d) SDPA backends


def call(dtype=torch.bfloat16, head=64, mask=False, value_head=None) -> AttentionCall:
    return AttentionCall(
        dtype=dtype,
        head_dim=head,
        value_head_dim=head if value_head is None else value_head,
        has_mask=mask,
        dropout_p=0.0,
    )


A100, T4, V100, P100, K80 = (8, 0), (7, 5), (7, 0), (6, 0), (3, 7)


@pytest.mark.parametrize(
    ("attention", "capability", "expected"),
    [
        # flash: 16-bit, sm80+, head dim <= 256, no explicit mask, equal q/k/v head dims.
        (call(torch.bfloat16, 64), A100, FLASH),
        (call(torch.float16, 128), (9, 0), FLASH),
        (call(torch.float16, 256), A100, FLASH),
        (call(torch.bfloat16, 64), None, FLASH),  # no GPU named: Ampere assumed
        # fp32 never uses flash; efficient takes it (head dim multiple of 4).
        (call(torch.float32, 64), A100, EFFICIENT),
        # an explicit mask rules out flash, not efficient.
        (call(torch.bfloat16, 64, mask=True), A100, EFFICIENT),
        # head dim over 256: not flash; 264 % 8 == 0 -> efficient.
        (call(torch.float16, 264), A100, EFFICIENT),
        # different value head dim: not flash.
        (call(torch.float16, 64, value_head=32), A100, EFFICIENT),
        # pre-Ampere: no flash; efficient for fp16 with aligned head dims.
        (call(torch.float16, 64), T4, EFFICIENT),
        (call(torch.float16, 64), V100, EFFICIENT),
        (call(torch.float32, 64), P100, EFFICIENT),
        # T4, fp16, head dim 257: not a multiple of 8 -> math.
        (call(torch.float16, 257), T4, MATH),
        # 16-bit head dim not a multiple of 8 with a mask (no flash): math.
        (call(torch.float16, 60, mask=True), A100, MATH),
        # fp32 head dim not a multiple of 4: math.
        (call(torch.float32, 62), A100, MATH),
        # below sm50: math only.
        (call(torch.float16, 64), K80, MATH),
    ],
)
def test_choose_backend_rules(attention, capability, expected) -> None:
    assert choose_backend(attention, capability) == expected


# sdp_utils.cpp can_use_mem_efficient_attention allows bf16 only from sm80
# (less_than_sm80_mem_efficient_dtypes = {Half, Float}): a T4/V100 runs bf16 through math.
@pytest.mark.parametrize("capability", [T4, V100])
def test_choose_backend_bf16_before_sm80_is_math(capability) -> None:
    assert choose_backend(call(torch.bfloat16, 64), capability) == MATH


def test_flash_head_dim_above_192_on_sm86_89_for_training() -> None:
    # check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89: an RTX 3090 (8.6) or 4090
    # (8.9) cannot train flash with head dim 200; an A100 (8.0) can; inference is unaffected.
    train = AttentionCall(torch.bfloat16, 200, 200, False, 0.0, requires_grad=True)
    infer = AttentionCall(torch.bfloat16, 200, 200, False, 0.0, requires_grad=False)
    assert choose_backend(train, (8, 6)) == EFFICIENT
    assert choose_backend(train, (8, 9)) == EFFICIENT
    assert choose_backend(train, (8, 0)) == FLASH
    assert choose_backend(infer, (8, 6)) == FLASH


def test_sdpa_backend_decides_saved_memory() -> None:
    # One causal-free SDPA call, fp16 q/k/v of shape (B, H, S, D) = (1, 2, 128, 36), needing
    # grad. head dim 36: flash on an A100 (<= 256), math on a T4 (36 % 8 != 0 rules out the
    # efficient kernel, and flash needs sm80). Bytes alive after the call (output + what is
    # saved for backward), all multiples of 512:
    B, H, S, D = 1, 2, 128, 36
    qkv16 = B * H * S * D * 2  # 18432: one fp16 (B, H, S, D) tensor
    qkv32 = B * H * S * D * 4  # 36864: the same in fp32
    # flash: output (fp16) + logsumexp (B, H, S) fp32 + philox seed (16 B) and offset (8 B),
    # one 512-B block each.
    flash = qkv16 + B * H * S * 4 + 512 + 512
    # math (ATen _scaled_dot_product_attention_math): 16-bit inputs are upcast to fp32 for
    # accuracy; q and k are each scaled by sqrt(scale) (fp32 copies saved by the matmul),
    # v's fp32 copy is saved by attn @ v, the softmax probabilities (B, H, S, S) fp32 are
    # saved, and the output is cast back to fp16.
    math_ = 3 * qkv32 + B * H * S * S * 4 + qkv16
    assert flash == 20480 and math_ == 260096

    saved = {}
    for capability in (A100, T4):
        backends: list[str] = []
        emu = CudaEmulation(dtype=None, capability=capability, on_attention=backends.append)
        rec = Recorder(emu)
        q, k, v = (rec.tensor(B, H, S, D, dtype=torch.float16, requires_grad=True) for _ in "qkv")
        with rec:
            out = F.scaled_dot_product_attention(q, k, v)
            assert out.shape == (B, H, S, D) and out.dtype == torch.float16
            saved[backends[0]] = rec.live_bytes()
    assert saved == {FLASH: flash, MATH: math_}
    # The math kernel's attention matrix is what the flash kernel avoids.
    assert saved[MATH] - saved[FLASH] == 239616


# ------------------------------------------------------------- (e) host optimizer state


def test_host_state_keys() -> None:
    params = [nn.Parameter(torch.zeros(4))]
    # Adam/AdamW/Adafactor keep `step` as a CPU scalar unless fused or capturable.
    assert host_state_keys(torch.optim.AdamW(params, foreach=True)) == {"step"}
    assert host_state_keys(torch.optim.Adam(params, foreach=False)) == {"step"}
    assert host_state_keys(torch.optim.Adafactor(params, foreach=True)) == {"step"}
    assert host_state_keys(torch.optim.AdamW(params, fused=True)) == frozenset()
    assert host_state_keys(torch.optim.Adam(params, capturable=True)) == frozenset()
    assert host_state_keys(optimizer_for_trace("adamw", params)) == {"step"}
    assert host_state_keys(optimizer_for_trace("adamw-fused", params)) == frozenset()


def _tiny_trace(optimizer: str):
    model = nn.Sequential(nn.Linear(64, 32, bias=False), nn.ReLU(), nn.Linear(32, 16, bias=False))
    spec = module_spec(model, lambda b: torch.randn(b, 64))
    return trace_mod.run_trace(spec, Workload(batch_size=8, optimizer=optimizer), (8, 0))


def test_step_counters_host_for_foreach_device_for_fused() -> None:
    # Two parameters -> two step counters, fp32 scalars: 4 B each, 512 B on the device.
    for optimizer, host in (("adamw", True), ("adamw-fused", False)):
        tr = _tiny_trace(optimizer)
        steps = [
            r for r in tr.records.values() if r.category == "optimizer_state" and r.nbytes == 4
        ]
        assert len(steps) == 2
        assert all(r.host is host for r in steps)
        prof = MemoryProfile.from_events(tr.records, tr.events)
        # Two moments of W1 (8192 B) and W2 (2048 B), plus the counters when on the device.
        expected_state = 2 * (8192 + 2048) + (0 if host else 2 * 512)
        end_of_backward = max(
            i for i, key in enumerate(prof.timeline_phases) if key == (1, "backward")
        )
        # parameters + gradients (2 * 10240) + state, at the end of step 1's backward.
        assert prof.timeline[end_of_backward] == 2 * 10240 + expected_state


# foreach Adam increments CPU step counters with `torch.tensor(1.0, device="cpu")` (adam.py
# _multi_tensor_adam): a host scalar on CUDA too, so no device memory.
def test_foreach_adam_step_increment_is_host_memory() -> None:
    tr = _tiny_trace("adamw")
    # In the steady-state step, the only device allocations of the optimizer are the
    # _foreach_sqrt temporaries (one per parameter).
    ops = [
        ev[4]
        for ev in tr.events
        if ev[0] == ALLOC and ev[2] == "optimizer" and ev[3] == 1 and not tr.records[ev[1]].host
    ]
    assert ops == ["_foreach_sqrt.default", "_foreach_sqrt.default"]


# Every fact choose_backend reads, at and around each of its thresholds.
_DIMS = ((64, 64), (62, 62), (66, 66), (128, 64), (192, 192), (200, 200), (224, 224), (232, 232),
         (256, 256), (264, 264))  # fmt: skip
_CALLS = [
    AttentionCall(dtype, d, v, mask, p, requires_grad=grad)
    for dtype in (torch.float32, torch.float16, torch.bfloat16)
    for d, v in _DIMS
    for mask in (False, True)
    for p in (0.0, 0.1)
    for grad in (False, True)
]


def test_gpus_of_one_attention_class_pick_the_same_kernels() -> None:
    """The trace cache keys on attention_class: each catalog capability (and the thresholds'
    neighbours) must pick, for every call, what its class picks."""
    from memfit.cuda.target import list_gpus
    from memfit.estimator.trace.attention import attention_class

    caps = {g.compute_capability for g in list_gpus()}
    caps |= {(3, 7), (5, 0), (6, 1), (7, 0), (7, 5), (8, 0), (8, 6), (8, 7), (8, 9), (9, 0),
             (10, 0), (12, 0), None}  # fmt: skip
    for cap in caps:
        same = attention_class(cap)
        for call in _CALLS:
            assert choose_backend(call, same) == choose_backend(call, cap), (cap, call)
    # Three classes among the catalog's GPUs: before 8.0, sm86/sm89, the rest of 8.0 and later.
    classes = {attention_class(g.compute_capability) for g in list_gpus()}
    assert classes == {(5, 0), (8, 6), (8, 0)}


def test_training_dropout_saves_cudas_one_byte_mask():
    # ATen Dropout.cpp: CUDA training dropout is native_dropout, which saves a bool mask
    # (1 byte per element); the CPU path would save a noise tensor of the input's dtype.

    from memfit.estimator.trace.cuda_emulation import CudaEmulation

    def saved_bytes(emulate: bool) -> int:
        saved: list[int] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved.append(t.numel() * t.element_size())
            return t

        x = torch.randn(16, 512, 768, dtype=torch.bfloat16, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if emulate:
                with CudaEmulation(dtype=None, capability=(9, 0)):
                    F.dropout(x, p=0.1, training=True)
            else:
                F.dropout(x, p=0.1, training=True)
        return sum(saved)

    assert saved_bytes(emulate=True) == 16 * 512 * 768  # the bool mask: 6,291,456 B
    assert saved_bytes(emulate=False) == 16 * 512 * 768 * 2  # CPU: a bf16 noise tensor
    # p = 0 and evaluation keep PyTorch's path (the input itself, nothing saved).
    x = torch.randn(4, 8, requires_grad=True)
    with CudaEmulation(dtype=None, capability=(9, 0)):
        assert F.dropout(x, p=0.0, training=True) is x
        assert F.dropout(x, p=0.1, training=False) is x


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_cross_entropy_keeps_log_softmax_in_the_logits_dtype(low) -> None:
    # ATen LossNLL.cpp cross_entropy_loss_symint: log_softmax(self, dim, self.scalar_type()),
    # a set dtype that CUDA's fp32_set_opt_dtype policy keeps, then nll_loss on the fp32
    # list. Logits (8, 64): 512 elements, 16-bit log-probs 1024 B, their fp32 copy 2048 B.
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    rec = Recorder(CudaEmulation(dtype=low, capability=(9, 0)))
    x = rec.tensor(8, 64, dtype=low, requires_grad=True)
    with rec, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        target = torch.zeros(8, dtype=torch.long)
        start = len(rec.tracker.events)
        loss = F.cross_entropy(x, target)
        assert loss.dtype == torch.float32
        assert rec.allocs(start)[:2] == [("_log_softmax.default", 1024), ("_to_copy.default", 2048)]
    # Saved: the 16-bit log-probs (LogSoftmaxBackward0), their fp32 copy (NllLossBackward0),
    # the target (8 x int64 = 64 B) and total_weight (4 B): not one fp32 log-softmax (2048 B).
    assert sorted(saved) == [4, 64, 1024, 2048]


def test_grouped_query_attention_flash_saves_kv_at_their_own_heads() -> None:
    # transformers passes enable_gqa=True without a mask. sdp_utils.cpp: flash supports GQA
    # (check_batch_size_and_num_heads_dense<true>), memory-efficient does not (<false>), so an
    # fp32 call goes to math, which repeats K/V. q (2, 8, 128, 64), k/v (2, 2, 128, 64).
    q_bytes, kv_bytes = 2 * 8 * 128 * 64 * 2, 2 * 2 * 128 * 64 * 2  # bf16: 262,144 / 65,536 B

    def saved_and_backend(dtype: torch.dtype) -> tuple[list[tuple[int, ...]], list[int], str]:
        saved: list[tuple[tuple[int, ...], int]] = []
        backends: list[str] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved.append((tuple(t.shape), t.numel() * t.element_size()))
            return t

        with FakeTensorMode():
            q = torch.empty(2, 8, 128, 64, dtype=dtype, requires_grad=True)
            k = torch.empty(2, 2, 128, 64, dtype=dtype, requires_grad=True)
            v = torch.empty(2, 2, 128, 64, dtype=dtype, requires_grad=True)
            emu = CudaEmulation(dtype=None, capability=(9, 0), on_attention=backends.append)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), emu:
                F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return [s for s, _ in saved], [n for _, n in saved], backends[0]

    shapes, sizes, backend = saved_and_backend(torch.bfloat16)
    assert backend == FLASH
    # q, out (query heads), k, v (key/value heads), logsumexp (2, 8, 128) fp32, philox state.
    assert sorted(n for n in sizes if n >= kv_bytes) == [kv_bytes, kv_bytes, q_bytes, q_bytes]
    assert (2, 8, 128, 64) in shapes and shapes.count((2, 2, 128, 64)) == 2
    _, _, backend = saved_and_backend(torch.float32)
    assert backend == MATH
    call = AttentionCall(torch.float32, 64, 64, has_mask=False, dropout_p=0.0, grouped=True)
    assert choose_backend(call, (9, 0)) == MATH
    assert choose_backend(AttentionCall(torch.float32, 64, 64, False, 0.0), (9, 0)) == EFFICIENT
