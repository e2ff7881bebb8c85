"""The storage ledger: which storages are alive, each one's record, and the call at its free.

Three modes watch storages come and go: the estimator's tracer
(`memfit.estimator.trace.tracker.Tracker`, fake storages), the simulated GPU
(`memfit.simulation.simulated_gpu`, real or fake storages malloc'ed in a simulated allocator)
and the doctor's storage recorder (`memfit.diagnosis.tracking`, the user's real storages).
Each is a thin mode over one `StorageLedger`, which owns what they share
(as MemTracker's `_WeakRefInfo` table does for torch.distributed._tools):

- identity: `storage_key`, the address of the storage's StorageImpl, the same for every
  Python handle of one storage and for real and fake (meta) storages alike;
- the record of each live storage, of the mode's own type (it carries `nbytes`), under an id
  the ledger hands out (`new_id`); records with no storage (a cuBLAS workspace) take ids too;
- the free: one weak reference with a callback per storage object (a finalizer), which ends
  whatever allocation of it is live when PyTorch releases its memory, then calls the mode's
  `on_free(id, record)`. A plain `weakref.ref` held by the ledger, as MemTracker's, not a
  `weakref.finalize`: about a tenth of its cost per storage, which the doctor pays inside
  the user's loop;
- iteration over the live storages, in allocation order.

A storage's Python object lives exactly as long as the storage (PyTorch keeps the object of
a storage that C++ still holds: PyObject preservation), so its finalizer runs at the free,
once. A storage that stays but changes size (FSDP2's `resize_(0)`) is ended by the mode with
`release`; its finalizer stays for the next allocation of the same storage.

Example (a record type of one's own; a mode keeps what it needs in it):
    >>> @dataclasses.dataclass
    ... class Made:
    ...     nbytes: int
    >>> ledger: StorageLedger[Made] = StorageLedger(on_free=lambda rid, rec: print(rid, rec))
    >>> t = torch.empty(3, 4)  # (3, 4) fp32: 48 bytes
    >>> ledger.add(t.untyped_storage(), ledger.new_id(), Made(t.untyped_storage().nbytes()))
    0
    >>> ledger.live_bytes()
    48
    >>> del t
    0 Made(nbytes=48)
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, Protocol, TypeVar

import torch

__all__ = ["SizedRecord", "StorageLedger", "storage_key"]


class SizedRecord(Protocol):
    """What a ledger needs of a record: the bytes of the storage it stands for."""

    @property
    def nbytes(self) -> int: ...


R = TypeVar("R", bound=SizedRecord)


def storage_key(storage: torch.UntypedStorage) -> int:
    """The identity of an untyped storage: its StorageImpl's address.

    Every Python handle of one storage gives the same key, for a real storage and for a fake
    tensor's (meta) storage; no two live storages share one (an address is reused only after
    the storage's finalizer has run).
    """
    return int(storage._cdata)


class StorageLedger(Generic[R]):
    """The live storages of one mode, by key, with their records.

    Args:
        on_free: called as `on_free(id, record)` when PyTorch frees a live storage (not at
            `release`, which the mode calls itself). It runs inside whatever op or Python code
            dropped the storage; held while `holding_frees` is active.
        keep_freed: keep the records of freed storages in `records` (a trace's history);
            by default a record goes with its storage.
    """

    def __init__(
        self, on_free: Callable[[int, R], None] | None = None, *, keep_freed: bool = False
    ) -> None:
        #: id -> record: live storages, records without storage, freed ones (`keep_freed`).
        self.records: dict[int, R] = {}
        self.next_id = 0
        self._on_free = on_free
        self._keep_freed = keep_freed
        self._live: dict[int, int] = {}  # storage key -> id, in allocation order
        self._finalizers: dict[int, _Finalizer] = {}  # storage key -> its finalizer
        self._held: list[tuple[int, int]] | None = None  # (key, id) freed while holding

    def new_id(self) -> int:
        """A new record id (ids are never reused, also across `clear`)."""
        rid = self.next_id
        self.next_id += 1
        return rid

    # -- identity ---------------------------------------------------------------------------

    def id_at(self, key: int) -> int | None:
        """The id of the live allocation of the storage with `key`, or None."""
        return self._live.get(key)

    def id_of(self, storage: torch.UntypedStorage) -> int | None:
        """The id of `storage`'s live allocation, or None."""
        return self._live.get(storage_key(storage))

    # -- allocation and free ----------------------------------------------------------------

    def add(self, storage: torch.UntypedStorage, rid: int, record: R) -> int:
        """File `record` under `rid` as the live allocation of `storage`; returns `rid`.

        A storage is watched by one finalizer for its whole life, whatever its allocations.
        """
        key = storage_key(storage)
        self.records[rid] = record
        self._live[key] = rid
        if key not in self._finalizers:
            f = _Finalizer(storage, self._fired)
            f.key = key
            self._finalizers[key] = f
        return rid

    def release(self, storage: torch.UntypedStorage) -> int | None:
        """End `storage`'s live allocation while the storage object stays (a `resize_`); the
        id it had, or None. `on_free` is not called: the mode that releases records it."""
        rid = self._live.pop(storage_key(storage), None)
        if rid is not None and not self._keep_freed:
            self.records.pop(rid, None)
        return rid

    def _fired(self, finalizer: _Finalizer) -> None:
        # A finalizer: its storage is being freed (its address is not reused before this).
        key = finalizer.key
        if self._finalizers.get(key) is not finalizer:  # detached by `close`
            return
        del self._finalizers[key]
        rid = self._live.get(key)
        if rid is None:  # released earlier (resized to nothing)
            return
        if self._held is not None:
            self._held.append((key, rid))
            return
        self._free(key, rid)

    def _free(self, key: int, rid: int) -> None:
        if self._live.get(key) == rid:
            del self._live[key]
        record = self.records[rid] if self._keep_freed else self.records.pop(rid, None)
        if self._on_free is not None and record is not None:
            self._on_free(rid, record)

    @contextmanager
    def holding_frees(self) -> Iterator[None]:
        """Frees that happen inside the block (a garbage-collector pass inside a simulated
        malloc) take effect at its end, the newest first: the block sees the storages as
        still live."""
        if self._held is not None:  # nested: the outer block applies them
            yield
            return
        self._held = []
        try:
            yield
        finally:
            held, self._held = self._held, None
            while held:
                self._free(*held.pop())

    # -- iteration ----------------------------------------------------------------------------

    def live_ids(self) -> list[int]:
        """The ids of the live allocations, in allocation order."""
        return list(self._live.values())

    def live_items(self) -> list[tuple[int, int]]:
        """(storage key, id) of the live allocations, in allocation order."""
        return list(self._live.items())

    def live_bytes(self) -> int:
        """The bytes of the live storages, each counted once."""
        records = self.records
        return sum(records[rid].nbytes for rid in self._live.values())

    def __len__(self) -> int:
        return len(self._live)

    # -- end ------------------------------------------------------------------------------------

    def close(self) -> None:
        """Detach every finalizer: no free is seen after this (the state stays as it is)."""
        self._finalizers = {}  # a dropped weak reference calls nothing

    def clear(self) -> None:
        """Forget every storage and record (after `close`); ids keep counting."""
        self.close()
        self.records.clear()
        self._live.clear()
        if self._held is not None:
            self._held.clear()


class _Finalizer(weakref.ref):
    """A weak reference to a storage whose callback is its ledger's; it knows the storage's
    key, which the dead storage can no longer give."""

    __slots__ = ("key",)
    key: int
