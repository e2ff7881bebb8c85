"""The checks of `memfit.doctor`: run at each step boundary, turned into findings on demand.

Each finding is a `Finding`, built here and returned as is by `memfit.doctor`.
"""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from memfit.cuda.allocator_config import cuda_block_size
from memfit.diagnosis.graph import (
    behind,
    chain_flags,
    node_seq,
    pinned,
    sequence_mark,
    tensor_info,
)
from memfit.diagnosis.saved_tensors import SavedBook
from memfit.diagnosis.sites import Clock, Site, describe_holder, user_frames
from memfit.diagnosis.tracking import GradTracker, StorageTracker
from memfit.units import format_bytes as fb

GRAPH_KEPT_ALIVE = "graph-kept-alive"
GROWTH = "growth"
EVAL_WITHOUT_NO_GRAD = "eval-without-no-grad"
RETAIN_GRAPH_IN_LOOP = "retain-graph-in-loop"
KINDS = (GRAPH_KEPT_ALIVE, GROWTH, EVAL_WITHOUT_NO_GRAD, RETAIN_GRAPH_IN_LOOP)

#: Consecutive steps of growth before it is reported: fewer is too easily a varying batch shape.
GROWTH_MIN_STEPS = 3
#: Boundaries before growth is compared: gradients and optimizer state appear at boundary 0, and
#: whether a storage made in a step outlives it (or is carried on) shows one step later.
GROWTH_WARMUP = 2
#: Wasted `retain_graph=True` backward calls from one line before it is reported ("in a loop").
RETAIN_MIN_CALLS = 2


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One anti-pattern: what it is, where, what keeps the memory, and the fix.

    Attributes:
        kind: one of `KINDS`.
        message: what was seen, with the numbers.
        fix: the change to make, as code where possible.
        bytes: the bytes the fix would free (integer bytes).
        filename, lineno: the user line that created the memory (None when unknown).
        holder: what keeps it alive (`total_loss`, `history (list)`), None when not found.
    """

    kind: str
    message: str
    fix: str
    bytes: int
    filename: str | None
    lineno: int | None
    holder: str | None


@dataclass
class _Leak:
    chain: bool
    site: Site | None
    holder: str | None
    scalar: bool
    first_step: int
    last_step: int = 0
    bytes: int = 0
    nodes: int = 0
    tensors: int = 0
    truncated: bool = False


@dataclass
class _Growth:
    site: Site | None
    holder: str | None
    bytes: int = 0
    per_step: int = 0
    steps: int = 0


class Findings:
    """State of the four checks; `boundary()` at each step boundary, `findings()` any time."""

    def __init__(
        self, clock: Clock, grad: GradTracker, storages: StorageTracker, book: SavedBook
    ) -> None:
        self._clock, self._grad, self._storages, self._book = clock, grad, storages, book
        self._marks: tuple[int | None, int | None] = (None, None)  # the last two boundaries
        self._leaks: dict[tuple[bool, Site | None], _Leak] = {}
        self._growth: dict[Site | None, _Growth] = {}
        self._prev: tuple[int, dict[Site | None, int]] | None = None
        self._run_start: tuple[int, dict[Site | None, int]] = (0, {})
        self._run_len = 0
        self._high = 0  # the largest sample so far: growth must set new highs

    def boundary(self, cuda_device: torch.device | None, optimizers: list[Any]) -> None:
        held: dict[int, int] = {}
        older, previous = self._marks
        if previous is not None:
            held = self._check_graphs(previous, older)
        self._marks = (previous, sequence_mark())
        self._check_growth(held, optimizer_storages(optimizers, cuda_device), cuda_device)

    # -- graph-kept-alive -------------------------------------------------------------------
    def _check_graphs(self, threshold: int, older: int | None) -> dict[int, int]:
        """Group the tensors whose graphs outlived a step; return the storages they pin."""
        tensors: list[torch.Tensor] = []
        sites: list[Site | None] = []
        for t, site in self._grad.sites.items():
            if t.grad_fn is not None:
                tensors.append(t)
                sites.append(site)
        keep: list[Any] = [t.grad_fn for t in tensors]
        old = [node_seq(n) < threshold for n in keep]
        root_ids = {id(n) for n, is_old in zip(keep, old, strict=True) if is_old}
        current = [i for i, is_old in enumerate(old) if not is_old]
        chains = chain_flags([tensors[i] for i in current], threshold, older, root_ids, keep)
        groups: dict[tuple[bool, Site | None], list[torch.Tensor]] = {}
        for i, is_old in enumerate(old):
            if is_old:
                groups.setdefault((False, sites[i]), []).append(tensors[i])
        chain_at = [i for i, is_chain in zip(current, chains, strict=True) if is_chain]
        chain_ids = {id(tensors[i].grad_fn) for i in chain_at}
        for i in chain_at:
            if not behind(tensors[i], chain_ids, threshold, keep):
                groups.setdefault((True, sites[i]), []).append(tensors[i])
        visited: set[int] = set()
        held: dict[int, int] = {}
        for key, group in groups.items():
            p = pinned(group, threshold, visited, keep)
            held.update(p.keys)
            leak = self._leaks.get(key)
            if leak is None:
                newest = max(group, key=lambda t: node_seq(t.grad_fn))
                frames = user_frames(sys._getframe(), self._clock.root)
                holder = describe_holder(newest, frames, [tensors, *groups.values()])
                leak = _Leak(key[0], key[1], holder, newest.numel() == 1, self._clock.step)
                self._leaks[key] = leak
            leak.last_step = self._clock.step
            leak.bytes = max(leak.bytes, p.bytes)
            leak.nodes = max(leak.nodes, p.nodes)
            leak.tensors = max(leak.tensors, len(group))
            leak.truncated = leak.truncated or p.truncated
        return held

    # -- growth -----------------------------------------------------------------------------
    def _check_growth(
        self, held: dict[int, int], state: dict[int, int], cuda_device: torch.device | None
    ) -> None:
        """Sample what outlives steps: not this step's working set (a batch that grows with a
        curriculum), not optimizer state (made lazily: a head's first step, LBFGS history), not
        what graph-kept-alive findings explain (`held`)."""
        exclude = {**held, **state}
        total, by_site, working = self._storages.live(exclude, self._clock.step)
        metric = total
        if cuda_device is not None:
            allocated = torch.cuda.memory_allocated(cuda_device)
            now = [n for n, device in working if device == cuda_device]
            metric = allocated - sum(cuda_block_size(n) for n in [*exclude.values(), *now])
        if self._clock.step < GROWTH_WARMUP:
            return
        if self._prev is not None:
            if metric > self._high:
                if self._run_len == 0:
                    self._run_start = self._prev
                self._run_len += 1
            else:
                self._run_len = 0
        self._high = max(self._high, metric) if self._prev is not None else metric
        self._prev = (metric, by_site)
        if self._run_len < GROWTH_MIN_STEPS:
            return
        start, start_sites = self._run_start
        per_site = [(b - start_sites.get(s, 0), i, s) for i, (s, b) in enumerate(by_site.items())]
        grown_here, _, site = max(per_site, default=(0, 0, None), key=lambda x: x[:2])
        site = site if grown_here > 0 else None
        g = self._growth.get(site)
        if g is None:
            g = _Growth(site, self._growth_holder(site, exclude))
            self._growth[site] = g
        g.bytes = max(g.bytes, metric - start)
        g.steps = max(g.steps, self._run_len)
        g.per_step = (metric - start) // self._run_len

    def _growth_holder(self, site: Site | None, exclude: dict[int, int]) -> str | None:
        keys = self._storages.keys_at(site) - exclude.keys() if site is not None else set()
        if not keys:
            return None
        objects = gc.get_objects()
        for obj in objects:
            info = tensor_info(obj) if issubclass(type(obj), torch.Tensor) else None
            if info is not None and info.key in keys:
                frames = user_frames(sys._getframe(), self._clock.root)
                return describe_holder(obj, frames, [objects])
        return None

    # -- findings ---------------------------------------------------------------------------
    def findings(self, final: bool) -> list[Finding]:
        out = []
        for leak in self._leaks.values():
            out.append(_leak_finding(leak, fb))
        for g in self._growth.values():
            where = f", kept by `{g.holder}`" if g.holder else ""
            out.append(_finding(
                GROWTH, g.site, g.holder, g.bytes,
                f"Live tensor memory grew by {fb(g.per_step)} per step for {g.steps} steps in a "
                f"row ({fb(g.bytes)} in all); the growing tensors were created here{where}.",
                "Do not keep a tensor per step: store numbers (`.item()`) or CPU copies "
                "(`.detach().cpu()`), or clear the container each step.",
            ))  # fmt: skip
        out.extend(self._unused_graphs(fb))
        out.extend(self._retentions(final, fb))
        return sorted(out, key=lambda f: (f.filename or "", f.lineno or 0, f.kind))

    def _unused_graphs(self, fb: Any) -> list[Finding]:
        groups: dict[tuple[Any, frozenset[int]], list[tuple[Site, Any]]] = {}
        for site, st in self._book.sites.items():
            if site is not None and st.used == 0 and st.unused and st.max_burst:
                groups.setdefault((site.code, frozenset(st.steps)), []).append((site, st))
        out = []
        for members in groups.values():
            members.sort(key=lambda m: m[1].order)
            nbytes = sum(st.max_burst for _, st in members)
            lines = ("line " if len(members) == 1 else "lines ") + ", ".join(
                str(s.lineno) for s, _ in members
            )
            out.append(_finding(
                EVAL_WITHOUT_NO_GRAD, members[0][0], None, nbytes,
                f"Forward pass run with grad enabled ({lines}) whose autograd graph no "
                f"backward used: the graph alone kept {fb(nbytes)} alive (saved activations, "
                "inputs no variable holds; the most for one pass, or for the graphs still "
                "alive at the end).",
                "Run it under `with torch.no_grad():` (or `torch.inference_mode()`).",
            ))  # fmt: skip
        return out

    def _retentions(self, final: bool, fb: Any) -> list[Finding]:
        wasted: dict[Site | None, list[int]] = {}
        for r in self._book.retentions:
            if not r.reused and (final or r.alive == 0):
                wasted.setdefault(r.site, []).append(r.bytes)
        out = []
        for site, sizes in wasted.items():
            if len(sizes) >= RETAIN_MIN_CALLS:
                out.append(_finding(
                    RETAIN_GRAPH_IN_LOOP, site, None, max(sizes),
                    f"`backward(retain_graph=True)` ran {len(sizes)} times here and no later "
                    f"backward used the retained graph, which alone kept up to "
                    f"{fb(max(sizes))} of saved tensors alive until it was dropped.",
                    "Drop `retain_graph=True`; it is needed only when a second backward through "
                    "the same graph follows.",
                ))  # fmt: skip
        return out


def optimizer_storages(optimizers: list[Any], device: torch.device | None) -> dict[int, int]:
    """The storages (key -> bytes) of the optimizers' state, lists included (LBFGS keeps its
    history in lists); only those on `device` when one is given."""
    out: dict[int, int] = {}
    for opt in optimizers:
        for t in pytree.tree_leaves(list(opt.state.values())):
            if isinstance(t, torch.Tensor) and (device is None or t.device == device):
                info = tensor_info(t)
                if info is not None:
                    out[info.key] = info.nbytes
    return out


def _leak_finding(leak: _Leak, fb: Any) -> Finding:
    who = f"`{leak.holder}`" if leak.holder else "a reference the doctor could not name"
    size = ("at least " if leak.truncated else "") + fb(leak.bytes)
    container = leak.holder is not None and leak.holder.endswith(")")
    if leak.chain:
        message = (
            f"{who} is computed from its value of the previous step with autograd on, so it "
            f"keeps the graph of every earlier step alive: {leak.nodes} old autograd nodes "
            f"pinning {size} at step {leak.last_step}."
        )
        name = leak.holder or "total"
        if leak.scalar:
            fix = f"Accumulate a number: `{name} += loss.item()` (or add `loss.detach()`)."
        else:
            fix = f"Cut the graph between steps: `{name} = {name}.detach()` before reusing it."
    else:
        message = (
            f"{leak.tensors} tensor(s) created here still hold their autograd graph after a "
            f"whole step, kept by {who}: {size} in the tensors and what their graphs saved "
            f"for backward, {leak.nodes} autograd nodes."
        )
        if leak.scalar and not container:
            fix = f"Keep the number: `{leak.holder or 'x'} = loss.item()` (or `.detach()` it)."
        else:
            fix = (
                "Store `.detach()` (frees the graph), `.detach().cpu()` (frees the device "
                "memory too) or `.item()` for a number, not the tensor itself."
            )
    return _finding(GRAPH_KEPT_ALIVE, leak.site, leak.holder, leak.bytes, message, fix)


def _finding(
    kind: str, site: Site | None, holder: str | None, nbytes: int, message: str, fix: str
) -> Finding:
    return Finding(
        kind=kind,
        message=message,
        fix=fix,
        bytes=nbytes,
        filename=site.filename if site is not None else None,
        lineno=site.lineno if site is not None else None,
        holder=holder,
    )
