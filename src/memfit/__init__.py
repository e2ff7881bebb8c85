"""memfit: know before you run. Peak GPU memory of PyTorch training, estimated on a CPU.

Example:
    >>> import memfit
    >>> est = memfit.estimate("llama-2-7b", memfit.Workload(seq_len=2048, precision="bf16-true"))
    >>> est.profile.peak_allocated_bytes

`import memfit` stays light: torch is imported, but not transformers, matplotlib or CUDA; the
verbs import what they need when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memfit.errors import BadInputError, MemfitError, TraceError
from memfit.workload import LoraConfig, Workload

if TYPE_CHECKING:
    from memfit.diagnosis.doctor import Doctor, doctor
    from memfit.diagnosis.findings import Finding
    from memfit.estimator import Estimate, estimate
    from memfit.guard.batch_search import BatchSearch, find_batch_size
    from memfit.guard.retry import oom_guard
    from memfit.measurement.measure import Measurement, measure
    from memfit.planner.limits import max_batch, max_seq
    from memfit.planner.search import Goal, Plan, plan
    from memfit.planner.serving import ServingCapacity, serving_capacity
    from memfit.profile import MemoryProfile
    from memfit.simulation.oom import OomReport, explain_oom
    from memfit.simulation.simulated_gpu import SimulatedGPU, simulate
    from memfit.techniques.apply import apply_
    from memfit.techniques.train_setup import TrainSetup
    from memfit.techniques.weights_io import load_weights

__all__ = [
    "BadInputError",
    "BatchSearch",
    "Doctor",
    "Estimate",
    "Finding",
    "Goal",
    "LoraConfig",
    "Measurement",
    "MemfitError",
    "MemoryProfile",
    "OomReport",
    "Plan",
    "ServingCapacity",
    "SimulatedGPU",
    "TraceError",
    "TrainSetup",
    "Workload",
    "apply_",
    "doctor",
    "estimate",
    "explain_oom",
    "find_batch_size",
    "load_weights",
    "max_batch",
    "max_seq",
    "measure",
    "oom_guard",
    "plan",
    "serving_capacity",
    "simulate",
]

_LAZY = {
    "estimate": ("memfit.estimator.estimation", "estimate"),
    "Estimate": ("memfit.estimator.estimation", "Estimate"),
    "MemoryProfile": ("memfit.profile", "MemoryProfile"),
    "plan": ("memfit.planner.search", "plan"),
    "Plan": ("memfit.planner.search", "Plan"),
    "Goal": ("memfit.planner.search", "Goal"),
    "max_batch": ("memfit.planner.limits", "max_batch"),
    "max_seq": ("memfit.planner.limits", "max_seq"),
    "serving_capacity": ("memfit.planner.serving", "serving_capacity"),
    "ServingCapacity": ("memfit.planner.serving", "ServingCapacity"),
    "apply_": ("memfit.techniques.apply", "apply_"),
    "TrainSetup": ("memfit.techniques.train_setup", "TrainSetup"),
    "load_weights": ("memfit.techniques.weights_io", "load_weights"),
    "measure": ("memfit.measurement.measure", "measure"),
    "Measurement": ("memfit.measurement.measure", "Measurement"),
    "simulate": ("memfit.simulation.simulated_gpu", "simulate"),
    "SimulatedGPU": ("memfit.simulation.simulated_gpu", "SimulatedGPU"),
    "oom_guard": ("memfit.guard.retry", "oom_guard"),
    "find_batch_size": ("memfit.guard.batch_search", "find_batch_size"),
    "BatchSearch": ("memfit.guard.batch_search", "BatchSearch"),
    "explain_oom": ("memfit.simulation.oom", "explain_oom"),
    "OomReport": ("memfit.simulation.oom", "OomReport"),
    "doctor": ("memfit.diagnosis.doctor", "doctor"),
    "Doctor": ("memfit.diagnosis.doctor", "Doctor"),
    "Finding": ("memfit.diagnosis.findings", "Finding"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'memfit' has no attribute {name!r}")
