"""The chunked cross-entropy (memfit.techniques.chunked_loss) computes the model's own loss and
gradients, and lowers measured memory by what the estimate predicts."""

from __future__ import annotations

import copy

import pytest
import torch

import memfit
from memfit.errors import BadInputError
from memfit.techniques import ChunkedLossConfig
from memfit.techniques.chunked_loss import chunk_loss_forward
from tests.conftest import tiny_gpt2

#: float32: the chunked sum and the model's mean round differently; measured differences are
#: ~1e-7 relative (loss) and ~2e-7 of each gradient's largest element.
RTOL = 1e-6


def tiny_llama(vocab: int = 500) -> torch.nn.Module:
    import transformers

    cfg = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=vocab,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="eager")


@pytest.mark.parametrize(
    "make", [lambda: tiny_gpt2(2, vocab=500), tiny_llama], ids=["gpt2", "llama"]
)
@pytest.mark.parametrize("num_items", [None, 37])
def test_loss_and_gradients_equal_the_models_own(make, num_items):
    plain = make()
    chunked = copy.deepcopy(plain)
    chunk_loss_forward(chunked, ChunkedLossConfig(chunks=5))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 500, (3, 16), generator=g)
    labels = ids.clone()
    labels[0, :5] = -100  # ignored tokens are left out of sum and count
    extra = {} if num_items is None else {"num_items_in_batch": torch.tensor(num_items)}
    want = plain(input_ids=ids, labels=labels, **extra).loss
    got = chunked(input_ids=ids, labels=labels, **extra).loss
    want.backward()
    got.backward()
    assert abs(got.item() - want.item()) <= RTOL * abs(want.item())
    for (name, p), q in zip(plain.named_parameters(), chunked.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        assert (p.grad - q.grad).abs().max() <= RTOL * p.grad.abs().max(), name


def test_without_labels_the_model_runs_as_before():
    model = tiny_gpt2(2, vocab=500)
    ids = torch.randint(0, 500, (2, 8))
    want = model(input_ids=ids).logits
    chunk_loss_forward(model, ChunkedLossConfig(chunks=4))
    assert torch.equal(model(input_ids=ids).logits, want)


def test_a_model_that_is_not_a_causal_lm_is_refused():
    with pytest.raises(BadInputError, match="Sequential has none"):
        chunk_loss_forward(torch.nn.Sequential(torch.nn.Linear(2, 2)), ChunkedLossConfig())
    import transformers

    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100)
    masked = transformers.BertForMaskedLM(transformers.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        vocab_size=100))  # fmt: skip
    with pytest.raises(BadInputError, match="BertForMaskedLM is not a causal LM"):
        chunk_loss_forward(masked, ChunkedLossConfig())
    del cfg


def test_chunks_must_be_two_or_more():
    with pytest.raises(BadInputError, match="chunks must be an integer >= 2"):
        ChunkedLossConfig(chunks=1)


# -- memory -------------------------------------------------------------------------------

#: A tiny GPT-2 with a big vocabulary, so the float32 logits dominate the step.
VOCAB, SEQ, BATCH, HIDDEN = 4096, 64, 8, 64
BASE = memfit.Workload(batch_size=BATCH, seq_len=SEQ, attention="eager", optimizer="adamw")


def big_vocab_gpt2() -> torch.nn.Module:
    return tiny_gpt2(2, n_embd=HIDDEN, n_head=4, vocab=VOCAB, n_positions=SEQ)


def measured_peak(w: memfit.Workload) -> int:
    model = big_vocab_gpt2()
    setup = memfit.apply_(model, w)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    with memfit.measure(model, setup.optimizer) as m:
        for _ in range(2):
            setup.step({"input_ids": ids, "labels": ids.clone()})
    assert m.profile is not None
    return m.profile.peak_allocated_bytes


def test_measured_drop_matches_estimated_drop():
    chunked = BASE.with_(chunked_loss=8)
    estimated = [memfit.estimate(big_vocab_gpt2(), w) for w in (BASE, chunked)]
    measured_drop = measured_peak(BASE) - measured_peak(chunked)
    estimated_drop = (
        estimated[0].profile.peak_allocated_bytes - estimated[1].profile.peak_allocated_bytes
    )
    # One (B*S, V) float32 logits tensor is 8 MiB; several of them go.
    assert estimated_drop > 2 * BATCH * SEQ * VOCAB * 4
    assert abs(measured_drop - estimated_drop) <= 0.05 * estimated_drop, (
        measured_drop, estimated_drop,
    )  # fmt: skip
    # The head's matmul runs again in backward, chunk by chunk: 2 * tokens * hidden * vocab.
    assert estimated[1].flops["recompute"] == 2 * BATCH * SEQ * HIDDEN * VOCAB
    assert "recompute" not in estimated[0].flops


def test_apply_from_a_workload_wraps_the_forward():
    model = big_vocab_gpt2()
    setup = memfit.apply_(model, BASE.with_(chunked_loss=4))
    assert "chunked loss (4 chunks)" in setup.techniques
    ids = torch.randint(0, VOCAB, (2, SEQ))
    out = model(input_ids=ids, labels=ids)
    assert out.logits is None and out.loss.dim() == 0


def test_a_peft_model_gets_the_chunked_loss_inside():
    peft = pytest.importorskip("peft")
    plain = tiny_gpt2(2, vocab=500)
    lora = peft.get_peft_model(
        copy.deepcopy(plain), peft.LoraConfig(r=4, target_modules=["c_attn"])
    )
    chunk_loss_forward(lora, ChunkedLossConfig(chunks=3))
    ids = torch.randint(0, 500, (2, 8))
    out = lora(input_ids=ids, labels=ids)
    assert out.logits is None  # the chunked forward ran
    want = plain(input_ids=ids, labels=ids).loss  # LoRA's B is zero: the same function
    assert abs(out.loss.item() - want.item()) <= RTOL * want.item()
