"""The "to use it" code a plan prints builds the workload the plan estimated (issue: it printed
offload_activations=True for the planner's torchtune offload, which Workload reads as
"save_on_cpu": another technique than the one estimated)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

import memfit
from memfit.planner.render import apply_code

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
