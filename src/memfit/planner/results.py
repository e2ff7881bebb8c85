"""What `memfit.plan` answers with: the goal it keeps, the configurations it estimated
(`Candidate`), and the `Plan` (the search itself is memfit.planner.search)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memfit.errors import BadInputError
from memfit.estimator import Estimate
from memfit.optimizers import DEFAULT_OPTIMIZER
from memfit.planner.cost import StepCost
from memfit.workload import FSDP_MIXED, Workload, check_choice


@dataclass(frozen=True, kw_only=True)
class Goal:
    """What the plan must keep: the global batch and sequence, and optionally more.

    Attributes:
        global_batch: samples per optimizer step (micro-batch x accumulation x GPUs).
        seq_len: tokens per sample (text models).
        image_size: image side (vision models).
        precision: keep this precision (None: the planner may choose).
        optimizer: keep this optimizer (None: the planner may choose).
        teacher: distill from this teacher (a model source, as Workload.teacher); the plan
            searches the distillation's options too (memfit.planner.shapes.distillations).
        fsdp_mixed: how FSDP2 over several GPUs runs a "-mixed" precision in the launch the
            plan is for (Workload.fsdp_mixed): "policy", or "accelerate" for `accelerate
            launch` and the HF Trainer.
    """

    global_batch: int
    seq_len: int | None = None
    image_size: int | None = None
    precision: str | None = None
    optimizer: str | None = None
    teacher: str | None = None
    fsdp_mixed: str = "policy"

    def __post_init__(self) -> None:
        gb = self.global_batch
        if isinstance(gb, bool) or not isinstance(gb, int) or gb <= 0:
            raise BadInputError(
                f"global_batch must be a positive integer, got {gb!r}. Pass e.g. global_batch=32."
            )
        check_choice("fsdp_mixed", self.fsdp_mixed, FSDP_MIXED)
        # Validate the fixed choices with Workload's own checks.
        Workload(
            seq_len=self.seq_len,
            image_size=self.image_size,
            precision=self.precision or "fp32",
            optimizer=self.optimizer or DEFAULT_OPTIMIZER,
            teacher=self.teacher,
        )


@dataclass(kw_only=True)
class Candidate:
    """One configuration the planner estimated."""

    workload: Workload
    estimate: Estimate
    cost: StepCost

    @property
    def device_total_bytes(self) -> int:
        return self.estimate.profile.device_total_bytes or 0

    @property
    def fits(self) -> bool:
        return bool(self.estimate.fits)


@dataclass(kw_only=True)
class Plan:
    """The result of `plan`: the recommendation, the alternatives, and why."""

    model: str
    gpu: Any
    goal: Goal
    best: Candidate | None
    #: The other candidates (Pareto table, baseline, closest miss, other optimizer) keep their
    #: figures but not their event stream (`estimate.profile.records` and `.events` empty).
    pareto: list[Candidate]
    baseline: Candidate | None
    closest_miss: Candidate | None
    suggestions: list[str] = field(default_factory=list)
    #: A faster fitting configuration that changes the optimizer (not recommended for that).
    other_optimizer: Candidate | None = None
    evaluated: int = 0
    traces: int = 0
    seconds: float = 0.0
    #: Opt-in techniques the search added because nothing fitted without them (the
    #: recommendation uses them; `--forbid` refuses them).
    widened: tuple[str, ...] = ()
    #: Read back from memfit's plan cache (memfit.planner.plan_cache): `seconds` is the time
    #: to read it, `search_seconds` the search's when it ran.
    from_cache: bool = False
    search_seconds: float | None = None
