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
    from memfit.estimator import Estimate, estimate
    from memfit.profile import MemoryProfile

__all__ = [
    "BadInputError",
    "Estimate",
    "LoraConfig",
    "MemfitError",
    "MemoryProfile",
    "TraceError",
    "Workload",
    "estimate",
]

_LAZY = {
    "estimate": ("memfit.estimator", "estimate"),
    "Estimate": ("memfit.estimator", "Estimate"),
    "MemoryProfile": ("memfit.profile", "MemoryProfile"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'memfit' has no attribute {name!r}")
