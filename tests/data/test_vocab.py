"""memfit.data.vocab: coverage counted by hand on a tiny corpus, savings bytes by hand for a tiny
GPT-2, and a shrunk vocabulary giving the same logits on the ids it keeps."""

from __future__ import annotations

import pytest
import torch

import memfit
from memfit.data import coverage, shrink_vocabulary, vocab_savings
from memfit.errors import BadInputError
from tests.conftest import tiny_gpt2


def test_coverage_by_hand():
    # 100 tokens: id 3 x50, id 0 x30, id 7 x15, id 1 x4, id 9 x1 (ids 2, 4, 5, 6, 8 unused).
    counts = [30, 4, 0, 50, 0, 0, 0, 15, 0, 1]
    cov = coverage(counts, vocab_size=12)
    assert (cov.vocab_size, cov.total_tokens, cov.ids_seen) == (12, 100, 5)
    # 95 tokens need 3 ids (50 + 30 + 15), 99 need 4 (+4), 99.9 (99.9 -> 100) need all 5.
    assert cov.needed == {0.95: 3, 0.99: 4, 0.999: 5}
    assert cov.keep_ids(0.95) == [0, 3, 7] and cov.keep_ids(0.5) == [3]
    # Ties keep the smaller id: two ids of 1 token each, half the tokens -> id 0.
    assert coverage([1, 1]).keep_ids(0.5) == [0]
    with pytest.raises(BadInputError, match="share must be in"):
        cov.ids_for(1.5)
    with pytest.raises(BadInputError, match="approximate tokenizer counts none"):
        coverage([0, 0])


def _untied() -> torch.nn.Module:
    import transformers

    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                                  tie_word_embeddings=False)  # fmt: skip
    return transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation="eager")


def test_savings_by_hand_tied():
    # vocab 100, hidden 32, tied head, no bias; keep 40 -> 60 rows of 32 elements = 1,920.
    w = memfit.Workload(batch_size=2, optimizer="adamw")
    s = vocab_savings(tiny_gpt2(), 40, w, seq_len=16)
    assert (s.removed, s.tied, s.head_bias) == (60, True, False)
    assert (s.parameters, s.gradients, s.optimizer_state) == (7680, 7680, 15360)  # 4, 4, 8 B
    assert s.autocast_copy == 0 and s.persistent == 30720
    assert s.logits_per_copy == 2 * 16 * 60 * 4  # fp32 logits
    mixed = vocab_savings(tiny_gpt2(), 40, w.with_(precision="bf16-mixed"), seq_len=16)
    # fp32 weights; the bf16 copy of the head's 1,920 elements; bf16 logits.
    assert (mixed.parameters, mixed.autocast_copy, mixed.logits_per_copy) == (7680, 3840, 3840)
    true16 = vocab_savings(tiny_gpt2(), 40, w.with_(precision="bf16-true"), seq_len=16)
    assert (true16.parameters, true16.gradients, true16.optimizer_state) == (3840, 3840, 7680)
    lora = vocab_savings(tiny_gpt2(), 40, w.with_(lora=memfit.LoraConfig(rank=4)), seq_len=16)
    assert (lora.parameters, lora.gradients, lora.optimizer_state) == (7680, 0, 0)


def test_savings_by_hand_untied():
    # Embedding and head each lose 60 x 32 = 1,920 elements: 3,840 in all.
    w = memfit.Workload(batch_size=1, optimizer="sgd-momentum")
    s = vocab_savings(_untied(), 40, w, seq_len=8)
    assert not s.tied
    assert (s.parameters, s.gradients, s.optimizer_state) == (15360, 15360, 15360)
    cpu = vocab_savings(_untied(), 40, w.with_(embedding_on_cpu=True), seq_len=8)
    assert cpu.parameters == 7680  # only the head is on the GPU
    inference = vocab_savings(_untied(), 40, memfit.Workload(mode="inference"), seq_len=8)
    assert (inference.gradients, inference.optimizer_state) == (0, 0)


def test_savings_refusals():
    w = memfit.Workload()
    with pytest.raises(BadInputError, match=r"kept=101 must be between 1 and .* \(100 rows\)"):
        vocab_savings(tiny_gpt2(), 101, w, seq_len=8)
    with pytest.raises(BadInputError, match=r"token id 100, and the model has 100 rows"):
        vocab_savings(tiny_gpt2(), 10, w, seq_len=8, highest_id=100)
    with pytest.raises(BadInputError, match=r"optimizer='adafactor' keeps state"):
        vocab_savings(tiny_gpt2(), 10, w.with_(optimizer="adafactor"), seq_len=8)
    with pytest.raises(BadInputError, match="no input embedding memfit can find"):
        vocab_savings(torch.nn.Linear(2, 2), 1, w, seq_len=8)


@pytest.mark.parametrize("build", [tiny_gpt2, _untied])
def test_shrunk_model_keeps_the_logits_of_kept_ids(build):
    model = build().eval()
    keep = [0, 5, 7, 42, 99, 63]
    ids = torch.tensor([[5, 42, 99, 0, 7, 63]])  # (B, S), only kept ids
    with torch.no_grad():
        before = model(ids).logits  # (1, 6, 100)
    old_to_new = shrink_vocabulary(model, keep)
    assert old_to_new[[0, 5, 7, 42, 63, 99]].tolist() == [0, 1, 2, 3, 4, 5]
    assert int((old_to_new >= 0).sum()) == 6 and int(old_to_new[1]) == -1
    assert model.config.vocab_size == 6 and model.get_input_embeddings().num_embeddings == 6
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert tied == (build is tiny_gpt2)
    with torch.no_grad():
        after = model(old_to_new[ids]).logits  # (1, 6, 6)
    torch.testing.assert_close(after, before[..., sorted(keep)])
    loss = model(old_to_new[ids], labels=old_to_new[ids]).loss
    loss.backward()  # the shrunk model trains


def test_shrink_refusals():
    with pytest.raises(BadInputError, match=r"keep_ids holds 100, outside .* 0\.\.99"):
        shrink_vocabulary(tiny_gpt2(), [1, 100])
    with pytest.raises(BadInputError, match="keep_ids is empty"):
        shrink_vocabulary(tiny_gpt2(), [])
