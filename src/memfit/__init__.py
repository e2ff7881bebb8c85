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
    from memfit.apply import apply_
    from memfit.batch_search import BatchSearch, find_batch_size
    from memfit.estimator import Estimate, estimate
    from memfit.gpu_simulation import SimulatedGPU, simulate
    from memfit.guard import oom_guard
    from memfit.measurement import Measurement, measure
    from memfit.oom import OomReport, explain_oom
    from memfit.planner import Goal, Plan, max_batch, max_seq, plan
    from memfit.profile import MemoryProfile
    from memfit.runtime_doctor import Doctor, Finding, doctor
    from memfit.train_setup import TrainSetup
    from memfit.weights_io import load_weights

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
    "simulate",
]

_LAZY = {
    "estimate": ("memfit.estimator", "estimate"),
    "Estimate": ("memfit.estimator", "Estimate"),
    "MemoryProfile": ("memfit.profile", "MemoryProfile"),
    "plan": ("memfit.planner", "plan"),
    "Plan": ("memfit.planner", "Plan"),
    "Goal": ("memfit.planner", "Goal"),
    "max_batch": ("memfit.planner", "max_batch"),
    "max_seq": ("memfit.planner", "max_seq"),
    "apply_": ("memfit.apply", "apply_"),
    "TrainSetup": ("memfit.train_setup", "TrainSetup"),
    "load_weights": ("memfit.weights_io", "load_weights"),
    "measure": ("memfit.measurement", "measure"),
    "Measurement": ("memfit.measurement", "Measurement"),
    "simulate": ("memfit.gpu_simulation", "simulate"),
    "SimulatedGPU": ("memfit.gpu_simulation", "SimulatedGPU"),
    "oom_guard": ("memfit.guard", "oom_guard"),
    "find_batch_size": ("memfit.batch_search", "find_batch_size"),
    "BatchSearch": ("memfit.batch_search", "BatchSearch"),
    "explain_oom": ("memfit.oom", "explain_oom"),
    "OomReport": ("memfit.oom", "OomReport"),
    "doctor": ("memfit.runtime_doctor", "doctor"),
    "Doctor": ("memfit.runtime_doctor", "Doctor"),
    "Finding": ("memfit.runtime_doctor", "Finding"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'memfit' has no attribute {name!r}")
