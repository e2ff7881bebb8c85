"""Sequential scans: layers whose forward loops over the tokens one at a time.

transformers' Mamba-style mixers (Mamba, FalconMamba, Jamba, Zamba) run their selective scan
with the `mamba_ssm` CUDA kernels when that package is installed; without it they run a
reference PyTorch path whose scan is a Python loop over the sequence, token by token
(transformers warns that it "is correct but much slower"). That loop is what a GPU without
`mamba_ssm` runs (the GPU image memfit is checked on ships none), and it is what memfit traces:
op by op, so the trace takes a time proportional to tokens x scan layers x steps
(`SCAN_MIXERS` gives the seconds per step), whatever the model's width. RWKV's attention loops
the same way off CUDA (on CUDA transformers compiles a kernel of its own). `scan_budget` says
how long, so that the estimate prints it first, and refuses, naming the model and the sequence
length that would do, a trace longer than `MAX_SCAN_SECONDS`.

Known limits: the kernels themselves are not emulated (their memory differs from the PyTorch
path's: they keep no per-token state for the backward), so with `mamba_ssm` importable the
trace would run the package's CUDA code on fake tensors and fail (a TraceError), and an RWKV
estimate is that of the loop, not of transformers' wkv kernel.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from memfit.errors import BadInputError

__all__ = ["MAX_SCAN_SECONDS", "SCAN_MIXERS", "ScanBudget", "scan_budget"]

#: Module classes of transformers whose forward loops over the tokens on fake CPU tensors -> the
#: package whose kernels a GPU runs instead when it is installed (None: transformers' own CUDA
#: kernel, RWKV's wkv, compiled on a CUDA machine), and the seconds of trace per token of one such
#: layer in a training step (its forward and backward), measured on 2 CPU cores (torch 2.13,
#: transformers 5.24; tiny configs at seq 16 and 48, 7 layers traced over 2 steps, 448 more
#: token steps: Mamba 5.0 s more, 11 ms each, at a load of 2; RWKV 17.9 s, 40 ms, at a load
#: of 3). The Mamba-style loop is modeling_mamba.mamba_selective_scan's "Recurrent iteration"
#: and its copies in falcon_mamba, jamba and zamba; RWKV's is rwkv_linear_attention_cpu.
SCAN_MIXERS: dict[str, tuple[str | None, float]] = {
    "MambaMixer": ("mamba_ssm", 0.012),
    "FalconMambaMixer": ("mamba_ssm", 0.012),
    "JambaMambaMixer": ("mamba_ssm", 0.012),
    "ZambaMambaMixer": ("mamba_ssm", 0.012),
    "RwkvSelfAttention": (None, 0.035),
}

#: The longest scan trace memfit runs, in seconds of the table's figures: an estimate traces a
#: model twice (3 and 4 blocks), so under a minute in all.
MAX_SCAN_SECONDS = 25.0


@dataclass(frozen=True)
class ScanBudget:
    """The token-by-token scans of one trace: the mixer class, the kernel a GPU would run
    instead, how many of the traced model's layers loop, and over how many token steps."""

    mixer: str
    package: str | None
    layers: int
    tokens: int
    steps: int

    @property
    def token_steps(self) -> int:
        return self.tokens * self.layers * self.steps

    @property
    def seconds(self) -> float:
        return self.token_steps * SCAN_MIXERS[self.mixer][1]

    @property
    def path(self) -> str:
        """Which path loops, and why."""
        if self.package is None:
            return "transformers' CPU path; a GPU runs transformers' own CUDA kernel"
        return f"transformers' PyTorch path: {self.package} is not installed"

    def line(self) -> str:
        """The progress line printed before the trace."""
        return (
            f"memfit: tracing {self.layers} {self.mixer} layers' token-by-token scan "
            f"({self.path}) over {self.tokens} tokens x {self.steps} steps, "
            f"about {self.seconds:.0f} s"
        )


def scan_budget(model: torch.nn.Module, tokens: int, steps: int, name: str) -> ScanBudget | None:
    """The scans of a trace of `model` over `tokens` tokens and `steps` steps, or None when it
    has none. Raises BadInputError when the trace would take over `MAX_SCAN_SECONDS`."""
    found: dict[str, int] = {}
    for mod in model.modules():
        cls = type(mod).__name__
        package = SCAN_MIXERS[cls][0] if cls in SCAN_MIXERS else ""
        if package is None or (package and importlib.util.find_spec(package) is None):
            found[cls] = found.get(cls, 0) + 1
    if not found:
        return None
    mixer = max(found, key=found.__getitem__)
    budget = ScanBudget(mixer, SCAN_MIXERS[mixer][0], sum(found.values()), tokens, steps)
    if budget.seconds > MAX_SCAN_SECONDS:
        per_token = budget.seconds / tokens
        raise BadInputError(
            f"{name}: its {mixer} layers scan the sequence token by token ({budget.path}), "
            f"and memfit traces that loop op by op: {tokens} tokens x {budget.layers} layers x "
            f"{steps} steps would take about {budget.seconds:.0f} s, over memfit's limit of "
            f"{MAX_SCAN_SECONDS:.0f} s a trace. Estimate {int(MAX_SCAN_SECONDS / per_token)} "
            "tokens or fewer (the memory of this path grows with the sequence; memfit does "
            "not emulate the kernels)."
        )
    return budget
