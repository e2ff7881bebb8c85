"""The planner's distillation options (memfit.planner.shapes.distillations) and their cost
terms (memfit.planner.work.teacher_work, memfit.planner.cost), on a tiny GPT-2 pair: a student
of width 32 and a teacher of width 512, two layers each, one vocabulary of 8,192 tokens.

Every figure is counted by hand: the teacher's forward FLOPs in the step, the bytes of its
dequantized NF4 weights and of LLM.int8's activations, the offline logits that come with the
batch. The search itself over these shapes is tested in test_plan_distill_search.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import memfit
from memfit.cuda.target import get_gpu
from memfit.models.sources import resolve_model
from memfit.planner.advice import what_would_fit
from memfit.planner.cost import step_cost
from memfit.planner.plan_text import apply_code
from memfit.planner.results import Candidate
from memfit.planner.shapes import (
    PLAIN,
    PLAN_TEACHER_TOP_K,
    Distillation,
    Shape,
    allowed_techniques,
    distillation_of,
    distillations,
    heavier,
    lean_shapes,
    shapes,
)
from memfit.planner.work import QuantizedLinears, quantized_linears, work_of

VOCAB, SEQ, WIDTH = 8192, 128, 512
GPU = "rtx-4090"


def _gpt2(path: Path, width: int) -> str:
    config = {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2,
        "n_embd": width, "n_head": 2, "vocab_size": VOCAB, "n_positions": SEQ,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "bos_token_id": 0,
        "eos_token_id": 0,
    }  # fmt: skip
    path.write_text(json.dumps(config))
    return str(path)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[str, str]:
    """(student, teacher) config.json paths."""
    folder = tmp_path_factory.mktemp("pair")
    return _gpt2(folder / "student.json", 32), _gpt2(folder / "teacher.json", WIDTH)


def _goal(teacher: str | None, **kw):
    """A goal as the planner's stages read it (the search's Goal carries the teacher too)."""
    return SimpleNamespace(precision=None, optimizer=None, teacher=teacher, **kw)


def _kinds(found: list[Shape]) -> set[Distillation]:
    return {s.distill for s in found}


def test_the_distillation_options_are_searched_with_a_teacher_only(pair):
    student, teacher = pair
    spec, gpu = resolve_model(student), get_gpu(GPU)
    usual = allowed_techniques((), ())
    assert _kinds(shapes(_goal(None), usual, gpu, spec)) == {PLAIN}
    # Quantized teachers and offline logits change the teacher's outputs or the recipe: opt-in.
    assert "quantized-teacher" not in usual and "offline-logits" not in usual
    chunked = Distillation("chunked-kl")
    assert _kinds(shapes(_goal(teacher), usual, gpu, spec)) == {PLAIN, chunked}
    everything = allowed_techniques(("quantized-teacher", "offline-logits"), ())
    top_k = PLAN_TEACHER_TOP_K
    assert distillations(_goal(teacher), everything) == [
        PLAIN, chunked, Distillation("kl", "nf4"), Distillation("kl", "int8"),
        Distillation("kl", None, top_k), Distillation("chunked-kl", None, top_k),
    ]  # fmt: skip
    no_chunks = allowed_techniques(("quantized-teacher",), ("chunked-loss",))
    assert distillations(_goal(teacher), no_chunks) == [
        PLAIN, Distillation("kl", "nf4"), Distillation("kl", "int8"),
    ]  # fmt: skip
    # A teacher precision the goal keeps is a teacher that runs: no offline logits.
    kept = _goal(teacher, teacher_precision="fp32")
    assert distillations(kept, everything, lightest=True) == [Distillation("chunked-kl", "nf4")]
    # Each option is tried on the usual optimizer only; the plain one on every optimizer.
    found = shapes(_goal(teacher), usual, gpu, spec)
    assert {s.optimizer for s in found if not s.distill.plain} == {"adamw"}
    assert {s.optimizer for s in found if s.distill.plain} == {"adamw", "adamw-8bit", "adafactor"}


def test_the_lean_stage_chunks_the_distillation_not_the_cross_entropy(pair):
    student, teacher = pair
    spec, gpu = resolve_model(student), get_gpu(GPU)
    allowed = allowed_techniques(("quantized-teacher",), ())
    lean = lean_shapes(_goal(teacher), allowed, gpu, spec)
    assert {s.chunked_loss for s in lean} == {None}  # a teacher's loss replaces the model's
    assert _kinds(lean) == {Distillation("chunked-kl", "nf4")}
    assert {s.chunked_loss for s in lean_shapes(_goal(None), allowed, gpu, spec)} == {8}


def test_lighter_distillations_order_shapes():
    def shape(d: Distillation) -> Shape:
        return Shape("bf16-mixed", "adamw", "off", False, False, distill=d)

    plain, chunked = shape(PLAIN), shape(Distillation("chunked-kl"))
    nf4, int8 = shape(Distillation("kl", "nf4")), shape(Distillation("kl", "int8"))
    offline = shape(Distillation("kl", None, 256))
    assert heavier(plain, chunked) and not heavier(chunked, plain)
    assert heavier(plain, nf4) and not heavier(nf4, plain)
    assert heavier(plain, offline) and heavier(nf4, offline) and not heavier(offline, plain)
    # LLM.int8's int32 matmul outputs outweigh its lighter weights at large micro-batches.
    assert not heavier(plain, int8) and not heavier(int8, nf4) and not heavier(nf4, int8)


def test_a_shape_gives_the_workload_its_distillation(pair):
    _, teacher = pair
    d = Distillation("chunked-kl", "nf4")
    s = Shape("bf16-mixed", "adamw", "off", False, False, distill=d)
    fields = s.distillation(_goal(teacher))
    assert fields == {"teacher": teacher, "distill_loss": "chunked-kl",
                      "teacher_quantize": "nf4", "teacher_top_k": None}  # fmt: skip
    assert s.distillation(_goal(None)) == {}
    w = memfit.Workload(seq_len=SEQ, precision="bf16-mixed", **fields)
    assert distillation_of(w) == d and distillation_of(memfit.Workload()) == PLAIN


#: The step of every cost test: 3 micro-batches of 2 x 128 tokens.
BATCH, ACCUM = 2, 3
TOKENS = BATCH * SEQ  # per micro-batch
#: The teacher's linears that bitsandbytes quantizes, by hand: per block c_attn (512 x 1536),
#: attn.c_proj (512 x 512), c_fc (512 x 2048) and mlp.c_proj (2048 x 512); the output head is
#: kept (tied to the embedding).
ELEMENTS = 2 * (WIDTH * 1536 + WIDTH * WIDTH + WIDTH * 2048 + 2048 * WIDTH)
INS = 2 * (WIDTH + WIDTH + WIDTH + 2048)
OUTS = 2 * (1536 + WIDTH + 2048 + WIDTH)
#: bitsandbytes NF4 of those 8 weights: 2 elements a byte, one fp32 absmax per block of 64,
#: and a 16-entry fp32 code table each (memfit.techniques.quantize.layouts.bnb_4bit).
NF4_BYTES = ELEMENTS // 2 + ELEMENTS // 64 * 4 + 8 * 16 * 4


def _estimate(pair, **distill) -> memfit.Estimate:
    student, teacher = pair
    w = memfit.Workload(batch_size=BATCH, seq_len=SEQ, grad_accum=ACCUM, precision="bf16-mixed",
                        teacher=teacher, **distill)  # fmt: skip
    return memfit.estimate(student, w, gpu=GPU)


def test_the_teacher_forward_counts_in_the_step(pair):
    student, _ = pair
    plain = work_of(_estimate(pair))
    w = memfit.Workload(batch_size=BATCH, seq_len=SEQ, grad_accum=ACCUM, precision="bf16-mixed")
    alone = work_of(memfit.estimate(student, w, gpu=GPU))
    # By hand, per micro-batch: the quantizable linears (2 x tokens x weights), the output
    # head (2 x tokens x 512 x 8192), and per layer QK^T and AV (2 x 2 x B x S x S x 512).
    teacher = ACCUM * (2 * TOKENS * ELEMENTS + 2 * TOKENS * WIDTH * VOCAB
                       + 2 * 2 * 2 * BATCH * SEQ * SEQ * WIDTH)  # fmt: skip
    assert plain.forward_flops - alone.forward_flops == teacher == 16_508_780_544
    # Offline logits: no teacher in the step, only its top-k logits and ids in the batch.
    offline = work_of(_estimate(pair, teacher_top_k=256))
    assert offline.forward_flops == alone.forward_flops
    assert offline.offline_logits_bytes_per_step == ACCUM * TOKENS * 256 * (4 + 8) == 2_359_296
    gpu = get_gpu(GPU)
    fast, slow = step_cost(offline, gpu, tf32=False), step_cost(plain, gpu, tf32=False)
    assert fast.seconds < slow.seconds
    assert any("offline teacher logits with the batch" in n for n in fast.notes)


def test_a_quantized_teacher_costs_its_dequantization(pair):
    found = quantized_linears(pair[1], "nf4", torch.bfloat16)
    assert found == QuantizedLinears(ELEMENTS, INS, OUTS, NF4_BYTES)
    assert (ELEMENTS, NF4_BYTES) == (6_291_456, 3_539_456)
    plain = work_of(_estimate(pair))
    nf4 = work_of(_estimate(pair, teacher_quantize="nf4"))
    # Each micro-batch's forward reads the packed weights and writes, then reads, bf16 copies.
    assert nf4.dequantized_bytes_per_step == ACCUM * (NF4_BYTES + 2 * 2 * ELEMENTS) == 86_115_840
    assert nf4.forward_flops == plain.forward_flops  # dequantize, then the same matmuls
    gpu = get_gpu(GPU)
    extra = nf4.dequantized_bytes_per_step / gpu.memory_bandwidth_bytes_per_s
    base, quant = step_cost(plain, gpu, tf32=False), step_cost(nf4, gpu, tf32=False)
    assert quant.compute_seconds - base.compute_seconds == pytest.approx(extra, rel=1e-9)
    # LLM.int8: the trace allocates its int8 matmuls' outputs without computing them; the
    # cost adds their FLOPs back (the step's FLOPs are the 16-bit teacher's again) and the
    # bytes of quantizing activations (2 + 1 per input feature) and of the int32 outputs
    # (4 + 4 + 2 per output feature), with the int8 weights read once.
    int8 = work_of(_estimate(pair, teacher_quantize="int8"))
    assert int8.forward_flops == plain.forward_flops
    moved = ELEMENTS + TOKENS * (3 * INS + 10 * OUTS)
    assert int8.dequantized_bytes_per_step == ACCUM * moved == 106_168_320


def test_the_plan_code_and_advice_name_the_distillation(pair):
    student, teacher = pair
    gpu = get_gpu(GPU)

    def candidate(**distill) -> Candidate:
        est = _estimate(pair, **distill)
        return Candidate(workload=est.workload, estimate=est,
                         cost=step_cost(work_of(est), gpu, tf32=False))  # fmt: skip

    code = apply_code(candidate(distill_loss="chunked-kl"), student, GPU)
    assert f"teacher={teacher!r}, distill_loss='chunked-kl'" in code
    assert "memfit.apply_(model, workload, teacher=teacher)" in code
    offline = apply_code(candidate(teacher_top_k=256), student, GPU)
    assert "teacher_top_k=256" in offline and "teacher=teacher)" not in offline
    assert "with the teacher's top-k logits and token ids, computed beforehand" in offline
    tips = what_would_fit(resolve_model(student), SEQ, gpu, candidate(), {"lora"}, 1)
    assert tips[-1] == (
        "Techniques that change the training, if you accept that: --allow pure-precision, "
        "--allow qlora, --allow quantized-teacher, --allow offline-logits."
    )
