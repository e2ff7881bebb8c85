"""The "to use it" code a plan prints builds the workload the plan estimated (issue: it printed
offload_activations=True for the planner's torchtune offload, which Workload reads as
"save_on_cpu": another technique than the one estimated)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

import memfit
from memfit.planner.plan_text import apply_code

WORKLOADS = [
    dict(batch_size=16, grad_accum=1, seq_len=2048, precision="bf16-mixed",
         optimizer="paged-adamw", checkpointing="blocks", chunked_loss=8,
         optimizer_in_backward=True, offload_activations="torchtune"),
    dict(batch_size=2, grad_accum=8, seq_len=512, precision="fp16-mixed", optimizer="adamw",
         offload_activations="save_on_cpu", offload_optimizer=True),
    dict(batch_size=1, grad_accum=4, seq_len=1024, precision="bf16-true", optimizer="adafactor",
         tie_embeddings=True),
    dict(batch_size=8, grad_accum=1, seq_len=128, precision="fp32", optimizer="sgd",
         embedding_on_cpu=True),
    dict(batch_size=4, grad_accum=2, seq_len=256, precision="bf16-mixed", optimizer="adamw",
         fsdp_cpu_offload=True, gpus=2),
]  # fmt: skip


@pytest.mark.parametrize("fields", WORKLOADS)
def test_the_printed_workload_is_the_planned_one(fields):
    w = memfit.Workload(**fields)
    code = apply_code(SimpleNamespace(workload=w), "gpt2", "a100-80gb")  # type: ignore[arg-type]
    line = re.search(r"^workload = (memfit\.Workload\(.*\))$", code, re.M)
    assert line is not None, code
    assert eval(line.group(1), {"memfit": memfit}) == w


def _searched_workloads(goal, n_gpus: int) -> list[memfit.Workload]:
    """Every workload the search can evaluate for `goal`: each shape of every stage, with
    every technique allowed, at the smallest and largest micro-batch, in each placement."""
    from memfit.cuda.target import get_gpu
    from memfit.errors import BadInputError
    from memfit.models.sources import resolve_model
    from memfit.planner import shapes as S
    from memfit.planner.search import _Search

    spec = resolve_model("gpt2")
    gpu = get_gpu("a100-80gb")
    allowed = S.allowed_techniques(tuple(S.TECHNIQUES), ())
    search = _Search(spec, goal, gpu, n_gpus)
    stages = S.shapes(goal, allowed, gpu, spec) + S.lean_shapes(goal, allowed, gpu, spec)
    stages += S.offload_shapes(goal, allowed, gpu, spec)
    stages += S.with_ddp(stages, allowed, n_gpus)
    out = []
    for shape in dict.fromkeys(stages):
        for mb in (1, search.per_gpu):
            for offload, emb in S.placements(allowed):
                try:
                    out.append(search.workload(shape, mb, offload, emb))
                except BadInputError:  # a combination Workload refuses is never evaluated
                    continue
    return out


@pytest.mark.parametrize(
    ("goal", "n_gpus"),
    [
        (dict(global_batch=8, seq_len=128), 1),
        (dict(global_batch=8, seq_len=128, teacher="gpt2-medium"), 1),
        (dict(global_batch=8, seq_len=128, fsdp_mixed="accelerate"), 2),
    ],
)
def test_every_searched_shape_round_trips_through_its_code(goal, n_gpus):
    from memfit.planner.results import Goal

    workloads = _searched_workloads(Goal(**goal), n_gpus)
    assert len(workloads) > 20
    for w in workloads:
        code = apply_code(SimpleNamespace(workload=w), "gpt2", "a100-80gb")  # type: ignore[arg-type]
        line = re.search(r"^workload = (memfit\.Workload\(.*\))$", code, re.M)
        assert line is not None, code
        assert eval(line.group(1), {"memfit": memfit}) == w, code


# Workloads that set fields no plan sets today (generation, LoRA's alpha and targets, frozen
# prefixes, attention, distillation): the printed code is derived from Workload's own fields,
# so each round-trips without the renderer knowing it.
UNPLANNED = [
    dict(mode="generate", prompt_len=4096, new_tokens=64, num_beams=4, cache="static", tp=2,
         precision="bf16-true", attention="eager", gpu="h100-80gb"),
    dict(batch_size=2, seq_len=256, precision="bf16-mixed", freeze=("model.embed",),
         lora=memfit.LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj")),
         quantize="nf4", prepare_kbit=True, host_memory="64GiB", steps=3),
    dict(batch_size=4, seq_len=512, precision="bf16-mixed", teacher="llama-3.2-1b",
         teacher_precision="bf16", distill_loss="chunked-kl", teacher_quantize="nf4"),
    dict(batch_size=1, image_size=384, mode="inference", precision="fp16-true"),
]  # fmt: skip


@pytest.mark.parametrize("fields", UNPLANNED)
def test_every_workload_field_round_trips(fields):
    from memfit.workload.code import workload_code

    w = memfit.Workload(**fields)
    code = workload_code(w)
    assert eval(code, {"memfit": memfit}) == w, code
    for name in fields:  # each given field is written (none is at its default here)
        assert f"{name}=" in code, (name, code)


def test_the_recipe_is_written_first_even_at_defaults():
    from memfit.workload.code import workload_code

    assert workload_code(memfit.Workload(seq_len=128)) == (
        "memfit.Workload(batch_size=1, grad_accum=1, seq_len=128, precision='fp32', "
        "optimizer='adamw')"
    )
