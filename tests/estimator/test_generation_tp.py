"""mode="generate" with tp > 1: rank 0 of a model sharded by transformers' own tensor-parallel
plan over the fake process group (memfit.techniques.parallel.tensor_parallel).

Per-rank weights and KV bytes are computed by hand, tensor by tensor; a real `generate` of the
same sharded model on 2 CPU processes (gloo) under memfit.measure equals the estimate.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

import memfit
from memfit.cuda.allocator_config import cuda_block_size
from memfit.errors import BadInputError
from memfit.estimator.generation.figures import CALL_END_OP, trace_generation, trace_generation_once
from memfit.events import Category
from memfit.models.sources import resolve_model
from memfit.profile import MemoryProfile
from tests.conftest import tiny_gpt2

B, P, N = 2, 8, 6
F32 = 4


def tiny_llama(*, tie: bool = False) -> torch.nn.Module:
    """2 layers, hidden 64, 4 query heads sharing 2 KV heads of 16, MLP 128, vocab 128."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=tie,
    )  # fmt: skip
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="eager").eval()


def _workload(tp: int, beams: int = 1, cache: str = "dynamic") -> memfit.Workload:
    return memfit.Workload(
        mode="generate", batch_size=B, prompt_len=P, new_tokens=N, num_beams=beams,
        cache=cache, attention="eager", tp=tp,
    )  # fmt: skip


def _parameter_bytes_by_module(records: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records.values():
        if r.category == Category.PARAMETERS and not r.host:
            out[r.module] = out.get(r.module, 0) + r.nbytes
    return out


def _rank0_weights_by_hand(tie: bool) -> dict[str, int]:
    """Rank 0 of 2, fp32: the bytes of each module's parameter storages."""
    rows = lambda n: n // 2  # noqa: E731  (a Shard(0)/Shard(1) half)
    per = {
        "model.embed_tokens": rows(128) * 64 * F32,  # embedding_rowwise: half the vocabulary
        "self_attn.q_proj": rows(64) * 64 * F32,  # colwise: 2 of 4 heads of 16
        "self_attn.k_proj": rows(32) * 64 * F32,  # colwise: 1 of 2 KV heads of 16
        "self_attn.v_proj": rows(32) * 64 * F32,
        "self_attn.o_proj": 64 * rows(64) * F32,  # rowwise: half the input features
        "mlp.gate_proj": rows(128) * 64 * F32,
        "mlp.up_proj": rows(128) * 64 * F32,
        "mlp.down_proj": 64 * rows(128) * F32,
        "input_layernorm": 64 * F32,  # not in the plan: replicated
        "post_attention_layernorm": 64 * F32,
    }
    out = {"model.embed_tokens": per["model.embed_tokens"], "model.norm": 64 * F32}
    for layer in range(2):
        for name, nbytes in per.items():
            if name != "model.embed_tokens":
                out[f"model.layers.{layer}.{name}"] = nbytes
    if not tie:
        out["lm_head"] = rows(128) * 64 * F32  # colwise_gather_output: half the vocabulary
    return out


@pytest.mark.parametrize("tie", [False, True])
def test_rank_weights_and_kv_by_hand(tie: bool) -> None:
    traced = trace_generation_once(
        resolve_model(tiny_llama(tie=tie)), _workload(2), None, num_layers=None, new_tokens=N
    )
    by_module = _parameter_bytes_by_module(traced.trace.records)
    if tie:  # sharded once, tied again: the one storage is filed under its last holder
        by_module["model.embed_tokens"] = by_module.pop("lm_head")
    assert by_module == _rank0_weights_by_hand(tie)
    # Each storage as the CUDA allocator rounds it (512 B): the 5 norms of 256 B take 512.
    rounded = sum(cuda_block_size(b) for b in by_module.values())
    assert rounded == (182_784 if not tie else 166_400)
    est = memfit.estimate(tiny_llama(tie=tie), _workload(2))
    # 2 (K and V) x 2 layers x 1 KV head of 2 per rank x head_dim 16 x (P + N - 1) positions
    # x batch 2 x 4 bytes.
    assert est.generation.kv_bytes_by_layer == [2 * 1 * 16 * (P + N - 1) * B * F32] * 2
    assert est.generation.kv_cache_bytes == 2 * 2 * 1 * 16 * (P + N - 1) * B * F32
    assert est.parameter_count == memfit.estimate(tiny_llama(tie=tie), _workload(1)).parameter_count
    assert any("tensor parallel over 2 GPUs" in n for n in est.notes)


@pytest.mark.parametrize(("beams", "cache"), [(3, "dynamic"), (1, "static"), (3, "static")])
def test_kv_cache_is_halved_with_beams_and_static_caches(beams: int, cache: str) -> None:
    one = memfit.estimate(tiny_llama(), _workload(1, beams, cache)).generation
    two = memfit.estimate(tiny_llama(), _workload(2, beams, cache)).generation
    assert two.kv_cache_bytes * 2 == one.kv_cache_bytes
    assert two.kv_cache_bytes == 2 * 2 * 1 * 16 * (P + N - 1) * B * beams * F32


def test_catalog_model_rank_by_hand_with_replay() -> None:
    # llama-3.1-8b, bf16, tp=2: 32 layers, 32 query heads and 8 KV heads of 128 (4 per rank),
    # hidden 4096, MLP 14336, vocabulary 128256 (64128 rows per rank).
    w = memfit.Workload(mode="generate", prompt_len=64, new_tokens=4, precision="bf16-true", tp=2)
    trace, blocks, replayed = trace_generation(resolve_model("llama-3.1-8b"), w, None)
    assert replayed and blocks == 32
    h, kv, ff, vocab, bf16 = 4096, 8 * 128, 14336, 128256, 2
    layer = (h * h // 2 + 2 * (kv // 2) * h + h * h // 2 + 3 * (ff // 2) * h + 2 * h) * bf16
    weights = 2 * (vocab // 2) * h * bf16 + 32 * layer + h * bf16
    assert sum(_parameter_bytes_by_module(trace.records).values()) == weights
    est = memfit.estimate("llama-3.1-8b", w, gpu="rtx-4090")
    assert est.generation.kv_cache_bytes == 2 * 32 * 4 * 128 * (64 + 4 - 1) * 1 * 1 * bf16
    assert est.parameter_count == 8_030_261_248  # the model's, not the rank's


def test_bad_inputs_name_the_value_and_the_fix() -> None:
    with pytest.raises(BadInputError, match=r"tp=3 does not divide the model's 8 KV heads"):
        memfit.estimate("llama-3.1-8b", memfit.Workload(mode="generate", prompt_len=8, tp=3))
    with pytest.raises(BadInputError, match=r"tp=4 does not divide the model's 2 KV heads"):
        memfit.estimate(tiny_llama(), _workload(4))
    with pytest.raises(BadInputError, match="GPT2LMHeadModel has no tensor-parallel plan"):
        memfit.estimate(tiny_gpt2(), _workload(2))
    with pytest.raises(BadInputError, match=r"quantize='nf4' with tp=2: .* Use tp=1"):
        memfit.estimate(tiny_llama(), _workload(2).with_(quantize="nf4"))
    with pytest.raises(BadInputError, match="only mode='generate' uses it"):
        memfit.Workload(mode="inference", tp=2)


def test_cli_tp_that_does_not_divide_the_kv_heads_exits_2() -> None:
    from typer.testing import CliRunner

    from memfit.cli.app import app

    r = CliRunner().invoke(app, ["estimate", "llama-3.1-8b", "--mode", "generate",
                                 "--prompt-len", "64", "--tp", "3"])  # fmt: skip
    assert r.exit_code == 2
    assert "--tp 3 does not divide the model's 8 KV heads" in r.output  # the CLI's spelling
    assert "Use tp in [1, 2, 4, 8]" in r.output


# -- real tensors -----------------------------------------------------------------------------


def _measured(beams: int, cache: str) -> MemoryProfile:
    """A real generate of the tiny llama sharded as transformers shards it, rank 0 of 2 over
    memfit's fake process group (real tensors and kernels; the collectives allocate their
    outputs and move nothing), under memfit.measure."""
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism

    from memfit.estimator.trace.fake_distributed import fake_world
    from memfit.techniques.parallel.tensor_parallel import tp_plan_of

    with fake_world(2) as mesh:
        model = tiny_llama()
        apply_tensor_parallelism(model, mesh, tp_plan_of(model, 2))
        ids = torch.randint(0, 128, (B, P))
        kwargs = {"max_new_tokens": N, "do_sample": False, "num_beams": beams}
        if cache == "static":
            kwargs["cache_implementation"] = "static"
        with memfit.measure(model) as m, torch.no_grad():
            generated = model.generate(ids, **kwargs)
    assert generated.shape == (B, P + N) and m.profile is not None
    return m.profile


@pytest.mark.parametrize(("beams", "cache"), [(1, "dynamic"), (3, "static")])
def test_estimate_equals_a_real_tensor_parallel_generate(beams: int, cache: str) -> None:
    real = _measured(beams, cache)
    w = _workload(2, beams, cache)
    traced = trace_generation_once(resolve_model(tiny_llama()), w, None, num_layers=None,
                                   new_tokens=N)  # fmt: skip
    est = MemoryProfile.from_events(traced.trace.records, traced.trace.events)
    prompt_ids = cuda_block_size(B * P * 8)  # made before the measured block (as with tp=1)
    expected = dict(
        real.breakdown,
        inputs=real.breakdown["inputs"] + prompt_ids,
        temporaries=real.breakdown["temporaries"] - prompt_ids,
    )
    assert est.breakdown == expected
    assert est.peak_allocated_bytes == real.peak_allocated_bytes
    est_timeline = [
        b for b, ev in zip(est.timeline, est.events, strict=True) if ev.op != CALL_END_OP
    ]
    seen = next(i for i, ev in enumerate(real.events) if ev.phase == "forward")
    assert len(est_timeline) == len(real.timeline)
    assert est_timeline[seen:] == real.timeline[seen:]


def _gloo_rank(rank: int, store: str, out: str) -> None:
    """Rank `rank` of 2 real processes (gloo): the tiny llama sharded as transformers shards
    it, a greedy generate under memfit.measure; rank 0 saves its profile."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism

    from memfit.techniques.parallel.tensor_parallel import tp_plan_of

    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"file://{store}")
    try:
        mesh = init_device_mesh("cpu", (2,))
        model = tiny_llama()
        apply_tensor_parallelism(model, mesh, tp_plan_of(model, 2))
        ids = torch.randint(0, 128, (B, P))
        with memfit.measure(model) as m, torch.no_grad():
            model.generate(ids, max_new_tokens=N, do_sample=False)
        if rank == 0:
            torch.save(m.profile, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_real_processes_hold_the_estimated_weights_and_cache() -> None:
    """On 2 processes with gloo, rank 0 holds the estimated weights and KV cache exactly. The
    temporaries are not compared: gloo's worker thread may keep a collective's tensor alive a
    few ops longer, which run varies (the fake process group above has no thread)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rank0.pt")
        mp.spawn(_gloo_rank, args=(os.path.join(d, "store"), out), nprocs=2)
        real: MemoryProfile = torch.load(out, weights_only=False)
    est = memfit.estimate(tiny_llama(), _workload(2))
    assert real.breakdown["parameters"] == 182_784  # the hand figure above
    assert real.breakdown["kv_cache"] == est.profile.breakdown["kv_cache"]
    assert real.breakdown["parameters"] == est.profile.breakdown["parameters"]
