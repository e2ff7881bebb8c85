"""What the planner searches (memfit.planner.shapes) and the stages of its search."""

from __future__ import annotations

import memfit
from memfit.cuda.target import get_gpu
from memfit.models.sources import resolve_model
from memfit.planner.search import Goal, plan
from memfit.planner.shapes import (
    PLAN_ACTIVATION_OFFLOAD,
    PLAN_LOSS_CHUNKS,
    Shape,
    allowed_techniques,
    heavier,
    lean_shapes,
    offload_shapes,
    shapes,
)


def test_lighter_techniques_order_shapes() -> None:
    base = Shape("bf16-true", "adamw", "off", False, False)
    lean = Shape("bf16-true", "adamw", "blocks", False, False,
                 offload_activations="torchtune", chunked_loss=8)  # fmt: skip
    assert heavier(base, lean) and not heavier(lean, base)
    # The step in backward runs at another micro-batch: never compared.
    in_bwd = Shape("bf16-true", "adamw", "off", False, False, optimizer_in_backward=True)
    assert not heavier(base, in_bwd) and not heavier(in_bwd, base)
    # A paged optimizer's state is outside the allocator: lighter than AdamW's on the device.
    paged = Shape("bf16-true", "paged-adamw", "off", False, False)
    assert heavier(base, paged) and not heavier(paged, base)
    qlora = Shape("bf16-true", "adamw", "off", True, False, quantize="nf4-dq")
    lora = Shape("bf16-true", "adamw", "off", True, False)
    assert heavier(lora, qlora) and not heavier(qlora, lora)


def test_qlora_only_when_allowed() -> None:
    spec = resolve_model("llama-3.2-1b")
    goal = Goal(global_batch=8, seq_len=512)
    gpu = get_gpu("rtx-4090")
    assert not any(s.quantize for s in shapes(goal, allowed_techniques((), ()), gpu, spec))
    allowed = allowed_techniques(("qlora",), ())
    q = [s for s in shapes(goal, allowed, gpu, spec) if s.quantize]
    assert q and all(s.lora and s.quantize == "nf4-dq" for s in q)


def test_the_lean_stage_is_a_lean_full_fine_tune() -> None:
    spec = resolve_model("llama-3.2-1b")
    goal = Goal(global_batch=8, seq_len=512)
    gpu = get_gpu("rtx-4090")
    allowed = allowed_techniques(("pure-precision",), ())
    lean = lean_shapes(goal, allowed, gpu, spec)
    assert {s.precision for s in lean} == {"bf16-true"}
    assert {s.optimizer for s in lean} == {"paged-adamw", "paged-adamw-8bit", "adafactor"}
    assert {s.optimizer_in_backward for s in lean} == {False, True}
    assert {s.offload_activations for s in lean} == {False, PLAN_ACTIVATION_OFFLOAD}
    assert {s.chunked_loss for s in lean} == {PLAN_LOSS_CHUNKS}  # a causal LM
    assert not any(s.lora or s.quantize or s.fsdp_cpu_offload for s in lean)
    # Without the step in backward, the lean stage does not offer it; fp16-mixed never.
    no_bwd = allowed_techniques(("pure-precision",), ("optimizer-in-backward",))
    assert not any(s.optimizer_in_backward for s in lean_shapes(goal, no_bwd, gpu, spec))
    fp16 = Goal(global_batch=8, seq_len=512, precision="fp16-mixed")
    assert not any(s.optimizer_in_backward for s in lean_shapes(fp16, allowed, gpu, spec))
    last = offload_shapes(goal, allowed, gpu, spec)
    assert last and all(s.fsdp_cpu_offload and not s.optimizer_in_backward for s in last)
    assert not offload_shapes(goal, allowed - {"fsdp-offload"}, gpu, spec)


def test_a_lean_fine_tune_when_nothing_else_fits() -> None:
    """GPT-2 on 1200 MiB: no configuration of the first stage fits (with the optimizer on the
    CPU the device still holds 16-bit weights and gradients); the lean stage's step in
    backward frees each gradient as it lands, and its plan is `memfit estimate`'s figure."""
    goal = Goal(global_batch=4, seq_len=256)
    gpu = "rtx-4090@1200MiB"
    first = plan("gpt2", gpu=gpu, goal=goal, forbid=("optimizer-in-backward",
                 "paged-optimizer", "activation-offload", "chunked-loss", "fsdp-offload",
                 "adafactor", "8bit-optimizer"))  # fmt: skip
    assert first.best is None
    p = plan("gpt2", gpu=gpu, goal=goal, forbid=("adafactor", "8bit-optimizer"))
    assert p.best is not None
    w = p.best.workload
    assert w.optimizer_in_backward and w.grad_accum == 1 and w.batch_size == 4
    assert w.chunked_loss == PLAN_LOSS_CHUNKS
    est = memfit.estimate("gpt2", w, gpu=gpu)
    assert est.fits and est.profile.device_total_bytes == p.best.device_total_bytes
