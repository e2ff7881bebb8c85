"""One answer per real run, whatever the transformers version (DESIGN.md, "The user's stack").

transformers < 5.18 `generate` passes its all-ones (B, P) attention mask to every model call;
5.18 drops it. On the device both skip the causal mask (masking_utils `_ignore_causal_mask_sdpa`
reads the real mask and finds no padding): the prefill runs the flash kernel with
`is_causal=True` and grouped K/V, each decode step the flash kernel without a mask. On fake
tensors `is_tracing` counts a FakeTensor, so before generation_oracle.device_mask_checks the
5.17 trace built a bool (B, 1, P, P) mask and ran the memory-efficient kernel with K/V repeated.

The same workload must therefore trace to the same bytes on both stacks, except for what the
real runs really hold differently: 5.17's (B, P) int64 mask itself, B * P * 8 bytes, alive
from generate's setup to the end. This test runs on every stack of the compatibility matrix.
"""

from __future__ import annotations

import pytest

import memfit
import memfit.estimator.trace.cuda_emulation as ce
from memfit._compat import generate_keeps_all_ones_mask
from memfit.estimator.generation.figures import trace_generation_once
from memfit.estimator.trace.attention import FLASH
from memfit.models.sources import resolve_model
from memfit.profile import MemoryProfile

#: llama-3.2-1b (hidden 2048, MLP 8192, 32 query heads sharing 8 KV heads of 64, vocab 128256,
#: tied embeddings), 2 of its layers, bf16, one 2048-token prompt, 3 new tokens.
B, P, N, LAYERS = 1, 2048, 3, 2
MiB = 2**20


def _expected_peak() -> int:
    """The prefill's peak, by hand: layer 1's MLP computing act(gate) * up.

    parameters: embeddings 128256 * 2048 + 2 layers of (q, o: 2048 * 2048; k, v: 2048 * 512;
        gate, up, down: 2048 * 8192; 2 norms of 2048) + the final norm 2048, all bf16.
    buffers: the rotary inv_freq (32 fp32) and its original copy, a 512-byte block each.
    inputs: the prompt ids, the position ids and their clone, (1, 2048) int64 = 16 KiB each;
        on transformers < 5.18 also generate's all-ones attention mask, (1, 2048) int64.
    kv_cache: 2 layers of K and V, (1, 8, 2048, 64) bf16 = 2 MiB each.
    temporaries: silu(gate), up and their product, (1, 2048, 8192) bf16 = 32 MiB each; the
        embeddings, layer 0's output, layer 1's residual after attention and its normed
        input to the MLP, (1, 2048, 2048) bf16 = 8 MiB each; the rotary cos and sin,
        (1, 2048, 64) bf16 = 256 KiB each; three 0-dim scalars, a 512-byte block each.
    """
    layer = 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192 + 2 * 2048
    parameters = (128256 * 2048 + LAYERS * layer + 2048) * 2
    assert parameters == 768_626_688
    buffers = 2 * 512
    inputs = (4 if generate_keeps_all_ones_mask() else 3) * P * 8
    kv = LAYERS * 2 * 2 * MiB
    temporaries = 3 * 32 * MiB + 4 * 8 * MiB + 2 * 256 * 1024 + 3 * 512
    return parameters + buffers + inputs + kv + temporaries


def test_generation_traces_the_device_run_on_every_stack(monkeypatch) -> None:
    calls: list[tuple[str, bool, bool, bool]] = []
    run_sdpa = ce.run_sdpa

    def spy(backend, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
            scale=None, enable_gqa=False):  # fmt: skip
        calls.append((backend, attn_mask is None, is_causal, enable_gqa))
        return run_sdpa(backend, query, key, value, attn_mask, dropout_p, is_causal, scale,
                        enable_gqa)  # fmt: skip

    monkeypatch.setattr(ce, "run_sdpa", spy)
    w = memfit.Workload(
        mode="generate", batch_size=B, prompt_len=P, new_tokens=N, precision="bf16-true"
    )
    trace = trace_generation_once(
        resolve_model("llama-3.2-1b"), w, None, num_layers=LAYERS, new_tokens=N
    ).trace
    # The prefill: flash, no mask, causal, grouped K/V; then each decode step: flash, no mask.
    prefill = [(FLASH, True, True, True)] * LAYERS
    decode = [(FLASH, True, False, True)] * LAYERS * (N - 1)
    assert calls == prefill + decode
    profile = MemoryProfile.from_events(trace.records, trace.events)
    assert (profile.peak_phase, profile.peak_step, profile.peak_op) == ("forward", 0, "mul.Tensor")
    assert profile.peak_module == "model.layers.1.mlp"
    assert profile.peak_allocated_bytes == _expected_peak()
    assert _expected_peak() == 911_809_024 + (P * 8 if generate_keeps_all_ones_mask() else 0)


@pytest.mark.parametrize("name", ["is_tracing", "fast_all"])
def test_mask_checks_are_restored_after_the_trace(name: str) -> None:
    import transformers.masking_utils as mu

    from memfit.estimator.generation.oracle import device_mask_checks

    before = getattr(mu, name)
    with device_mask_checks():
        inside = getattr(mu, name)
    assert getattr(mu, name) is before
    assert (inside is not before) == generate_keeps_all_ones_mask()


def test_generation_before_stopcheck_is_refused_by_name(monkeypatch) -> None:
    # transformers < 5.17 has no generation.utils.StopCheck, whose stopping decision the
    # trace answers: the estimate refuses with the versions and the fix, before tracing.
    import transformers.generation.utils as gu

    from memfit.errors import BadInputError

    monkeypatch.delattr(gu, "StopCheck")
    w = memfit.Workload(mode="generate", batch_size=1, prompt_len=8, new_tokens=2)
    with pytest.raises(BadInputError) as err:
        memfit.estimate("llama-3.2-1b", w)
    message = str(err.value)
    assert message.startswith("generation needs transformers >= 5.17; installed ")
    assert "pip install -U 'transformers>=5.17'" in message
