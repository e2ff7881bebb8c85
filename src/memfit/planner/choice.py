"""Which fitting configuration a plan recommends, and which it shows beside it.

The usual optimizer (AdamW, or the goal's) is kept unless nothing with it fits; among those,
the fastest wins. Another optimizer that would be faster is shown beside the recommendation,
and the Pareto table lists what is not beaten on both device memory and step time.
"""

from __future__ import annotations

from memfit.optimizers import DEFAULT_OPTIMIZER, NO_OPTIMIZER, spec_of
from memfit.planner.results import Candidate, Goal


def preference(c: Candidate, goal: Goal) -> tuple[bool, float]:
    """Another optimizer than the usual one (AdamW) changes the training, not only its memory
    and speed, and the roofline's update times do not capture real optimizer kernels well: it
    is recommended only when nothing with the usual optimizer fits. Then the fastest wins."""
    usual = _algorithm(goal.optimizer or DEFAULT_OPTIMIZER)
    return (_algorithm(c.workload.optimizer) != usual, c.cost.seconds)


def faster_other_optimizer(
    fitting: list[Candidate], best: Candidate | None, goal: Goal
) -> Candidate | None:
    """The fastest fitting candidate with another optimizer, when it beats the recommendation
    (shown beside it: the user may accept the change of training)."""
    if best is None or preference(best, goal)[0]:
        return None
    others = [c for c in fitting if preference(c, goal)[0]]
    fastest = min(others, key=lambda c: c.cost.seconds, default=None)
    return fastest if fastest is not None and fastest.cost.seconds < best.cost.seconds else None


def _algorithm(optimizer: str) -> str:
    """The update rule (OptimizerSpec.rule): fused AdamW is AdamW with other kernels, a paged
    optimizer the same optimizer with its state in unified memory."""
    return optimizer if optimizer == NO_OPTIMIZER else spec_of(optimizer).rule


def pareto(cands: list[Candidate]) -> list[Candidate]:
    """Candidates not beaten on both device memory and step time, fastest first."""
    out: list[Candidate] = []
    for c in sorted(cands, key=lambda c: (c.cost.seconds, c.device_total_bytes)):
        if not out or c.device_total_bytes < out[-1].device_total_bytes:
            out.append(c)
    return out
