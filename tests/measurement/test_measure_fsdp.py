"""`apply_` with FSDP2 over two CPU processes (gloo), measured with `memfit.measure`: each rank
holds its shard of the parameters and of the optimizer state, to the byte; and memfit's
estimate for 2 GPUs (FSDP2 traced over a fake process group) gives rank 0's peak, in fp32 and
in bf16-mixed, which with several GPUs means FSDP2's MixedPrecisionPolicy (bf16 all-gathers and
compute, fp32 gradient reduction and shards, no autocast)."""

from __future__ import annotations

import json
import math
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import transformers

from memfit.cuda.allocator_config import cuda_block_size

WORLD = 2


def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation="eager")


def _worker(rank: int, port: int, out: str, precision: str) -> None:
    import torch.distributed as dist

    import memfit
    import memfit.techniques
    from memfit.techniques import FSDPConfig

    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD, init_method=f"tcp://127.0.0.1:{port}"
    )
    try:
        model = gpt2()
        w = memfit.Workload(batch_size=4, seq_len=32, gpus=WORLD, precision=precision)
        setup = memfit.apply_(model, w)
        assert any(isinstance(c, FSDPConfig) for c in memfit.techniques.configs_from_workload(w))
        assert setup.autocast_dtype is None  # FSDP2 casts; no autocast over it
        ids = torch.randint(0, 64, (4, 32), generator=torch.Generator().manual_seed(rank))
        with memfit.measure(model, setup.optimizer) as m:
            for _ in range(2):
                setup.step({"input_ids": ids, "labels": ids.clone()})
        assert m.profile is not None
        result = dict(m.profile.breakdown, peak=m.profile.peak_allocated_bytes)
        Path(out, f"{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _spawn(tmp_path_factory, precision: str) -> Path:
    out = tmp_path_factory.mktemp("fsdp")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, str(out), precision), nprocs=WORLD)
    return out


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    """Two fp32 ranks trained and measured once for the tests below: one JSON per rank."""
    return _spawn(tmp_path_factory, "fp32")


@pytest.fixture(scope="module")
def measured_bf16(tmp_path_factory) -> Path:
    """The same two ranks in bf16-mixed (FSDP2's MixedPrecisionPolicy)."""
    return _spawn(tmp_path_factory, "bf16-mixed")


def test_fsdp2_ranks_hold_their_shards(measured):
    tmp_path = measured
    params = list(gpt2().parameters())  # GPT-2 ties wte and lm_head: counted once
    # FSDP2 shards each parameter on dim 0 in WORLD chunks, padded to the first chunk's size.
    shard = sum(
        cuda_block_size(math.ceil(p.shape[0] / WORLD) * (p.numel() // p.shape[0]) * 4)
        for p in params
    )
    for rank in range(WORLD):
        got = json.loads(Path(tmp_path, f"{rank}.json").read_text())
        if rank == 0:  # the first chunk is full; the last rank's may be shorter
            assert got["parameters"] == shard
        assert got["parameters"] <= shard
        # AdamW: two moments per shard, plus a step counter per parameter (a tensor on CPU).
        assert got["optimizer_state"] == 2 * got["parameters"] + 512 * len(params)


#: Runs of the two gloo ranks measured for the peak at most: a real run's peak is not always
#: the same. Once in about ten loaded test-suite runs, rank 0's bf16-mixed peak came out
#: 6,144 B higher (862,208 B against 856,064 B), though every tensor is the same. gloo's
#: worker thread sometimes releases its buffers after the next allocation, so the same
#: program peaks a little higher. The estimate must equal one of the runs, to the byte.
PEAK_RUNS = 2


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_estimate_for_two_gpus_equals_a_measured_rank(precision, request, tmp_path_factory):
    import memfit

    measured = request.getfixturevalue("measured" if precision == "fp32" else "measured_bf16")
    got = json.loads(Path(measured, "0.json").read_text())
    w = memfit.Workload(
        batch_size=4, seq_len=32, attention="eager", gpus=WORLD, precision=precision
    )
    est = memfit.estimate(gpt2(), w).profile
    n_params = len(list(gpt2().parameters()))
    # On CUDA, foreach AdamW's step counters are host memory (left out of the estimate); on
    # the CPU they are 512-byte tensors like the rest. The estimate adds the cuBLAS workspace.
    counters = 512 * n_params
    assert got["parameters"] == est.breakdown["parameters"]
    assert got["optimizer_state"] - counters == est.breakdown["optimizer_state"]
    want = est.peak_allocated_bytes - est.breakdown["workspaces"]
    peaks = [got["peak"] - counters]
    while peaks[-1] != want and len(peaks) < PEAK_RUNS:
        again = json.loads(Path(_spawn(tmp_path_factory, precision), "0.json").read_text())
        peaks.append(again["peak"] - counters)
    assert want in peaks, (want, peaks)


def test_fsdp_estimate_replays_repeated_blocks():
    """Under FSDP2 the optimizer's foreach ops read DTensors; their owner (the block) is found
    through the local shard, so 3 traced blocks replay to N and match a full trace."""
    import memfit
    from memfit.estimator.estimation import trace_spec
    from memfit.estimator.trace.step_runner import run_trace
    from memfit.models.sources import resolve_model
    from memfit.profile import MemoryProfile

    spec = resolve_model("llama-3.2-1b")
    w = memfit.Workload(seq_len=128, precision="bf16-mixed", gpus=4)
    replayed, n, was = trace_spec(spec, w, (9, 0), verify=False)
    assert was and n == 16
    full = run_trace(spec, w, (9, 0))
    a = MemoryProfile.from_events(replayed.records, replayed.events)
    b = MemoryProfile.from_events(full.records, full.events)
    assert a.peak_allocated_bytes == b.peak_allocated_bytes
    assert a.breakdown == b.breakdown
