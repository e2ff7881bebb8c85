"""Sequential scans: layers whose forward loops over the tokens one at a time.

transformers' Mamba-style mixers (Mamba, FalconMamba, Jamba, Zamba) run their selective scan
with the `mamba_ssm` CUDA kernels when that package is installed; without it they run a
reference PyTorch path whose scan is a Python loop over the sequence, token by token
(transformers warns that it "is correct but much slower"). That loop is what a GPU without
`mamba_ssm` runs (the GPU image memfit is checked on ships none), and it is what memfit traces:
op by op, so the trace takes a time proportional to tokens x scan layers x steps
(`SECONDS_PER_SCAN_STEP` each), whatever the model's width. `scan_budget` says how long, so
that the estimate prints it first, and refuses, naming the model and the sequence length that
would do, a trace longer than `MAX_SCAN_SECONDS`.

Known limit: the `mamba_ssm` kernels themselves are not emulated (their memory differs from the
PyTorch path's: they keep no per-token state for the backward), so with `mamba_ssm` importable
the trace would run the package's CUDA code on fake tensors and fail (a TraceError).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from memfit.errors import BadInputError

__all__ = ["MAX_SCAN_SECONDS", "SECONDS_PER_SCAN_STEP", "ScanBudget", "scan_budget"]

#: Module classes of transformers whose forward loops over the tokens when the kernel package
#: is missing (modeling_mamba.mamba_selective_scan's "Recurrent iteration", and its copies in
#: falcon_mamba, jamba and zamba) -> that package.
SCAN_MIXERS = {
    "MambaMixer": "mamba_ssm",
    "FalconMambaMixer": "mamba_ssm",
    "JambaMambaMixer": "mamba_ssm",
    "ZambaMambaMixer": "mamba_ssm",
}

#: Seconds of trace per token of one scan layer in a training step (its forward and backward),
#: measured on 2 busy CPU cores (torch 2.13, transformers 5.24: a 6-layer Mamba of width 64 at
#: seq 32 and 128, 7 layers traced over 2 steps: 33 s for 1344 more token steps, 25 ms, at a
#: load of 5 on the 2 cores; taken as 12 ms for the cores alone).
SECONDS_PER_SCAN_STEP = 0.012

#: The longest scan trace memfit runs, in seconds of `SECONDS_PER_SCAN_STEP`: an estimate
#: traces a model twice (3 and 4 blocks), so under a minute in all.
MAX_SCAN_SECONDS = 25.0


@dataclass(frozen=True)
class ScanBudget:
    """The token-by-token scans of one trace: the mixer class, its kernel package, how many
    of the traced model's layers loop, and over how many token steps in all."""

    mixer: str
    package: str
    layers: int
    tokens: int
    steps: int

    @property
    def token_steps(self) -> int:
        return self.tokens * self.layers * self.steps

    @property
    def seconds(self) -> float:
        return self.token_steps * SECONDS_PER_SCAN_STEP

    def line(self) -> str:
        """The progress line printed before the trace."""
        return (
            f"memfit: tracing {self.layers} {self.mixer} layers' token-by-token scan "
            f"(transformers' PyTorch path: {self.package} is not installed) over {self.tokens} "
            f"tokens x {self.steps} steps, about {self.seconds:.0f} s"
        )


def scan_budget(model: torch.nn.Module, tokens: int, steps: int, name: str) -> ScanBudget | None:
    """The scans of a trace of `model` over `tokens` tokens and `steps` steps, or None when it
    has none. Raises BadInputError when the trace would take over `MAX_SCAN_SECONDS`."""
    found: dict[str, int] = {}
    for mod in model.modules():
        cls = type(mod).__name__
        if cls in SCAN_MIXERS and importlib.util.find_spec(SCAN_MIXERS[cls]) is None:
            found[cls] = found.get(cls, 0) + 1
    if not found:
        return None
    mixer = max(found, key=found.__getitem__)
    budget = ScanBudget(mixer, SCAN_MIXERS[mixer], sum(found.values()), tokens, steps)
    if budget.seconds > MAX_SCAN_SECONDS:
        longest = int(MAX_SCAN_SECONDS / (SECONDS_PER_SCAN_STEP * budget.layers * steps))
        raise BadInputError(
            f"{name}: its {mixer} layers scan the sequence token by token in transformers' "
            f"PyTorch path ({budget.package} is not installed, as on a GPU without it), and "
            f"memfit traces that loop op by op: {tokens} tokens x {budget.layers} layers x "
            f"{steps} steps would take about {budget.seconds:.0f} s, over memfit's limit of "
            f"{MAX_SCAN_SECONDS:.0f} s a trace. Estimate {longest} tokens or fewer (the "
            "memory of this path grows with the sequence; memfit does not emulate the "
            f"{budget.package} kernels)."
        )
    return budget
