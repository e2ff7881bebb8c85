"""The optimizer: its config, its handler, and one builder for both the trace and `apply_`.

The builder's `for_trace` says which: the estimate's layout of what CUDA runs, or the real
optimizer `apply_` gives the user. Both take the config's learning rate and weight decay.

On CUDA, torch.optim picks the foreach implementation by default
(torch/optim/optimizer.py `_default_to_fused_or_foreach`: foreach when every parameter is on a
CUDA device). On CPU it would pick the per-tensor loop, whose temporaries are far smaller, so
the tracer asks for `foreach=True` explicitly. `adamw-fused` asks for `fused=True`, which keeps
the step counters on the device (Adam `_init_group`: `torch.zeros((), device=p.device)` when
fused or capturable, else a CPU tensor). `host_state_keys` says which state entries CUDA keeps on
the host, so that the tracer does not count them as GPU memory.

`BnbAdamWLayout` reproduces the memory layout of bitsandbytes' AdamW family: AdamW8bit
(blockwise 8-bit states: uint8 moments, fp32 absmax per 256-element block, the shared
256-entry quantisation map, 32-bit states for small tensors), PagedAdamW (two fp32 moments) and
PagedAdamW8bit, whose large moments live in paged memory (CUDA unified memory that
bitsandbytes allocates with cudaMallocManaged, outside PyTorch's caching allocator: on the GPU
while it fits, evicted to host RAM under pressure). It updates in place like bnb's fused
kernels. It is a layout model for estimation, not a numerically faithful optimizer;
`memfit.apply_` uses bitsandbytes itself.

`Lion` follows the reference implementation's update (lucidrains/lion-pytorch): one momentum
buffer per parameter, and per-parameter temporaries for the sign update.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.events import Category
from memfit.techniques.offload import CpuOffloadOptimizer
from memfit.techniques.registry import Build, handler
from memfit.workload import OPTIMIZERS, check_choice

#: bitsandbytes Optimizer8bit: tensors with fewer elements than min_8bit_size (default 4096)
#: keep 32-bit states.
BNB_MIN_8BIT_SIZE = 4096
#: bitsandbytes blockwise quantisation block size for optimizer states (F.quantize_blockwise).
BNB_BLOCK_SIZE = 256
#: bitsandbytes dynamic quantisation map: 256 float32 entries (create_dynamic_map).
BNB_QMAP_ENTRIES = 256
#: bitsandbytes Optimizer8bit.get_state_buffer: a paged optimizer pages the states of tensors
#: of at least 1e5 elements ("> 1 MB"); smaller ones get ordinary device tensors.
BNB_PAGED_MIN_ELEMENTS = 100_000

#: The learning rate of an optimizer built without one (OptimizerConfig's default; memory does
#: not depend on it).
DEFAULT_LR = 1e-3


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """The optimizer, by memfit name (workload.OPTIMIZERS), with its learning rate.

    "adamw-8bit", "paged-adamw" and "paged-adamw-8bit" are bitsandbytes' AdamW8bit,
    PagedAdamW and PagedAdamW8bit (`pip install memfit[bnb]`). With `offload`, the
    state and the update live on the CPU (memfit.techniques.offload.CpuOffloadOptimizer).
    """

    name: str = "adamw"
    lr: float = DEFAULT_LR
    weight_decay: float = 0.0
    offload: bool = False

    def __post_init__(self) -> None:
        check_choice("optimizer", self.name, OPTIMIZERS)
        if self.name == "none":
            raise BadInputError(
                "OptimizerConfig(name='none') builds nothing; leave the config out instead."
            )
        if not self.lr > 0:
            raise BadInputError(f"Learning rate must be > 0, got {self.lr!r}.")
        if self.offload and self.name.startswith("paged"):
            raise BadInputError(
                f"OptimizerConfig(name={self.name!r}, offload=True): a paged optimizer keeps its "
                "state in CUDA unified memory that pages to the host by itself; on the CPU it "
                "is an ordinary optimizer. Drop offload, or use name='adamw' with offload."
            )

    @property
    def label(self) -> str:
        """How reports name the technique: only the offload (reports show the optimizer)."""
        return "optimizer state on CPU" if self.offload else ""


class BnbAdamWLayout(torch.optim.Optimizer):
    """Memory layout of bitsandbytes' AdamW family (`Optimizer2State`, adam): AdamW8bit,
    PagedAdamW and PagedAdamW8bit; see the module docstring.

    `optim_bits` 8: uint8 moments with fp32 absmax per block and the shared quantisation map
    (`init_state`, dtype uint8), 32-bit moments for tensors under `BNB_MIN_8BIT_SIZE`; 32: two
    fp32 moments. With `paged`, the moments of tensors of at least `BNB_PAGED_MIN_ELEMENTS`
    elements are paged (`get_state_buffer`: `F.get_paged`, CUDA unified memory outside
    PyTorch's allocator); `paged_state` lists them so that the tracer keeps them out of the
    allocator's device memory. absmax and the quantisation map are never paged.
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float = DEFAULT_LR,
        *,
        optim_bits: int = 8,
        paged: bool = False,
    ) -> None:
        super().__init__(params, {"lr": lr})
        self._qmap: torch.Tensor | None = None
        self.optim_bits = optim_bits
        self.paged = paged
        #: ids of the paged state tensors (alive as long as the state holds them).
        self._paged: set[int] = set()

    def _moment(self, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        t = torch.zeros_like(p, dtype=dtype)
        if self.paged and p.numel() >= BNB_PAGED_MIN_ELEMENTS:
            self._paged.add(id(t))
        return t

    def is_paged(self, t: torch.Tensor) -> bool:
        """Whether state tensor `t` lives in paged (unified) memory."""
        return id(t) in self._paged

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    if self.optim_bits == 32 or p.numel() < BNB_MIN_8BIT_SIZE:
                        state["state1"] = self._moment(p, torch.float32)
                        state["state2"] = self._moment(p, torch.float32)
                    else:
                        if self._qmap is None:
                            self._qmap = torch.zeros(
                                BNB_QMAP_ENTRIES, dtype=torch.float32, device=p.device
                            )
                        blocks = (p.numel() + BNB_BLOCK_SIZE - 1) // BNB_BLOCK_SIZE
                        state["state1"] = self._moment(p, torch.uint8)
                        state["state2"] = self._moment(p, torch.uint8)
                        state["absmax1"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
                        state["absmax2"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
                        state["qmap1"] = self._qmap
                        state["qmap2"] = self._qmap
                state["step"] += 1
                # bnb's fused kernel updates states and weights in place: no temporaries.
                p.add_(p.grad, alpha=-group["lr"])
        return None


class AdamW8bitLayout(BnbAdamWLayout):
    """Memory layout of bitsandbytes.optim.AdamW8bit (not paged)."""


def is_paged_state(optimizer: torch.optim.Optimizer, t: torch.Tensor) -> bool:
    """Whether `optimizer` (a trace layout, or optimizers behind one such as
    OptimizerInBackward) keeps state tensor `t` in paged memory."""
    is_paged = getattr(optimizer, "is_paged", None)
    return callable(is_paged) and bool(is_paged(t))


def paged_state_note(records: dict[int, Any]) -> str | None:
    """What an estimate says about paged optimizer state (StorageRecord.paged), or None.

    bitsandbytes allocates it with cudaMallocManaged (functional.py `get_paged`), outside
    PyTorch's caching allocator: the allocator figures leave it out. The driver keeps it on the
    GPU while it fits beside the allocator's memory and evicts it to host RAM under pressure,
    so it never causes an out-of-memory; evicted, each step's update pages it in (and out
    again): up to its size each way over PCIe.
    """
    paged = sum(r.nbytes for r in records.values() if r.paged)
    if not paged:
        return None
    from memfit.units import format_bytes

    size = format_bytes(paged)
    return (
        f"Paged optimizer state: {size} in CUDA unified memory (bitsandbytes' paged "
        "optimizer), outside PyTorch's allocator and not in the device figures: on the GPU "
        "while it fits beside them, paged to host RAM under memory pressure (never an "
        f"out-of-memory). Evicted, each step pages up to {size} in and {size} out over PCIe."
    )


def mark_state(
    tracker: Any,
    optimizer: torch.optim.Optimizer,
    host_keys: frozenset[str],
    params: Iterable[Any] | None = None,
) -> None:
    """Mark `optimizer`'s state tensors (of `params`, else all) as optimizer state in the
    tracer: the entries CUDA keeps on the host (`host_state_keys`) as host, paged ones as
    paged."""
    states = optimizer.state.values() if params is None else [optimizer.state[p] for p in params]
    for state in states:
        for key, v in state.items():
            if isinstance(v, torch.Tensor):
                paged = is_paged_state(optimizer, v)
                tracker.mark(v, Category.OPTIMIZER_STATE, host=key in host_keys, paged=paged)


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023), laid out as lion-pytorch: one momentum buffer per parameter."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float = DEFAULT_LR,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                exp_avg = state["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                update = exp_avg.clone().mul_(beta1).add(p.grad, alpha=1 - beta1).sign_()
                p.add_(update, alpha=-group["lr"])
                exp_avg.mul_(beta2).add_(p.grad, alpha=1 - beta2)
        return None


#: memfit name -> (state bits, paged, bitsandbytes.optim class).
_BNB = {
    "adamw-8bit": (8, False, "AdamW8bit"),
    "paged-adamw": (32, True, "PagedAdamW"),
    "paged-adamw-8bit": (8, True, "PagedAdamW8bit"),
}


def build_optimizer(
    params: list[Any], config: OptimizerConfig, *, for_trace: bool
) -> torch.optim.Optimizer:
    """The optimizer `config` names over `params`.

    With `for_trace`, it is laid out as CUDA runs it by default: the foreach implementation
    asked for explicitly (a CPU trace would otherwise run the per-tensor loop), and
    `BnbAdamWLayout` for bitsandbytes' (paged) AdamW. Otherwise it is the real optimizer, with
    torch's own implementation choice, and bitsandbytes' own classes.
    """
    if not params:
        raise BadInputError(
            "No parameter requires grad, so there is nothing to optimize. Unfreeze some "
            "parameters, add LoRA (--lora-rank), or use --optimizer none / --mode inference."
        )
    name, lr, wd = config.name, config.lr, config.weight_decay
    impl: dict[str, Any] = {"foreach": True} if for_trace else {}
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=wd, **impl)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=wd, **impl)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=wd, **impl)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=wd, **impl)
    if name == "adamw-fused":
        return torch.optim.AdamW(params, lr=lr, weight_decay=wd, fused=True)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=lr, weight_decay=wd, **impl)
    if name == "lion":
        return Lion(params, lr=lr, weight_decay=wd)
    if name in _BNB:
        bits, paged, cls = _BNB[name]
        if for_trace:
            return BnbAdamWLayout(params, lr=lr, optim_bits=bits, paged=paged)
        try:
            import bitsandbytes as bnb
        except ImportError as e:
            raise ImportError(
                f"OptimizerConfig(name={name!r}) uses bitsandbytes' {cls}: install it "
                "with `pip install memfit[bnb]`, or choose 'adafactor' (also light on memory)."
            ) from e
        return getattr(bnb.optim, cls)(params, lr=lr, weight_decay=wd)
    raise BadInputError(f"Unknown optimizer {name!r}.")


def host_state_keys(optimizer: torch.optim.Optimizer) -> frozenset[str]:
    """State entries that CUDA keeps in host memory for this optimizer.

    torch.optim Adam/AdamW/Adafactor keep `step` as a CPU scalar tensor unless fused or
    capturable (Adam._init_group, Adafactor._init_group).
    """
    defaults = optimizer.defaults
    if defaults.get("fused") or defaults.get("capturable"):
        return frozenset()
    return frozenset({"step"})


def make_optimizer(model: torch.nn.Module, config: OptimizerConfig) -> torch.optim.Optimizer:
    """The optimizer over the trainable parameters (each once, tied ones included once)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise BadInputError(
            "No parameter of the model requires grad, so there is nothing to optimize. "
            "Unfreeze some parameters or add LoRA."
        )
    if config.offload:
        return CpuOffloadOptimizer(params, lambda ps: build_optimizer(ps, config, for_trace=False))
    return build_optimizer(params, config, for_trace=False)


@handler
def _optimizer_handler(config: OptimizerConfig, build: Build) -> None:
    if build.precision == "fp16-true" and config.name in ("adam", "adamw", "adamw-fused", "lion"):
        raise BadInputError(
            f"fp16-true with {config.name} diverges: the weights are fp16, Adam's eps (1e-8) is "
            "0 in fp16 and nothing scales the loss, so the first steps give NaN. Use "
            "fp16-mixed (fp32 weights, GradScaler), or bf16-true on a GPU with bf16."
        )
    build.optimizer = make_optimizer(build.model, config)
    build.optimizer_config = config
    build.applied.append(
        f"optimizer {config.name}, lr {config.lr:g}" + (" on CPU" if config.offload else "")
    )
    build.left_to_caller.append(
        "the optimizer step: setup.step runs it; another trainer takes setup.optimizer "
        "(HF Trainer: optimizers=(setup.optimizer, None))."
    )


def optimizer_for_trace(name: str, params: list[Any]) -> torch.optim.Optimizer | None:
    """The optimizer a workload names (`Workload.optimizer`), laid out as CUDA runs it by
    default; None for "none"."""
    if name == "none":
        return None
    return build_optimizer(params, OptimizerConfig(name=name), for_trace=True)
