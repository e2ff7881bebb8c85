"""Walks of autograd graphs for `memfit.doctor`: which graphs are old, and what they pin.

# Note: [Old autograd nodes]
Every autograd node gets a sequence number from a per-thread counter when it is created
(`node._sequence_nr()`), so "created before the previous step boundary" is one integer
comparison: the doctor reads the counter at each boundary (`sequence_mark`). Nodes that
accumulate into leaves (`AccumulateGrad`) carry the largest number and are never old; parameters
are not a leak.

A graph's memory is the tensors its nodes saved for backward. They are read without unpacking
them (`node._raw_saved_<name>.data`): the data is the doctor's handle when the tensor was saved
under its hooks, the tensor itself otherwise, and None once backward freed it. Storages are
counted once each, never parameters (leaves that require grad, and views of them). A graph kept
past its step pins everything else it saved (inputs too: the batch of step 3 stays alive as
long as the graph of step 3 does). `doctor_track.SavedBook` measures graphs that no backward
used differently: by what their death actually freed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

#: Nodes visited per boundary before a walk gives up and reports a lower bound. About 0.1 s of
#: Python on a laptop; only a graph that has already grown for thousands of steps reaches it.
WALK_BUDGET_NODES = 200_000

_raw_names: dict[type, tuple[str, ...]] = {}
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def sequence_mark() -> int:
    """The next autograd sequence number of this thread (see Note [Old autograd nodes])."""
    with torch.inference_mode(False), torch.enable_grad():
        probe = torch.empty(0, requires_grad=True).view(0)
    node = probe.grad_fn
    assert node is not None
    return int(node._sequence_nr())


def node_seq(node: Any) -> int:
    return int(node._sequence_nr())


def children(node: Any) -> list[Any]:
    return [n for n, _ in node.next_functions if n is not None]


class StorageInfo(NamedTuple):
    key: int  # the StorageImpl address: unique among live storages
    nbytes: int
    activation: bool  # requires grad and is not a parameter
    param: bool  # a leaf that requires grad (a parameter), or a view of one


def tensor_info(t: torch.Tensor) -> StorageInfo | None:
    """What a tensor's storage is, or None when it has none (sparse, nested, meta, empty).

    Tensor subclasses (DTensor, quantized wrappers) are not looked into: None.
    """
    if type(t) not in _PLAIN or t.layout != torch.strided or t.is_nested:
        return None
    storage = t.untyped_storage()
    if storage.device.type == "meta" or storage.nbytes() == 0:
        return None
    base = t._base if t._is_view() else None
    grad = bool(t.requires_grad)
    param = grad and (t.is_leaf or (base is not None and base.is_leaf))
    return StorageInfo(storage._cdata, storage.nbytes(), grad and not param, param)


def saved_items(node: Any) -> Iterator[Any]:
    """The live saved data of a node: doctor handles or tensors (freed ones are skipped)."""
    names = _raw_names.get(type(node))
    if names is None:
        names = tuple(a for a in dir(node) if a.startswith("_raw_saved_"))
        _raw_names[type(node)] = names
    for name in names:
        value = getattr(node, name)
        for saved in value if isinstance(value, (tuple, list)) else (value,):
            data = getattr(saved, "data", None)
            if data is not None:
                yield data


def item_info(data: Any) -> StorageInfo | None:
    """`tensor_info` of a saved item: a tensor, or a doctor handle (which carries its info)."""
    if isinstance(data, torch.Tensor):
        return tensor_info(data)
    info: StorageInfo | None = data.info
    return info


#: Bits of `chain_flags`' walk: the graph reaches a node made before the boundary before the
#: previous one (`_OLDER`), or one made between that boundary and the previous one (`_OLD`).
_OLDER, _OLD = 1, 2


def chain_flags(
    tensors: list[torch.Tensor],
    threshold: int,
    older: int | None,
    root_node_ids: set[int],
    keep: list[Any],
) -> list[bool]:
    """For each tensor: does its graph chain steps, reaching nodes from at least two steps
    before the previous boundary?

    `threshold` is the sequence mark of the previous boundary, `older` the one before (None at
    the first boundaries: no chain yet). A graph that reaches nodes made before `older` and
    nodes made between `older` and `threshold` was built across steps (`total_loss += loss`, a
    hidden state not detached). One that reaches nodes of one step only uses a tensor made
    before a boundary that fell mid-step (a GAN whose generator's output is used after the
    discriminator's optimizer step): not a chain. `root_node_ids` are the ids of the `grad_fn`
    of tensors that are themselves old (reported on their own); the walk stops there. `keep`
    holds the node objects alive for the duration of the analysis, so that ids stay unique.
    """
    if older is None:
        return [False] * len(tensors)
    memo: dict[int, int] = {}
    out = []
    for t in tensors:
        start = t.grad_fn
        stack = [start]
        while stack:
            node = stack[-1]
            i = id(node)
            if i in memo:
                stack.pop()
                continue
            keep.append(node)
            seq = node_seq(node)
            if i in root_node_ids or seq < older:
                memo[i] = 0 if i in root_node_ids else _OLDER
                stack.pop()
                continue
            kids = children(node)
            keep.extend(kids)
            pending = [k for k in kids if id(k) not in memo]
            if pending:
                stack.extend(pending)
                continue
            bits = _OLD if seq < threshold else 0
            for k in kids:
                bits |= memo[id(k)]
            memo[i] = bits
            stack.pop()
        out.append(memo[id(start)] == _OLDER | _OLD)
    return out


def behind(t: torch.Tensor, node_ids: set[int], threshold: int, keep: list[Any]) -> bool:
    """Does the recent part of `t`'s graph go through one of the nodes `node_ids`?

    A loss computed from a hidden state that chains every step (`h = rnn(x, h)`) reaches the
    old nodes only through `h`: `h` is what keeps them, and the loss is not reported.
    """
    start = t.grad_fn
    seen: set[int] = set()
    stack = children(start)
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        keep.append(node)
        if id(node) in node_ids and node is not start:
            return True
        if node_seq(node) >= threshold:
            stack.extend(children(node))
    return False


@dataclass
class Pinned:
    """What a group of held tensors keeps alive (see Note [Old autograd nodes])."""

    bytes: int = 0
    keys: dict[int, int] = field(default_factory=dict)  # storage key -> bytes
    nodes: int = 0
    truncated: bool = False


def pinned(
    tensors: Iterable[torch.Tensor], threshold: int, visited: set[int], keep: list[Any]
) -> Pinned:
    """Storages kept by `tensors` and by the old part of their graphs (nodes < `threshold`).

    `visited` is shared between the groups of one analysis so that a node (and what it saved)
    is charged to one group only; its size bounds the walk (`WALK_BUDGET_NODES`).
    """
    out = Pinned()
    stack = []
    for t in tensors:
        info = tensor_info(t)
        if info is not None and not info.param:
            _add(out, info.key, info.nbytes)
        stack.append(t.grad_fn)
    while stack:
        node = stack.pop()
        if node is None or id(node) in visited:
            continue
        if len(visited) >= WALK_BUDGET_NODES:
            out.truncated = True
            break
        visited.add(id(node))
        keep.append(node)
        if node_seq(node) < threshold:
            out.nodes += 1
            for data in saved_items(node):
                info = item_info(data)
                if info is not None and not info.param:
                    _add(out, info.key, info.nbytes)
        stack.extend(children(node))
    return out


def _add(p: Pinned, key: int, nbytes: int) -> None:
    if key not in p.keys:
        p.keys[key] = nbytes
        p.bytes += nbytes


def graph_handles(roots: Iterable[torch.Tensor]) -> list[Any]:
    """The doctor handles saved anywhere in the graphs of `roots` (after a retained backward)."""
    seen: set[int] = set()
    keep: list[Any] = []
    handles: list[Any] = []
    stack = [t.grad_fn for t in roots if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        keep.append(node)
        handles.extend(d for d in saved_items(node) if not isinstance(d, torch.Tensor))
        stack.extend(children(node))
    return handles
