"""Explain an out-of-memory error: what held the memory, and the smallest change that fits.

`explain_oom(error, state)` reads what `memfit.simulate` recorded at the failed allocation
(`OomState`: the allocator's numbers and every live storage with its category, module, op,
shape and dtype) and returns an `OomReport`; `render_oom` turns it into text.

Example:
    >>> with memfit.simulate("rtx-4090", model=model, optimizer=opt) as gpu:
    ...     try:
    ...         train_step(batch)
    ...     except torch.OutOfMemoryError as e:
    ...         print(render_oom(explain_oom(e, gpu)))

Note: [OOM suggestions are approximate]
    Each change is applied, by the rule in its `basis`, to the storages live at the failed
    allocation and to the failed request itself (e.g. halving the micro-batch halves
    activations, inputs and forward/backward temporaries). `saved_bytes` is the drop in live
    (512-byte rounded) bytes. `fits` packs the changed live set, in allocation order, into a
    fresh simulated allocator of the same capacity and config and tries the request: it says
    whether this op would have got its memory. Packing afresh ignores the fragmentation that
    the step's history left; when even the unchanged live set packs (`OomReport.fragmentation`:
    the OOM comes from fragmentation), `fits` falls back to `saved_bytes >= shortfall_bytes`
    (shortfall = segment asked for - free memory after the allocator released its cache).
    Later ops of the step may need more than this one, so confirm a fix with `memfit.estimate`
    or a re-run under `memfit.simulate`. Suggestions go from the smallest change to the
    largest: an allocator setting, the micro-batch (same maths), checkpointing (same maths,
    more compute), then bf16 and optimizer changes (different numerics).

Limitation: only OOMs raised under `memfit.simulate` carry the state this needs; an OOM from a
real GPU is not explained here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from memfit.cuda.allocator import CachingAllocator
from memfit.cuda.allocator_config import AllocatorConfig, cuda_block_size
from memfit.cuda.allocator_oom import AllocatorOutOfMemoryError as AllocatorFull
from memfit.errors import BadInputError
from memfit.optimizers import lighter_specs
from memfit.simulation.simulated_gpu import LiveTensor, OomState
from memfit.units import format_bytes as fb

__all__ = ["OomReport", "Suggestion", "explain_oom", "render_oom"]

#: Categories whose size is proportional to the micro-batch.
_BATCH_CATEGORIES = ("activations", "inputs")


@dataclass(frozen=True, kw_only=True)
class Suggestion:
    """One change, with the bytes it would have freed at the failed allocation (approximate)."""

    name: str
    change: str  # what to do
    saved_bytes: int
    fits: bool  # the failed allocation would have succeeded (see Note: [OOM suggestions ...])
    basis: str  # how saved_bytes was computed


@dataclass(frozen=True, kw_only=True)
class OomReport:
    """What held the memory at an OOM, and what would have fitted. Integer bytes."""

    message: str
    op: str
    module: str
    phase: str
    requested_bytes: int
    alloc_bytes: int  # the segment the allocator tried to get
    allocated_bytes: int
    reserved_bytes: int
    capacity_bytes: int  # what the allocator may reserve
    free_bytes: int
    shortfall_bytes: int  # alloc_bytes - free_bytes: missing for this op, at least
    by_category: dict[str, int]
    by_module: dict[str, int]
    top_tensors: tuple[LiveTensor, ...]
    suggestions: tuple[Suggestion, ...]
    #: The live tensors plus the request would pack in a fresh allocator: the OOM comes from
    #: fragmentation (cached blocks of the wrong size), not from too many bytes.
    fragmentation: bool
    notes: tuple[str, ...] = ()

    @property
    def smallest_fix(self) -> Suggestion | None:
        """The first (smallest) suggestion that would have passed the failed allocation."""
        return next((s for s in self.suggestions if s.fits), None)

    def __str__(self) -> str:
        """The report as `render_oom` writes it, so `print(memfit.explain_oom(e))` reads."""
        return render_oom(self)


def explain_oom(error: BaseException, state: Any = None, *, top_n: int = 10) -> OomReport:
    """Explain `error`, a `torch.OutOfMemoryError` raised under `memfit.simulate`.

    `state` is the `SimulatedGPU` (or its `OomState`); it is only needed when the error is
    not the one simulate raised (which carries its state).
    """
    snap: OomState | None = getattr(error, "memfit_oom", None)
    if snap is None and state is not None:
        snap = state if isinstance(state, OomState) else getattr(state, "oom", None)
    if snap is None:
        raise BadInputError(
            f"No memfit state for this error ({type(error).__name__}): explain_oom explains "
            "OOMs raised under memfit.simulate(...); pass the simulate context as `state`."
        )
    oom = snap.oom
    by_cat: dict[str, int] = defaultdict(int)
    by_mod: dict[str, int] = defaultdict(int)
    for t in snap.live:
        by_cat[t.category] += t.block_bytes
        by_mod[t.module or "<top>"] += t.block_bytes
    shortfall = max(oom.alloc_bytes - oom.free_bytes, 0)
    suggestions, fragmented = _suggestions(snap, shortfall)
    return OomReport(
        message=snap.message, op=snap.op, module=snap.module or "<top>", phase=snap.phase,
        requested_bytes=oom.requested_bytes, alloc_bytes=oom.alloc_bytes,
        allocated_bytes=oom.allocated_bytes, reserved_bytes=oom.reserved_bytes,
        capacity_bytes=oom.capacity_bytes, free_bytes=oom.free_bytes, shortfall_bytes=shortfall,
        by_category=_sorted(by_cat), by_module=_sorted(by_mod),
        top_tensors=tuple(sorted(snap.live, key=lambda t: -t.block_bytes)[:top_n]),
        suggestions=tuple(suggestions), fragmentation=fragmented, notes=tuple(_notes(snap)),
    )  # fmt: skip


def _sorted(d: dict[str, int]) -> dict[str, int]:
    return dict(sorted(d.items(), key=lambda kv: -kv[1]))


def _suggestions(snap: OomState, shortfall: int) -> tuple[list[Suggestion], bool]:
    """Each change as a transformation of the live set and of the failed request; see Note:
    [OOM suggestions are approximate]. Returns the suggestions and whether the unchanged live
    set would pack (then the OOM comes from fragmentation, and "fits" means saving at least the
    shortfall)."""
    live, req, cfg, cap = list(snap.live), snap.request, snap.config, snap.oom.capacity_bytes
    before = sum(t.block_bytes for t in live)
    scales = _batch_scaling(live)
    fragmented = _packs([t.nbytes for t in live], req.nbytes, cfg, cap)[0]
    out: list[Suggestion] = []

    def add(name: str, change: str, sizes: list[int], request: int, basis: str) -> None:
        saved = max(before - sum(cuda_block_size(n) for n in sizes), 0)
        fits = saved >= shortfall if fragmented else _packs(sizes, request, cfg, cap)[0]
        out.append(Suggestion(name=name, change=change, saved_bytes=saved, fits=fits, basis=basis))

    if not cfg.expandable_segments:
        exp = replace(cfg, expandable_segments=True)
        fits, reserved = _packs([t.nbytes for t in live], req.nbytes, exp, cap)
        out.append(Suggestion(
            name="expandable_segments", change="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            saved_bytes=max(snap.oom.reserved_bytes - reserved, 0), fits=fits,
            basis="the live tensors packed afresh into expandable segments (less fragmentation)",
        ))  # fmt: skip

    def half(t: LiveTensor) -> int:
        return -(-t.nbytes // 2) if scales(t) else t.nbytes

    add("half_micro_batch",
        "halve the micro-batch and double gradient accumulation (same effective batch)",
        [half(t) for t in live], half(req),
        "activations, inputs and forward/backward temporaries halve")  # fmt: skip
    if len(snap.block_paths) >= 2:
        add("activation_checkpointing",
            f"checkpoint each of the {len(snap.block_paths)} repeated blocks (non-reentrant)",
            _checkpointed(live, req, snap.block_paths), req.nbytes,
            "other blocks keep only their output (the next block's input); the running block "
            "keeps its activations (as in its recomputation)")  # fmt: skip

    def bf16(t: LiveTensor) -> int:
        return half(t) if t.dtype == "float32" else t.nbytes

    params32 = sum(t.nbytes for t in live if t.dtype == "float32" and t.category == "parameters")
    if any(t.dtype == "float32" and scales(t) for t in [*live, req]):
        add("bf16_mixed",
            "train in bf16 mixed precision (torch.autocast('cuda', dtype=torch.bfloat16))",
            [bf16(t) for t in live] + [params32 // 2], bf16(req),
            "fp32 activations halve; autocast adds a bf16 copy of the weights")  # fmt: skip
    if any(t.category == "optimizer_state" for t in live):
        # The lighter optimizers the planner may switch to (their OptimizerSpec rows), each
        # state tensor its own block, the tensors shared by all parameters once.
        kept = [t.nbytes for t in live if t.category != "optimizer_state"]
        shapes = [shape for shape, _ in snap.optimizer_state]
        for spec in LIGHTER:
            states = [st for shape in shapes for st in spec.states(shape, torch.float32)]
            shared = {st.key: st.nbytes for st in states if st.shared}
            add(spec.name, f"use {spec.title}",
                kept + [st.nbytes for st in states if not st.shared] + list(shared.values()),
                req.nbytes, f"{spec.allow_help or spec.title}: its fp32 state of each "
                "parameter the optimizer holds")  # fmt: skip
    return out, fragmented


def _notes(snap: OomState) -> list[str]:
    notes = []
    if snap.optimizer is not None and not snap.optimizer_state:
        notes.append(
            f"The {snap.optimizer} optimizer has no state yet: if it keeps any (Adam's moments, "
            "momentum), it is created at the first optimizer.step() and is not in these numbers."
        )
    if not snap.block_paths and snap.model is None:
        notes.append("No model given (pass model= to simulate): checkpointing not priced.")
    elif not snap.block_paths:
        notes.append(
            f"The {snap.model} model has no repeated blocks "
            "(memfit.models.structure.find_repeated_blocks "
            "finds none): checkpointing not priced."
        )
    return notes


def _packs(sizes: list[int], request: int, cfg: AllocatorConfig, cap: int) -> tuple[bool, int]:
    """(Do `sizes` then `request` fit in a fresh allocator, reserved bytes before `request`)."""
    alloc = CachingAllocator(cfg, capacity_bytes=cap)
    try:
        for n in sizes:
            if n:
                alloc.malloc(n)
        reserved = alloc.reserved
        if request:
            alloc.malloc(request)
    except AllocatorFull:
        return False, alloc.reserved
    return True, reserved


def _batch_scaling(live: list[LiveTensor]) -> Callable[[LiveTensor], bool]:
    """Whether a storage grows with the micro-batch: activations, inputs, and temporaries of
    forward and backward, except backward temporaries shaped like a parameter of their module
    (weight gradients being computed)."""
    params = {(t.module, t.shape) for t in live if t.category == "parameters"}

    def scales(t: LiveTensor) -> bool:
        if t.category in _BATCH_CATEGORIES:
            return True
        return (
            t.category == "temporaries" and t.phase != "optimizer"
            and (t.module, t.shape) not in params
        )  # fmt: skip

    return scales


def _block_of(t: LiveTensor, blocks: tuple[str, ...]) -> str | None:
    return next((b for b in blocks if t.module == b or t.module.startswith(b + ".")), None)


def _checkpointed(live: list[LiveTensor], req: LiveTensor, blocks: tuple[str, ...]) -> list[int]:
    running = _block_of(req, blocks)
    last: dict[str, int] = {}  # block -> index of its last activation (its output)
    for i, t in enumerate(live):
        b = _block_of(t, blocks) if t.category == "activations" else None
        if b is not None:
            last[b] = i
    keep = set(last.values())
    return [
        t.nbytes
        for i, t in enumerate(live)
        if t.category != "activations" or i in keep
        or _block_of(t, blocks) in (None, running)
    ]  # fmt: skip


#: The optimizers the advice prices: the lighter ones the planner may switch to, unpaged.
LIGHTER = lighter_specs()


def render_oom(report: OomReport, *, top_modules: int = 8) -> str:
    """The report as plain text (binary units, labelled)."""

    lines = [
        f"Out of memory at op {report.op} in module {report.module} ({report.phase}).",
        f"It asked for {fb(report.alloc_bytes)} and {fb(report.free_bytes)} was free "
        f"({fb(report.reserved_bytes)} reserved of {fb(report.capacity_bytes)} the allocator "
        f"may use): {fb(report.shortfall_bytes)} short.",
        "",
        f"Held at that moment ({fb(report.allocated_bytes)} allocated):",
    ]
    lines += [f"  {cat:<18}{fb(b):>12}" for cat, b in report.by_category.items()]
    lines += ["", "By module:"]
    mods = list(report.by_module.items())
    lines += [f"  {m:<40}{fb(b):>12}" for m, b in mods[:top_modules]]
    if len(mods) > top_modules:
        lines.append(f"  ... {len(mods) - top_modules} more")
    lines += ["", "Largest tensors:"]
    for t in report.top_tensors:
        shape = "x".join(str(d) for d in t.shape) or "scalar"
        lines.append(
            f"  {fb(t.block_bytes):>12}  {shape} {t.dtype}  {t.category}  "
            f"{t.module or '<top>'}  {t.op}"
        )
    fix = report.smallest_fix
    lines += ["", "Smallest change that would have fitted this allocation (approximate):"]
    lines.append(f"  {fix.change}: saves ~{fb(fix.saved_bytes)}" if fix else "  none alone")
    lines.append("All changes (approximate savings at the failed allocation):")
    for s in report.suggestions:
        if not s.fits and s.saved_bytes == 0:
            continue
        mark = "fits" if s.fits else "not enough"
        lines.append(f"  - {s.change}: ~{fb(s.saved_bytes)} ({mark}; {s.basis})")
    if report.fragmentation:
        lines.append(
            "The live tensors would fit if packed afresh: this OOM comes from fragmentation."
        )
    lines += [f"Note: {n}" for n in report.notes]
    lines.append(
        "Savings are estimated from what was live when the allocation failed; later ops may "
        "need more. Confirm with memfit.estimate or a re-run under memfit.simulate."
    )
    return "\n".join(lines)
