"""Mixed precision ("-mixed": fp32 weights, autocast, a GradScaler with fp16) or pure precision
("-true": the model cast to the 16-bit dtype).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memfit.techniques.registry import Build, handler
from memfit.workload import PRECISIONS, check_choice


@dataclass(frozen=True, kw_only=True)
class PrecisionConfig:
    """Mixed ("-mixed": fp32 weights, autocast; GradScaler with fp16) or pure ("-true": the
    model cast to the 16-bit dtype) precision. One of workload.PRECISIONS."""

    precision: str = "bf16-mixed"

    def __post_init__(self) -> None:
        check_choice("precision", self.precision, PRECISIONS)

    @property
    def label(self) -> str:
        """How reports name the technique: nothing, as reports show the precision on its own."""
        return ""


@handler
def _precision(config: PrecisionConfig, build: Build) -> None:
    p = config.precision
    build.precision = p
    if p == "fp32":
        return
    dtype = torch.float16 if p.startswith("fp16") else torch.bfloat16
    if p.endswith("-true"):
        build.model.to(dtype)  # floating parameters and buffers only
    else:
        build.autocast_dtype = dtype
        if dtype == torch.float16:
            build.scaler = torch.amp.GradScaler(build.device.type)
    build.applied.append(p)
