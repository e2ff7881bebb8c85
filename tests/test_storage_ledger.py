"""The storage ledger (memfit.storage_ledger): identity, records, frees, iteration; exact bytes."""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from memfit.storage_ledger import StorageLedger, storage_key


@dataclass
class Made:
    nbytes: int
    name: str = ""


def _ledger(keep_freed: bool = False) -> tuple[StorageLedger[Made], list[tuple[int, Made]]]:
    freed: list[tuple[int, Made]] = []
    return StorageLedger(lambda rid, rec: freed.append((rid, rec)), keep_freed=keep_freed), freed


def _add(ledger: StorageLedger[Made], t: torch.Tensor, name: str = "") -> int:
    s = t.untyped_storage()
    return ledger.add(s, ledger.new_id(), Made(s.nbytes(), name))


def test_a_3x4_fp32_tensor_is_48_bytes_and_its_free_calls_back_once():
    ledger, freed = _ledger()
    t = torch.empty(3, 4)  # (3, 4) fp32: 3 * 4 * 4 bytes
    rid = _add(ledger, t, "t")
    assert (rid, ledger.live_ids(), ledger.live_bytes(), len(ledger)) == (0, [0], 48, 1)
    del t
    gc.collect()
    assert freed == [(0, Made(48, "t"))]
    assert (ledger.live_ids(), ledger.live_bytes(), ledger.records) == ([], 0, {})


def test_a_view_shares_its_storage():
    ledger, freed = _ledger()
    t = torch.empty(3, 4)
    _add(ledger, t)
    v, row = t.view(12), t[1]  # (12,) and (4,): the same 48-byte storage
    assert storage_key(v.untyped_storage()) == storage_key(t.untyped_storage())
    assert ledger.id_of(v.untyped_storage()) == ledger.id_of(row.untyped_storage()) == 0
    del t, v
    assert freed == []  # `row` still holds the storage
    del row
    assert freed == [(0, Made(48))]


def test_the_storages_python_handle_may_die_before_the_storage():
    """PyTorch keeps a storage's Python object while the storage lives: the free is its
    memory's, not its handle's."""
    ledger, freed = _ledger()
    t = torch.empty(2, 8, dtype=torch.float16)  # 2 * 8 * 2 = 32 bytes
    _add(ledger, t)
    gc.collect()  # no Python name holds the storage object now; the tensor does
    assert freed == [] and ledger.live_bytes() == 32
    del t
    assert freed == [(0, Made(32))]


def test_live_storages_iterate_in_allocation_order_and_count_once():
    ledger, _ = _ledger()
    a, b, c = torch.empty(10), torch.empty(5, dtype=torch.float64), torch.empty(7, dtype=torch.int8)
    for t in (a, b, c):
        _add(ledger, t)
    # 10 * 4 + 5 * 8 + 7 * 1 = 87 bytes
    assert ledger.live_bytes() == 87 and ledger.live_ids() == [0, 1, 2]
    keys = [storage_key(t.untyped_storage()) for t in (a, b, c)]
    assert ledger.live_items() == list(zip(keys, [0, 1, 2], strict=True))
    del b
    assert ledger.live_ids() == [0, 2] and ledger.live_bytes() == 47


def test_fake_storages_have_keys_and_frees_too():
    ledger, freed = _ledger()
    with FakeTensorMode():
        t = torch.empty(1024, 1024, device="cpu")  # fp32: 4 MiB, no memory of its own
        _add(ledger, t)
        assert ledger.id_of(t.t().untyped_storage()) == 0
        assert ledger.live_bytes() == 4 * 1024 * 1024
        del t
    assert freed == [(0, Made(4 * 1024 * 1024))]


def test_release_ends_an_allocation_and_the_finalizer_frees_the_next():
    """A resize: the storage object stays; the mode ends its allocation and files a new one."""
    ledger, freed = _ledger(keep_freed=True)
    t = torch.empty(16)  # 64 bytes
    s = t.untyped_storage()
    _add(ledger, t)
    assert ledger.release(s) == 0 and freed == []  # the mode records that free itself
    assert ledger.live_bytes() == 0 and ledger.records == {0: Made(64)}  # kept: keep_freed
    assert ledger.release(s) is None
    s.resize_(128)
    ledger.add(s, ledger.new_id(), Made(128))
    del t, s
    assert freed == [(1, Made(128))]  # once, for the allocation live at the free
    assert ledger.records == {0: Made(64), 1: Made(128)}


def test_a_storage_released_to_nothing_is_not_freed_again():
    ledger, freed = _ledger()
    t = torch.empty(4)
    _add(ledger, t)
    ledger.release(t.untyped_storage())
    del t
    assert freed == [] and ledger.records == {}


def test_frees_held_take_effect_after_the_block_newest_first():
    ledger, freed = _ledger()
    a, b = torch.empty(2), torch.empty(3)  # 8 and 12 bytes
    _add(ledger, a)
    _add(ledger, b)
    with ledger.holding_frees():
        del a, b
        assert freed == [] and ledger.live_bytes() == 20  # still live inside
    assert freed == [(1, Made(12)), (0, Made(8))] and ledger.live_bytes() == 0


def test_records_without_a_storage_and_ids_across_clear():
    ledger, _ = _ledger()
    rid = ledger.new_id()
    ledger.records[rid] = Made(1 << 20, "workspace")  # a cuBLAS workspace: no storage
    assert ledger.live_ids() == [] and ledger.records[0].nbytes == 1 << 20
    t = torch.empty(1)
    _add(ledger, t)
    ledger.clear()
    assert (ledger.records, ledger.live_ids(), ledger.new_id()) == ({}, [], 2)


def test_close_detaches_every_finalizer():
    ledger, freed = _ledger()
    t = torch.empty(8)
    _add(ledger, t)
    ledger.close()
    del t
    assert freed == [] and ledger.live_bytes() == 32  # the state stays as it was
