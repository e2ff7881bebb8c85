"""Every optimizer memfit models, once: `OptimizerSpec` rows in `SPECS`.

A row holds what every other place reads: the state each parameter gets on the device (and what
is shared between parameters), the update rule it belongs to (the planner keeps the user's rule
unless nothing fits), how the trace lays it out and which class `apply_` builds, the
`TrainingArguments.optim` names of transformers that build it, how a real instance is
recognised, whether pure fp16 weights diverge with it, whether its state is paged, and the
`memfit plan --allow` technique that lets the planner try it. The state layouts are read from
each library's state initialisation, cited per function below, and checked against the real
optimizer's state on CPU (tests/optimizers/test_table.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.optimizers.layouts import Lion, ScheduleFreeAdamW, StateLayout

#: bitsandbytes `Optimizer8bit`: tensors with fewer elements than `min_8bit_size` (default
#: 4096) keep 32-bit states.
BNB_MIN_8BIT_SIZE = 4096
#: bitsandbytes' blockwise quantisation of optimizer states: 256 elements a block
#: (`Optimizer2State.init_state`, `blocksize = 256`), one fp32 absmax each.
BNB_BLOCK_SIZE = 256
#: bitsandbytes' dynamic quantisation maps ("dynamic", "udynamic"): 256 fp32 entries each,
#: one per optimizer, shared by every parameter (`fill_qmap`).
BNB_QMAP_ENTRIES = 256
#: torchao `_AdamBase._new_buffer`: tensors of at least 4096 elements whose size the block
#: divides get a quantized state; others a plain `zeros_like(p)`.
TORCHAO_MIN_SIZE = 4096
#: torchao AdamW8bit / AdamW4bit block sizes (adam.py constructors' `block_size`).
TORCHAO_BLOCK_8BIT, TORCHAO_BLOCK_4BIT = 256, 128
#: torchao quantisation maps, one per state tensor: 256 entries for 8 bits, 16 for 4 bits
#: (subclass_8bit.py / subclass_4bit.py `get_qmap_signed` / `get_qmap_unsigned`).
TORCHAO_QMAP_8BIT, TORCHAO_QMAP_4BIT = 256, 16


@dataclass(frozen=True)
class StateTensor:
    """One tensor of an optimizer's state for a parameter: its key in `optimizer.state[p]`,
    shape and dtype; `shared` tensors exist once per optimizer whatever the parameters."""

    key: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    shared: bool = False

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


Shape = tuple[int, ...]
States = Callable[[Shape, torch.dtype], tuple[StateTensor, ...]]
Build = Callable[[list[Any], float, float], torch.optim.Optimizer]


@dataclass(frozen=True)
class OptimizerSpec:
    """One optimizer as memfit models it.

    Attributes:
        name: memfit's name (`Workload.optimizer`, `--optimizer`).
        title: what it is, for reports and errors.
        rule: its update rule: a fused or paged variant has its plain one's rule (the planner
            recommends another rule only when nothing with the user's fits).
        states: the device state tensors of one parameter of a shape and dtype (host-side step
            counters left out).
        trace: the optimizer the estimate traces (params, lr, weight decay): torch's with
            `foreach=True` as CUDA picks it, else a layout (memfit.optimizers.layouts).
        real: the optimizer `apply_` builds (the library's own class).
        matches: whether a real optimizer instance is this one.
        row_copies: full-size state copies per weight element when the state splits by rows
            (priced per vocabulary row by memfit.data); None for blockwise or factored states.
        weight: heaviness of its device state for the planner's partial order (0: none or
            paged, 1: lighter than Adam, 2: Adam's two moments, 3: more).
        fp16_true_safe: False when fp16 weights with it give NaN (eps of 1e-8 or less is 0 in
            fp16 and nothing scales the loss).
        paged: its large states live in CUDA unified memory (bitsandbytes' paged optimizers).
        hf_optim: the `TrainingArguments.optim` names that build it; the first is written back.
            A name several rows list builds the first of them (SPECS' order).
        hf_optim_args: the `optim_args` it needs, if any.
        allow: the `memfit plan --allow` technique that lets the planner try it.
        allow_help: what that technique is, as `memfit plan` lists it.
        hf_builds: what transformers builds for these `hf_optim` names when it is not `real`
            (the same state, laid out by this row).
        library: the package `real` needs (None: torch).
        apply_note: what the user's loop must do besides stepping it, if anything.
        train_mode: `real` builds it in eval mode; `build` switches it to train mode.
    """

    name: str
    title: str
    rule: str
    states: States
    trace: Build
    real: Build
    matches: Callable[[Any], bool]
    row_copies: int | None = None
    weight: int = 1
    fp16_true_safe: bool = True
    paged: bool = False
    hf_optim: tuple[str, ...] = ()
    hf_optim_args: str | None = None
    allow: str | None = None
    allow_help: str | None = None
    hf_builds: str | None = None
    library: str | None = None
    apply_note: str | None = None
    train_mode: bool = False

    def state_bytes(self, shape: Shape, dtype: torch.dtype) -> int:
        """Device bytes of one parameter's own state (shared tensors left out)."""
        return sum(s.nbytes for s in self.states(shape, dtype) if not s.shared)

    def shared_bytes(self, shapes: list[Shape], dtype: torch.dtype) -> int:
        """Device bytes of the tensors shared by all parameters of these shapes."""
        shared = {s.key: s for sh in shapes for s in self.states(sh, dtype) if s.shared}
        return sum(s.nbytes for s in shared.values())


# --------------------------------------------------------------------------- state layouts


def _like(*keys: str) -> States:
    """`zeros_like(p)` per key (torch.optim's moments, momentum buffers, Adagrad's sum)."""
    return lambda shape, dtype: tuple(StateTensor(k, shape, dtype) for k in keys)


def _fused_adam(shape: Shape, dtype: torch.dtype) -> tuple[StateTensor, ...]:
    # Adam._init_group: fused (or capturable) keeps `step` on the device, an fp32 scalar.
    return (StateTensor("step", (), torch.float32), *_like("exp_avg", "exp_avg_sq")(shape, dtype))


def _adafactor(shape: Shape, dtype: torch.dtype) -> tuple[StateTensor, ...]:
    # torch/optim/_adafactor.py `_init_group`: row and column variances for >= 2-D gradients
    # (the last dim, then the one before it, set to 1), else one full variance.
    if len(shape) >= 2:
        return (
            StateTensor("row_var", (*shape[:-1], 1), dtype),
            StateTensor("col_var", (*shape[:-2], 1, shape[-1]), dtype),
        )
    return (StateTensor("variance", shape, dtype),)


def _blocks(numel: int, block: int) -> int:
    return -(-numel // block)


def _bnb(moments: tuple[str, ...], bits: int, double_first: bool = False) -> States:
    """bitsandbytes `Optimizer2State` / `Optimizer1State.init_state` (AdEMAMix's own
    `init_state` doubles the first state: `(2, *p.shape)`): fp32 states for 32 bits or tensors
    under `min_8bit_size`, else uint8 states, an fp32 absmax per 256-element block (doubled with
    the first state) and the shared quantisation maps ("dynamic", "udynamic")."""
    qmaps = ("qmap1", "qmap2")

    def states(shape: Shape, dtype: torch.dtype) -> tuple[StateTensor, ...]:
        numel = math.prod(shape)
        eight = bits == 8 and numel >= BNB_MIN_8BIT_SIZE
        state_dtype = torch.uint8 if eight else torch.float32
        out = []
        for i, key in enumerate(moments):
            doubled = double_first and i == 0
            out.append(StateTensor(key, (2, *shape) if doubled else shape, state_dtype))
            if eight:
                n = _blocks(numel, BNB_BLOCK_SIZE)
                out.append(
                    StateTensor(f"absmax{i + 1}", (2, n) if doubled else (n,), torch.float32)
                )
                out.append(StateTensor(qmaps[i], (BNB_QMAP_ENTRIES,), torch.float32, shared=True))
        return tuple(out)

    return states


def _torchao(bits: int) -> States:
    """torchao `_AdamBase._new_buffer` with `OptimState8bit.zeros` / `OptimState4bit.zeros`:
    per moment, uint8 codes (two 4-bit codes a byte), an fp32 scale per block and the moment's
    own fp32 quantisation map; a tensor under 4096 elements, or one the block does not divide,
    gets `zeros_like(p)` instead."""
    block, qmap = (
        (TORCHAO_BLOCK_8BIT, TORCHAO_QMAP_8BIT)
        if bits == 8
        else (TORCHAO_BLOCK_4BIT, TORCHAO_QMAP_4BIT)
    )

    def states(shape: Shape, dtype: torch.dtype) -> tuple[StateTensor, ...]:
        numel = math.prod(shape)
        out: list[StateTensor] = []
        for key in ("exp_avg", "exp_avg_sq"):
            if numel < TORCHAO_MIN_SIZE or numel % block:
                out.append(StateTensor(key, shape, dtype))
                continue
            codes = shape if bits == 8 else (numel // 2,)
            out.append(StateTensor(f"{key}.codes", codes, torch.uint8))
            out.append(StateTensor(f"{key}.scale", (numel // block,), torch.float32))
            out.append(StateTensor(f"{key}.qmap", (qmap,), torch.float32))
        return tuple(out)

    return states


# --------------------------------------------------------------------------- builders


def _torch(cls_name: str, **kw: Any) -> tuple[Build, Build]:
    """Trace and real builders of a torch.optim class; the trace asks for foreach (CUDA's
    default, torch/optim/optimizer.py `_default_to_fused_or_foreach`) unless `kw` picks fused."""

    def trace(params: list[Any], lr: float, wd: float) -> torch.optim.Optimizer:
        impl = kw if "fused" in kw else {"foreach": True, **kw}
        return getattr(torch.optim, cls_name)(params, lr=lr, weight_decay=wd, **impl)

    def real(params: list[Any], lr: float, wd: float) -> torch.optim.Optimizer:
        return getattr(torch.optim, cls_name)(params, lr=lr, weight_decay=wd, **kw)

    return trace, real


#: The memfit extra that installs a library an optimizer needs.
_EXTRAS = {"bitsandbytes": "memfit[bnb]", "torchao": "memfit[quantize]"}


def _library(module: str, cls_name: str, name: str, **kw: Any) -> Build:
    """The library's own class (for `apply_`), with a clear error when it is not installed."""

    def real(params: list[Any], lr: float, wd: float) -> torch.optim.Optimizer:
        import importlib

        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            package = module.split(".")[0]
            hint = _EXTRAS.get(package, package)
            raise BadInputError(
                f"optimizer {name!r} is {module}.{cls_name}: install {package} "
                f"(`pip install {hint}`), or choose another optimizer."
            ) from e
        return getattr(mod, cls_name)(params, lr=lr, weight_decay=wd, **kw)

    return real


def _layout(name: str) -> Build:
    def trace(params: list[Any], lr: float, wd: float) -> torch.optim.Optimizer:
        return StateLayout(params, SPECS[name], lr=lr)

    return trace


def _is(module: str, *classes: str, **defaults: Any) -> Callable[[Any], bool]:
    """A matcher: the class is `module`'s (prefix) and named one of `classes`, and each given
    default (or bitsandbytes `args` attribute) has its value (a callable tests it)."""

    def matches(opt: Any) -> bool:
        cls = type(opt)
        if not cls.__module__.startswith(module) or cls.__name__ not in classes:
            return False
        for key, want in defaults.items():
            have = _setting(opt, key)
            if not (want(have) if callable(want) else have == want):
                return False
        return True

    return matches


def _setting(opt: Any, key: str) -> Any:
    if key == "optim_bits":
        return int(getattr(getattr(opt, "args", None), "optim_bits", 32))
    if key == "is_paged":
        return bool(getattr(opt, "is_paged", False))
    return opt.defaults.get(key)


_BNB_ADAMW = ("AdamW", "AdamW8bit", "AdamW32bit", "PagedAdamW", "PagedAdamW8bit", "PagedAdamW32bit")
_BNB_LION = ("Lion", "Lion8bit", "Lion32bit", "PagedLion", "PagedLion8bit", "PagedLion32bit")
_BNB_ADEMAMIX = (
    "AdEMAMix", "AdEMAMix8bit", "AdEMAMix32bit",
    "PagedAdEMAMix", "PagedAdEMAMix8bit", "PagedAdEMAMix32bit",
)  # fmt: skip


def _no(value: Any) -> bool:
    return not value


def _bnb_spec(
    name: str, title: str, rule: str, moments: tuple[str, ...], bits: int, **kw: Any
) -> OptimizerSpec:
    paged = kw.pop("paged", False)
    classes = kw.pop("classes")
    cls = kw.pop("cls")
    double = kw.pop("double_first", False)
    return OptimizerSpec(
        name=name,
        title=title,
        rule=rule,
        states=_bnb(moments, bits, double),
        trace=_layout(name),
        real=_library("bitsandbytes.optim", cls, name),
        matches=_is("bitsandbytes", *classes, optim_bits=bits, is_paged=paged),
        paged=paged,
        library="bitsandbytes",
        **kw,
    )


def _specs() -> dict[str, OptimizerSpec]:
    sgd_t, sgd_r = _torch("SGD")
    mom_t, mom_r = _torch("SGD", momentum=0.9)
    adam_t, adam_r = _torch("Adam")
    adamw_t, adamw_r = _torch("AdamW")
    fused_t, fused_r = _torch("AdamW", fused=True)
    fact_t, fact_r = _torch("Adafactor")
    rms_t, rms_r = _torch("RMSprop")
    ada_t, ada_r = _torch("Adagrad")
    rows = [
        OptimizerSpec(name="sgd", title="torch.optim.SGD", rule="sgd", states=_like(),
                      trace=sgd_t, real=sgd_r, row_copies=0, weight=0, hf_optim=("sgd",),
                      matches=_is("torch.optim", "SGD", momentum=_no)),
        OptimizerSpec(name="sgd-momentum", title="torch.optim.SGD(momentum=0.9)",
                      rule="sgd-momentum", states=_like("momentum_buffer"), trace=mom_t,
                      real=mom_r, row_copies=1, hf_optim=("sgd",), hf_optim_args="momentum=0.9",
                      matches=_is("torch.optim", "SGD", momentum=bool)),
        OptimizerSpec(name="adamw", title="torch.optim.AdamW", rule="adamw",
                      states=_like("exp_avg", "exp_avg_sq"), trace=adamw_t, real=adamw_r,
                      row_copies=2, weight=2, fp16_true_safe=False, hf_optim=("adamw_torch",),
                      matches=_is("torch.optim", "AdamW", fused=_no, amsgrad=_no)),
        OptimizerSpec(name="adam", title="torch.optim.Adam", rule="adam",
                      states=_like("exp_avg", "exp_avg_sq"), trace=adam_t, real=adam_r,
                      row_copies=2, weight=2, fp16_true_safe=False,
                      # weight_decay=0.0 (the default) makes adamw_torch Adam: the same state
                      hf_optim=("adamw_torch",),
                      matches=_is("torch.optim", "Adam", fused=_no, amsgrad=_no)),
        OptimizerSpec(name="adamw-fused", title="torch.optim.AdamW(fused=True)", rule="adamw",
                      states=_fused_adam, trace=fused_t, real=fused_r, row_copies=2, weight=2,
                      fp16_true_safe=False, hf_optim=("adamw_torch_fused",),
                      matches=_is("torch.optim", "Adam", "AdamW", fused=bool, amsgrad=_no)),
        OptimizerSpec(name="rmsprop", title="torch.optim.RMSprop", rule="rmsprop",
                      states=_like("square_avg"), trace=rms_t, real=rms_r, row_copies=1,
                      fp16_true_safe=False, hf_optim=("rmsprop",),
                      matches=_is("torch.optim", "RMSprop", momentum=_no, centered=_no)),
        OptimizerSpec(name="adagrad", title="torch.optim.Adagrad", rule="adagrad",
                      states=_like("sum"), trace=ada_t, real=ada_r, row_copies=1,
                      fp16_true_safe=False, hf_optim=("adagrad",),
                      matches=_is("torch.optim", "Adagrad", fused=_no)),
        OptimizerSpec(name="lion", title="lion-pytorch's Lion (one momentum in the weights' dtype)",
                      rule="lion", states=_like("exp_avg"),
                      trace=lambda ps, lr, wd: Lion(ps, lr=lr, weight_decay=wd),
                      real=lambda ps, lr, wd: Lion(ps, lr=lr, weight_decay=wd), row_copies=1,
                      fp16_true_safe=False,
                      matches=lambda o: _is("lion_pytorch", "Lion")(o)
                      or _is("memfit.optimizers", "Lion")(o)),
        OptimizerSpec(name="schedule-free-adamw", title="schedulefree.AdamWScheduleFree",
                      rule="schedule-free-adamw", states=_like("z", "exp_avg_sq"),
                      trace=lambda ps, lr, wd: ScheduleFreeAdamW(ps, lr=lr, weight_decay=wd),
                      real=_library("schedulefree", "AdamWScheduleFree", "schedule-free-adamw"),
                      row_copies=2, weight=2, fp16_true_safe=False, library="schedulefree",
                      apply_note="memfit builds it in train mode; call optimizer.eval() before "
                      "evaluating or saving, and optimizer.train() after (schedulefree's weights "
                      "switch between the averaged and the stepped point)",
                      train_mode=True,
                      hf_optim=("schedule_free_adamw",),
                      matches=_is("schedulefree", "AdamWScheduleFree")),
        _bnb_spec("lion-32bit", "bitsandbytes Lion (32-bit: one fp32 momentum)", "lion",
                  ("state1",), 32, classes=_BNB_LION, cls="Lion32bit", hf_optim=("lion_32bit",)),
        _bnb_spec("adamw-8bit", "bitsandbytes AdamW8bit", "adamw-8bit",
                  ("state1", "state2"), 8, classes=_BNB_ADAMW, cls="AdamW8bit",
                  allow="8bit-optimizer", allow_help="AdamW with 8-bit states (bitsandbytes)",
                  hf_optim=("adamw_bnb_8bit", "adamw_8bit")),
        _bnb_spec("paged-adamw", "bitsandbytes PagedAdamW", "adamw", ("state1", "state2"), 32,
                  classes=_BNB_ADAMW, cls="PagedAdamW", paged=True, weight=0,
                  hf_optim=("paged_adamw_32bit",)),
        _bnb_spec("paged-adamw-8bit", "bitsandbytes PagedAdamW8bit", "adamw-8bit",
                  ("state1", "state2"), 8, classes=_BNB_ADAMW, cls="PagedAdamW8bit", paged=True,
                  weight=0, hf_optim=("paged_adamw_8bit",)),
        OptimizerSpec(name="adafactor", title="torch.optim.Adafactor", rule="adafactor",
                      states=_adafactor, trace=fact_t, real=fact_r, allow="adafactor",
                      allow_help="Adafactor's factored second moments", hf_optim=("adafactor",),
                      hf_builds="transformers.optimization.Adafactor: factored second moments "
                      "of the same sizes as torch.optim.Adafactor's, which memfit lays out (its "
                      "update temporaries are torch's)",
                      matches=lambda o: _is("torch.optim", "Adafactor")(o)
                      or _is("transformers", "Adafactor")(o)),
        _bnb_spec("lion-8bit", "bitsandbytes Lion8bit", "lion-8bit", ("state1",), 8,
                  classes=_BNB_LION, cls="Lion8bit", hf_optim=("lion_8bit",)),
        _bnb_spec("paged-lion-8bit", "bitsandbytes PagedLion8bit", "lion-8bit", ("state1",), 8,
                  classes=_BNB_LION, cls="PagedLion8bit", paged=True, weight=0,
                  hf_optim=("paged_lion_8bit",)),
        _bnb_spec("paged-lion", "bitsandbytes PagedLion (32-bit)", "lion", ("state1",), 32,
                  classes=_BNB_LION, cls="PagedLion", paged=True, weight=0,
                  hf_optim=("paged_lion_32bit",)),
        _bnb_spec("ademamix", "bitsandbytes AdEMAMix (two first moments and a second)",
                  "ademamix", ("state1", "state2"), 32, classes=_BNB_ADEMAMIX, cls="AdEMAMix",
                  double_first=True, weight=3, hf_optim=("ademamix",)),
        _bnb_spec("ademamix-8bit", "bitsandbytes AdEMAMix8bit", "ademamix-8bit",
                  ("state1", "state2"), 8, classes=_BNB_ADEMAMIX, cls="AdEMAMix8bit",
                  double_first=True, hf_optim=("ademamix_8bit",)),
        _bnb_spec("paged-ademamix", "bitsandbytes PagedAdEMAMix (32-bit)", "ademamix",
                  ("state1", "state2"), 32, classes=_BNB_ADEMAMIX, cls="PagedAdEMAMix",
                  double_first=True, paged=True, weight=0, hf_optim=("paged_ademamix_32bit",)),
        _bnb_spec("paged-ademamix-8bit", "bitsandbytes PagedAdEMAMix8bit", "ademamix-8bit",
                  ("state1", "state2"), 8, classes=_BNB_ADEMAMIX, cls="PagedAdEMAMix8bit",
                  double_first=True, paged=True, weight=0, hf_optim=("paged_ademamix_8bit",)),
        OptimizerSpec(name="torchao-adamw-8bit", title="torchao.optim.AdamW8bit",
                      rule="torchao-adamw-8bit", states=_torchao(8),
                      trace=_layout("torchao-adamw-8bit"),
                      real=_library("torchao.optim", "AdamW8bit", "torchao-adamw-8bit"),
                      library="torchao", hf_optim=("adamw_torch_8bit",),
                      matches=_is("torchao", "AdamW8bit", amsgrad=_no)),
        OptimizerSpec(name="torchao-adamw-4bit", title="torchao.optim.AdamW4bit",
                      rule="torchao-adamw-4bit", states=_torchao(4),
                      trace=_layout("torchao-adamw-4bit"),
                      real=_library("torchao.optim", "AdamW4bit", "torchao-adamw-4bit"),
                      library="torchao", hf_optim=("adamw_torch_4bit",),
                      matches=_is("torchao", "AdamW4bit", amsgrad=_no)),
    ]  # fmt: skip
    return {s.name: s for s in rows}


SPECS: dict[str, OptimizerSpec] = _specs()
