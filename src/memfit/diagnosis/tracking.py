"""The recorders behind `memfit.doctor`: what the training loop creates and keeps.

Three recorders run inside the `with doctor():` block, each costing one Python call per event:

* `GradTracker` (a TorchFunctionMode): every tensor returned to Python with a `grad_fn` is
  remembered weakly, with the user line that made it (`doctor_sites.site_of`). It also sees
  `backward(retain_graph=True)` calls.
* `StorageTracker` (a TorchDispatchMode over a `memfit.storage_ledger.StorageLedger`): every
  new storage (forward, backward, optimizer) is remembered with its size, line and step until
  it is freed, so live tensor bytes can be summed on any device, and those of one step's
  working set told from those that outlive it. The ledger keeps identity and frees; the
  lines (sites) and steps are the doctor's own.
* `doctor_saved.SavedBook` (saved-tensor hooks): which saved tensors a backward used.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from memfit.diagnosis.saved_tensors import SavedBook
from memfit.diagnosis.sites import Clock, Site
from memfit.errors import Failsafe
from memfit.storage_ledger import StorageLedger, storage_key

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_BACKWARD_FUNCS = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)
_SIGNATURES = {f: inspect.signature(f) for f in _BACKWARD_FUNCS}
_ROOT_ARG = {torch.Tensor.backward: "self", torch.autograd.backward: "tensors"}


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


class GradTracker(TorchFunctionMode):
    """Remembers (weakly) each tensor with a grad_fn, and the line that made it."""

    def __init__(self, clock: Clock, book: SavedBook, failsafe: Failsafe) -> None:
        super().__init__()
        self.clock = clock
        self.book = book
        self.failsafe = failsafe
        self.sites: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        clock = self.clock
        if clock.stopped:
            return func(*args, **kwargs)
        if func in _BACKWARD_FUNCS and not clock.paused:
            return self._backward(func, args, kwargs)
        # The user's call first, outside any guard; then the doctor's own bookkeeping.
        out = func(*args, **kwargs)
        if not clock.paused and torch.is_grad_enabled():
            try:
                self._remember(out, sys._getframe(1))
            except Exception as e:
                self.failsafe.trip("recording where a tensor was made", e)
        return out

    def _remember(self, out: Any, frame: Any) -> None:
        site: Site | None = None
        for t in _tensors(out):
            if t.grad_fn is not None:
                site = site or self.clock.site_here(frame)
                self.sites[t] = site

    def _backward(self, func: Any, args: tuple, kwargs: dict) -> Any:
        site = self.failsafe.call(
            "finding the line of a backward", self.clock.site_here, sys._getframe(2), default=None
        )
        outer, self.clock.site = self.clock.site, site
        try:
            out = func(*args, **kwargs)
        finally:
            self.clock.site = outer
        if not self.clock.stopped:
            with self.failsafe.guard("recording backward(retain_graph=True)"):
                bound = _SIGNATURES[func].bind(*args, **kwargs).arguments
                if bound.get("retain_graph"):
                    self.book.retain(site, _tensors(bound.get(_ROOT_ARG.get(func, "outputs"))))
        return out


@dataclass(slots=True)
class StorageRecord:
    """A live storage the doctor saw made."""

    nbytes: int
    site: Site | None
    step: int  # the step that made it
    device: torch.device
    #: Made at its line from a storage that line made in an earlier step (`history =
    #: torch.cat([history, x])`): a value carried across steps in a new storage.
    carried: bool


def _arg_tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors among an op's arguments, and in its list arguments (`cat`'s inputs)."""
    out: list[torch.Tensor] = []
    for a in (*args, *kwargs.values()):
        out.extend(_tensors(a))
    return out


class StorageTracker(TorchDispatchMode):
    """Remembers each storage created until it is freed, with its size, the line and the step
    that made it, and whether it carries a value of that line across steps."""

    def __init__(self, clock: Clock, failsafe: Failsafe) -> None:
        super().__init__()
        self.clock = clock
        self.failsafe = failsafe
        #: The live storages made inside the block, by StorageImpl address (`storage_key`).
        self.ledger: StorageLedger[StorageRecord] = StorageLedger()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self.ledger.close()  # no finalizer of the doctor's outlives its block

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # The user's op first, outside any guard (its exceptions, a real OutOfMemoryError, are
        # the user's); then the doctor's bookkeeping, whose failure stops the doctor.
        out = func(*args, **kwargs)
        if not (self.clock.paused or self.clock.stopped):
            try:
                for t in _tensors(out):
                    self._record(t, args, kwargs)
            except Exception as e:
                self.failsafe.trip(f"recording the storages of the aten op {func}", e)
        return out

    def _record(self, t: torch.Tensor, args: tuple, kwargs: dict) -> None:
        if type(t) is not torch.Tensor or t.layout != torch.strided or t.is_nested:
            return
        storage = t.untyped_storage()
        key = storage_key(storage)
        ledger = self.ledger
        if ledger.id_at(key) is not None:
            return
        nbytes = storage.nbytes()
        if nbytes == 0 or storage.device.type == "meta":
            return
        sources = [
            storage_key(a.untyped_storage())
            for a in _arg_tensors(args, kwargs)
            if type(a) in _PLAIN and a.layout == torch.strided and not a.is_nested
        ]
        if key in sources:
            return  # a view, in-place op or out= of a storage made before the doctor started
        site = self.clock.site_here(sys._getframe(2))
        step = self.clock.step
        carried = False
        for rid in map(ledger.id_at, sources):
            src = ledger.records[rid] if rid is not None else None
            if src is not None and src.site == site and src.step < step:
                carried = True
                break
        record = StorageRecord(nbytes, site, step, storage.device, carried)
        ledger.add(storage, ledger.new_id(), record)

    def live(
        self, exclude: dict[int, int], step: int
    ) -> tuple[int, dict[Site | None, int], list[tuple[int, torch.device]]]:
        """Live bytes of the recorded storages not in `exclude` that outlived the step that made
        them (made before `step`) or carry a value across steps: in all and per line; and the
        (size, device) of the others, the current step's working set (a batch, its outputs)."""
        total = 0
        by_site: dict[Site | None, int] = {}
        working: list[tuple[int, torch.device]] = []
        records = self.ledger.records
        for key, rid in self.ledger.live_items():
            if key in exclude:
                continue
            rec = records[rid]
            if rec.step < step or rec.carried:
                total += rec.nbytes
                by_site[rec.site] = by_site.get(rec.site, 0) + rec.nbytes
            else:
                working.append((rec.nbytes, rec.device))
        return total, by_site, working

    def keys_at(self, site: Site | None) -> set[int]:
        records = self.ledger.records
        return {k for k, rid in self.ledger.live_items() if records[rid].site == site}
