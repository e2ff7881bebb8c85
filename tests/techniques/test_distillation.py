"""Knowledge distillation (memfit.techniques.distillation.config): the loss is Hinton's KD as TRL
and
torchtune compute it, the chunked and top-k variants agree with it, and the estimate of a
distillation step on a tiny teacher/student pair equals `memfit.measure` of the real step run by
`apply_`, category by category.

What differs between the estimate (CUDA emulated) and a CPU measurement, and is asserted here to
the byte rather than hidden: the cuBLAS workspaces the estimate adds (CUDA only), and, when the
peak is in backward, the loss's backward seed (`ones_like`, one 512-byte block) that the
measurement files as an activation (its phase turns to backward only when an autograd node
runs) and the estimate as a temporary.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit.errors import BadInputError
from memfit.techniques import DistillationConfig
from memfit.techniques.distillation.config import (
    TOPK_IDS,
    TOPK_LOGITS,
    DistillationLoss,
    wrap_forward,
)
from tests.conftest import tiny_gpt2

VOCAB, SEQ, BATCH = 128, 32, 4
#: The teacher: a GPT-2 twice as deep in width (48 vs 32), same vocabulary, dropout off.
TEACHER = {
    "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_embd": 48,
    "n_head": 2, "vocab_size": VOCAB, "n_positions": SEQ, "resid_pdrop": 0.0,
    "embd_pdrop": 0.0, "attn_pdrop": 0.0, "bos_token_id": 0, "eos_token_id": 0,
}  # fmt: skip
#: One 512-byte block: the CUDA caching allocator's rounding.
BLOCK = 512
#: The cuBLAS workspaces the estimate adds (memfit.cuda.overhead): one for the forward thread,
#: one for the autograd engine's.
WORKSPACES = 2 * 8_519_680


def student() -> torch.nn.Module:
    return tiny_gpt2(2, n_embd=32, n_head=2, vocab=VOCAB, n_positions=SEQ)


def teacher() -> torch.nn.Module:
    import transformers

    torch.manual_seed(1)
    cfg = {k: v for k, v in TEACHER.items() if k not in ("model_type", "architectures")}
    return transformers.GPT2LMHeadModel._from_config(
        transformers.GPT2Config(**cfg), attn_implementation="eager"
    )


@pytest.fixture(scope="module")
def teacher_json(tmp_path_factory) -> str:
    path = Path(tmp_path_factory.mktemp("teacher")) / "config.json"
    path.write_text(json.dumps(TEACHER))
    return str(path)


def _ceil(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


def gpt2_parameter_bytes(hidden: int, layers: int, itemsize: int) -> int:
    """A tied GPT-2 LM's parameter storages, each rounded to 512 B, counted by hand: token and
    position embeddings, per block two LayerNorms (weight, bias), c_attn (h x 3h), c_proj
    (h x h), c_fc (h x 4h), mlp.c_proj (4h x h) with their biases, and ln_f."""
    h = hidden
    block = [h, h, h * 3 * h, 3 * h, h * h, h, h, h, h * 4 * h, 4 * h, 4 * h * h, h]
    sizes = [VOCAB * h, SEQ * h] + block * layers + [h, h]
    return sum(_ceil(n * itemsize) for n in sizes)


def _measured(w: memfit.Workload):
    """Two steps of `w` applied by apply_ to the real pair, measured: `memfit.measure()`
    without a model finds the student, then the teacher (called as a model of its own)."""
    s = student()
    setup = memfit.apply_(s, w, teacher=None if w.teacher_top_k else teacher())
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    batch = {"input_ids": ids, "labels": ids.clone()}
    if w.teacher_top_k:
        k = w.teacher_top_k
        batch[TOPK_LOGITS] = torch.randn(BATCH, SEQ, k, generator=g)
        batch[TOPK_IDS] = torch.randint(0, VOCAB, (BATCH, SEQ, k), generator=g)
    with memfit.measure() as m:
        for _ in range(2):
            setup.step(batch)
    assert m.profile is not None
    return m.profile


CASES = {
    "kl": {"teacher_precision": "fp32"},
    "chunked-kl": {"teacher_precision": "fp32", "distill_loss": "chunked-kl"},
    "bf16-teacher": {"teacher_precision": "bf16"},
    "top-k": {"teacher_top_k": 5},
    "top-k-chunked": {"teacher_top_k": 5, "distill_loss": "chunked-kl"},
}


@pytest.mark.parametrize("case", list(CASES))
def test_estimate_equals_measured_step_category_by_category(case, teacher_json):
    w = memfit.Workload(batch_size=BATCH, seq_len=SEQ, attention="eager", optimizer="sgd",
                        teacher=teacher_json, **CASES[case])  # fmt: skip
    est = memfit.estimate(student(), w).profile
    real = _measured(w)
    expected = dict(est.breakdown)
    assert expected.pop("workspaces") == WORKSPACES
    if est.peak_phase == "backward":  # the loss's backward seed (see the module docstring)
        expected["activations"] += BLOCK
        expected["temporaries"] -= BLOCK
    got = dict(real.breakdown)
    assert got.pop("workspaces") == 0
    assert got == expected, case
    assert real.peak_allocated_bytes == est.peak_allocated_bytes - WORKSPACES
    # Parameters by hand: the student's fp32 weights, and the teacher's in its precision.
    teacher_bytes = 0
    if not w.teacher_top_k:
        teacher_bytes = gpt2_parameter_bytes(48, 2, 2 if w.teacher_precision == "bf16" else 4)
    assert got["parameters"] == gpt2_parameter_bytes(32, 2, 4) + teacher_bytes
    # The teacher's weights are parameters of `teacher.*` modules in the estimate.
    filed = sum(_ceil(r.nbytes) for r in est.records.values()
                if r.category == "parameters" and r.module.startswith("teacher"))  # fmt: skip
    assert filed == teacher_bytes


def test_teacher_parameters_by_hand(teacher_json):
    """391,168 B: the student's 128,000 and the fp32 teacher's 263,168, each storage rounded."""
    assert gpt2_parameter_bytes(32, 2, 4) == 128_000
    assert gpt2_parameter_bytes(48, 2, 4) == 263_168
    assert gpt2_parameter_bytes(48, 2, 2) == 135_168


# -- the loss -------------------------------------------------------------------------------


def _reference_kd(s_logits, t_logits, labels, temperature):
    """Hinton's KD term as TRL's generalized_jsd_loss (beta=0) computes it: KL(teacher ||
    student) per position, masked where the next label is -100, mean over positions, T^2."""
    shifted = F.pad(labels, (0, 1), value=-100)[..., 1:]
    mask = shifted != -100
    s = F.log_softmax(s_logits / temperature, -1)
    t = F.log_softmax(t_logits / temperature, -1)
    kl = F.kl_div(s, t, reduction="none", log_target=True).sum(-1)
    return kl[mask].sum() / mask.sum() * temperature**2


def _pair_loss(config: DistillationConfig, s, t, batch):
    wrap_forward(s, config, student=True)
    if config.chunked and t is not None:
        wrap_forward(t, config, student=False)
    loss_fn = DistillationLoss(config, s, t)
    return loss_fn(s(**batch), batch)


@pytest.mark.parametrize("ratio", [1.0, 0.5])
def test_kl_loss_equals_hinton_kd_and_chunked_equals_it(ratio):
    s, t = student(), teacher()
    ids = torch.randint(0, VOCAB, (3, 16), generator=torch.Generator().manual_seed(2))
    labels = ids.clone()
    labels[0, :5] = -100
    batch = {"input_ids": ids, "labels": labels}
    want = _reference_kd(s(input_ids=ids).logits, t(input_ids=ids).logits.detach(), labels, 2.0)
    if ratio < 1:
        want = ratio * want + (1 - ratio) * s(input_ids=ids, labels=labels).loss
    plain = DistillationConfig(teacher="t", precision="fp32", temperature=2.0, kd_ratio=ratio)
    chunked = DistillationConfig(teacher="t", precision="fp32", temperature=2.0,
                                 kd_ratio=ratio, loss="chunked-kl", chunks=5)  # fmt: skip
    s2, t2 = copy.deepcopy(s), copy.deepcopy(t)
    got = _pair_loss(plain, s, t, batch)
    got_chunked = _pair_loss(chunked, s2, t2, batch)
    assert torch.allclose(got, want, rtol=1e-5)
    assert torch.allclose(got_chunked, want, rtol=1e-5)
    got.backward()
    got_chunked.backward()
    for (name, p), q in zip(s.named_parameters(), s2.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-7), name
    assert all(p.grad is None for p in t.parameters())  # the teacher stays frozen


def test_top_k_loss_renormalises_the_teachers_k_logits():
    s = student()
    ids = torch.randint(0, VOCAB, (2, 8))
    k = 4
    t_vals, t_ids = torch.randn(2, 8, k), torch.randint(0, VOCAB, (2, 8, k))
    batch = {"input_ids": ids, TOPK_LOGITS: t_vals, TOPK_IDS: t_ids}
    cfg = DistillationConfig(teacher="t", top_k=k, kd_ratio=1.0)
    got = _pair_loss(cfg, s, None, batch)
    s_lp = F.log_softmax(s(input_ids=ids).logits, -1).gather(-1, t_ids)
    p_t = F.softmax(t_vals, -1)
    want = (p_t * (p_t.log() - s_lp)).sum(-1).mean()  # no labels: every position counts
    assert torch.allclose(got, want, rtol=1e-5)


# -- apply_ and bad input -------------------------------------------------------------------


def test_apply_gives_a_distillation_step_with_a_frozen_teacher(teacher_json):
    w = memfit.Workload(batch_size=2, seq_len=SEQ, teacher=teacher_json, teacher_precision="bf16")
    s, t = student(), teacher()
    setup = memfit.apply_(s, w, teacher=t)
    assert any(x.startswith("distillation from") for x in setup.techniques)
    ids = torch.randint(0, VOCAB, (2, SEQ))
    before = [p.detach().clone() for p in s.parameters()]
    loss = setup.step({"input_ids": ids, "labels": ids})
    assert isinstance(loss, float) and loss > 0
    assert not t.training and all(p.dtype == torch.bfloat16 for p in t.parameters())
    assert all(not p.requires_grad and p.grad is None for p in t.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, s.parameters(), strict=True))


def test_apply_needs_the_teacher_and_refuses_a_stray_one(teacher_json):
    w = memfit.Workload(batch_size=2, seq_len=SEQ, teacher=teacher_json)
    with pytest.raises(BadInputError, match="needs the teacher model"):
        memfit.apply_(student(), w)
    with pytest.raises(BadInputError, match="has no distillation"):
        memfit.apply_(student(), memfit.Workload(), teacher=teacher())
    top_k = memfit.Workload(teacher=teacher_json, teacher_top_k=3)
    with pytest.raises(BadInputError, match="teacher does not run"):
        memfit.apply_(student(), top_k, teacher=teacher())


def test_a_teacher_of_another_vocabulary_is_refused(teacher_json):
    other = tiny_gpt2(2, vocab=VOCAB + 1)
    with pytest.raises(BadInputError, match=r"vocabulary \(129 tokens\) differs"):
        memfit.apply_(student(), memfit.Workload(teacher=teacher_json), teacher=other)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"teacher_top_k": 4}, "no teacher is given"),
        ({"distill_loss": "chunked-kl"}, "no teacher is given"),
        ({"teacher": "gpt2", "mode": "inference"}, "only a training step uses it"),
        ({"teacher": "gpt2", "teacher_top_k": 4, "teacher_quantize": "nf4"}, "does not run"),
        ({"teacher": "gpt2", "chunked_loss": 4}, "distill_loss='chunked-kl'"),
        ({"teacher": "gpt2", "distill_loss": "js"}, "Unknown distill_loss 'js'"),
        ({"teacher": "gpt2", "teacher_precision": "int8"}, "Unknown teacher_precision"),
        ({"teacher": "gpt2", "gpus": 2}, "sharding a teacher"),
    ],
)
def test_workload_refuses_distillation_options_that_do_not_apply(kwargs, message):
    with pytest.raises(BadInputError, match=message):
        memfit.Workload(**kwargs)
