"""The plan's refinement of "checkpoint every block": as few blocks as still fit.

Recomputation costs time per checkpointed block, so a recommendation that checkpoints every
block is refined to the first k blocks, the smallest k that fits (`fewest_checkpointed`).
"""

from __future__ import annotations

import math
from typing import Any

from memfit.estimator import estimate_from_trace, trace_spec
from memfit.models.sources import ModelSpec
from memfit.planner.cost import step_cost
from memfit.planner.results import Candidate
from memfit.planner.work import work_of
from memfit.workload import Workload

#: Refine "checkpoint every block" only when fewer blocks would save at least this fraction
#: of the recomputation (each refinement step traces the whole model).
MIN_RECOMPUTE_SAVING = 0.25
#: Verification traces tried after the predicted block count.
CHECKPOINT_TRIES = 3


def fewest_checkpointed(spec: ModelSpec, cand: Candidate, gpu: Any, n_blocks: int) -> Candidate:
    """Checkpoint as few blocks as fit: the least recomputation under the budget.

    The blocks are identical, so each costs the same to recompute; the least recompute is the
    smallest k such that checkpointing the first k blocks (nearest the input: recomputed last,
    when the later blocks' activations are already freed) still fits. Device memory falls
    about linearly in k, so k is predicted from k = 0 and k = N (both replayed, cheap) and then
    verified with a whole-model trace (blocks differ), stepping up until it fits.
    """

    def price(w: Workload) -> Candidate:
        tr, n, rep = trace_spec(spec, w, gpu.compute_capability, verify=False)
        est = estimate_from_trace(spec, w, tr, n_blocks=n, replayed=rep, gpu=gpu)
        return Candidate(workload=w, estimate=est, cost=step_cost(work_of(est), gpu, tf32=False))

    limit = gpu.fit_limit
    none = price(cand.workload.with_(checkpointing="off", checkpoint_first=None))
    if none.fits:
        return none if none.cost.seconds < cand.cost.seconds else cand
    m0, m_all = none.device_total_bytes, cand.device_total_bytes
    if m0 <= m_all:
        return cand
    k = max(1, math.ceil((m0 - limit) / ((m0 - m_all) / n_blocks)))
    if k > (1 - MIN_RECOMPUTE_SAVING) * n_blocks:
        return cand
    for k_try in range(k, min(k + CHECKPOINT_TRIES, n_blocks)):
        trial = price(cand.workload.with_(checkpoint_first=k_try))
        if trial.fits:
            return trial
    return cand
