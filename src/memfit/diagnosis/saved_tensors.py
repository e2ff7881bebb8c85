"""Saved-tensor hooks of `memfit.doctor`: which graphs a backward used, and what unused ones held.

Every tensor autograd saves for backward while the doctor runs is wrapped in a handle that
counts its unpacks. A handle released without ever being unpacked belongs to a graph that no
backward used: a forward pass that should have run under `torch.no_grad()`. A handle kept by
`backward(retain_graph=True)` and not unpacked again shows a retain that nothing needed.
"""

from __future__ import annotations

import gc
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from memfit.diagnosis.graph import graph_handles, tensor_info
from memfit.diagnosis.sites import Clock, Site
from memfit.errors import Failsafe


@dataclass
class SiteStats:
    """Saved tensors packed at one line (see `SavedBook`)."""

    order: int
    used: int = 0
    unused: int = 0
    steps: set[int] = field(default_factory=set)
    burst: int = 0
    max_burst: int = 0


@dataclass
class Retention:
    """One `backward(retain_graph=True)`: what it kept, and whether a later backward used it.

    `bytes` is first the activations of the retained graph; once the graph is gone, what its
    death freed (the storages nothing else held); at exit, what it alone still holds.
    """

    site: Site | None
    bytes: int
    alive: int = 0
    freed: int = 0
    reused: bool = False


class _Saved:
    """The handle autograd stores for a saved tensor while the doctor runs."""

    __slots__ = (
        "__weakref__", "activation", "book", "info", "key", "nbytes", "retains", "site",
        "tensor", "unpacks",
    )  # fmt: skip

    def __init__(self, book: SavedBook, tensor: torch.Tensor, site: Site | None) -> None:
        self.book = book
        # Not `tensor` itself: an output saved with its own grad_fn would be a reference cycle.
        self.tensor: torch.Tensor | None = tensor.detach()
        self.site = site
        self.unpacks = 0
        self.retains: list[tuple[Retention, int]] = []
        self.info = tensor_info(tensor)
        self.key = self.info.key if self.info is not None else 0
        self.nbytes = self.info.nbytes if self.info is not None else 0
        self.activation = self.info is not None and self.info.activation

    def __del__(self) -> None:
        if self.book.active:
            self.book.released(self)

    def drop(self) -> int:
        """Let go of the tensor; the bytes this freed (0 when something else still holds it)."""
        if self.tensor is None or self.info is None or self.info.param:
            return 0
        ref = StorageWeakRef(self.tensor.untyped_storage())
        self.tensor = None
        return self.nbytes if ref.expired() else 0


class SavedBook:
    """Saved-tensor hooks that count, per line, the saved tensors backward used or never used.

    When a saved tensor no backward used is released, the book lets go of it and looks whether
    that freed its storage: if so, only the graph was keeping it (hidden activations, a batch
    no variable holds any more); if not, something else holds it anyway (the output in `out`).
    A "burst" is what a line's graphs freed between two packs: the graph of one forward pass,
    released when the variable holding it is rebound. The largest burst per line is the memory
    one pass held for nothing.
    """

    def __init__(self, clock: Clock, failsafe: Failsafe) -> None:
        self.clock = clock
        self.failsafe = failsafe
        self.sites: dict[Site | None, SiteStats] = {}
        self.live: weakref.WeakSet[_Saved] = weakref.WeakSet()
        self.retentions: list[Retention] = []
        self.active = True
        self._bursting: list[SiteStats] = []

    def pack(self, t: torch.Tensor) -> Any:
        """The saved tensor's handle; the tensor itself (detached, as autograd keeps it without
        hooks) while the doctor pauses, once it stopped, or when making the handle failed."""
        if self.clock.paused or self.clock.stopped:
            return t.detach()
        try:
            return self._handle(t, sys._getframe(1))
        except Exception as e:
            self.failsafe.trip("recording a tensor saved for backward", e)
            return t.detach()

    def _handle(self, t: torch.Tensor, frame: Any) -> _Saved:
        self.new_burst()
        site = self.clock.site_here(frame)
        if site not in self.sites:
            self.sites[site] = SiteStats(order=len(self.sites))
        handle = _Saved(self, t, site)
        self.live.add(handle)
        return handle

    def unpack(self, handle: Any) -> torch.Tensor:
        if isinstance(handle, torch.Tensor):
            return handle
        if not self.clock.stopped:
            with self.failsafe.guard("counting a use of a tensor saved for backward"):
                if handle.unpacks == 0:
                    self.sites[handle.site].used += 1
                handle.unpacks += 1
        # A handle lets go of its tensor only when autograd released it (`released`).
        assert handle.tensor is not None, "a released saved tensor was unpacked"
        return handle.tensor

    def released(self, handle: _Saved) -> None:
        """A handle was released by autograd (from its `__del__`, inside the user's code)."""
        if not self.clock.stopped:
            with self.failsafe.guard("counting a released tensor saved for backward"):
                self._released(handle)

    def _released(self, handle: _Saved) -> None:
        freed = handle.drop() if handle.retains or not handle.unpacks else 0
        for rec, unpacks_then in handle.retains:
            rec.alive -= 1
            rec.freed += freed
            rec.reused = rec.reused or handle.unpacks > unpacks_then
            if rec.alive == 0:
                rec.bytes = rec.freed
        if handle.unpacks:
            return
        stats = self.sites[handle.site]
        stats.unused += 1
        stats.steps.add(self.clock.step)
        if freed:
            if not stats.burst:
                self._bursting.append(stats)
            stats.burst += freed
            stats.max_burst = max(stats.max_burst, stats.burst)

    def new_burst(self) -> None:
        for stats in self._bursting:
            stats.burst = 0
        self._bursting.clear()

    def retain(self, site: Site | None, roots: list[torch.Tensor]) -> None:
        handles = graph_handles(roots)
        activations = {h.key: h.nbytes for h in handles if h.activation}
        rec = Retention(site, sum(activations.values()), alive=len(handles))
        for h in handles:
            h.retains.append((rec, h.unpacks))
        self.retentions.append(rec)

    def close(self) -> None:
        """At exit: graphs still alive and never used count as unused; stop listening.

        What such a graph alone keeps is what it saved that no Python tensor holds (one scan of
        the heap for the tensors alive at exit).
        """
        self.new_burst()
        self.active = False
        live = list(self.live)
        handles = [h for h in live if h.unpacks == 0 or h.retains]
        elsewhere = _python_storages({id(h.tensor) for h in live}) if handles else set()
        unused: dict[Site | None, dict[int, int]] = {}
        retained: dict[int, tuple[Retention, dict[int, int]]] = {}
        for h in handles:
            own = h.info is not None and not h.info.param and h.key not in elsewhere
            for rec, unpacks_then in h.retains:
                rec.reused = rec.reused or h.unpacks > unpacks_then
                keys = retained.setdefault(id(rec), (rec, {}))[1]
                if own:
                    keys[h.key] = h.nbytes
            if h.unpacks == 0:
                stats = self.sites[h.site]
                stats.unused += 1
                stats.steps.add(self.clock.step)
                keys = unused.setdefault(h.site, {})
                if own:
                    keys[h.key] = h.nbytes
        for site, keys in unused.items():
            self.sites[site].max_burst = max(self.sites[site].max_burst, sum(keys.values()))
        for rec, keys in retained.values():
            rec.bytes = sum(keys.values())


def _python_storages(exclude: set[int]) -> set[int]:
    """Storage keys of the tensors Python holds, but those whose ids are in `exclude`."""
    keys = set()
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor) and id(obj) not in exclude:
            info = tensor_info(obj)
            if info is not None:
                keys.add(info.key)
    return keys
