"""FSDP2's mixed precision as accelerate (and the HF Trainer) runs it, `fsdp_mixed="accelerate"`,
against the MixedPrecisionPolicy FSDP2 users write (`"policy"`): a 16-bit gradient reduction cast
to the fp32 shards afterwards, and CUDA's autocast over the forward (ops on its fp32 list, such
as GPT-2's GELU `pow`, run in fp32)."""

from __future__ import annotations

from collections import Counter

import pytest

import memfit
from memfit.techniques import FSDPConfig
from memfit.techniques.parallel.fsdp import fsdp_config_of
from tests.measurement.test_measure_fsdp import gpt2

TOKENS, INNER, LAYERS = 4 * 32, 4 * 32, 2  # batch 4 x 32 tokens; GPT-2's MLP is 4 x n_embd


def _step1(mixed: str) -> Counter:
    w = memfit.Workload(batch_size=4, seq_len=32, attention="eager", gpus=2,
                        precision="bf16-mixed", fsdp_mixed=mixed)  # fmt: skip
    out: Counter = Counter()
    for r in memfit.estimate(gpt2(), w).profile.records.values():
        if r.step == 1:
            out[(r.phase, r.op, str(r.category))] += r.nbytes
    return out


@pytest.fixture(scope="module")
def steps() -> dict[str, Counter]:
    return {m: _step1(m) for m in ("policy", "accelerate")}


def test_autocast_runs_over_the_forward_with_accelerate(steps):
    pow_op = ("forward", "pow.Tensor_Scalar", "temporaries")
    assert steps["policy"][pow_op] == LAYERS * TOKENS * INNER * 2  # bf16, as gathered
    assert steps["accelerate"][pow_op] == LAYERS * TOKENS * INNER * 4  # CUDA autocast: fp32


def test_gradients_are_reduced_in_16_bits_then_cast_to_the_shards(steps):
    grads = {m: {k: v for k, v in c.items() if k[2] == "gradients"} for m, c in steps.items()}
    # The same fp32 shard gradients: the reduce-scatter writes them (policy) or its bf16
    # output is cast to them (accelerate).
    assert sum(grads["policy"].values()) == sum(grads["accelerate"].values()) > 0
    assert set(grads["policy"]) == {("backward", "empty.memory_format", "gradients")}
    assert set(grads["accelerate"]) == {("backward", "_to_copy.default", "gradients")}


def test_the_config_follows_the_workload():
    w = memfit.Workload(gpus=4, precision="fp16-mixed", fsdp_mixed="accelerate")
    assert fsdp_config_of(w) == FSDPConfig(world_size=4, param_dtype="float16",
                                           reduce_dtype="float16")  # fmt: skip
    assert "accelerate's" in fsdp_config_of(w).label
    policy = fsdp_config_of(w.with_(fsdp_mixed="policy"))
    assert (policy.param_dtype, policy.reduce_dtype) == ("float16", None)
    with pytest.raises(memfit.BadInputError, match="needs param_dtype"):
        FSDPConfig(reduce_dtype="bfloat16")
