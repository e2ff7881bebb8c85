"""The tracker: every storage allocated and freed during a step, with who and why.

`Tracker` is a TorchDispatchMode below autograd: it sees every aten kernel that runs, backward's
too. It is a mode over a `memfit.storage_ledger.StorageLedger`, which keeps the storages'
identity, their records (kept after the free: the trace's history) and the finalizer that
records a free exactly when its memory is released. A storage it has not seen is a new
allocation; views, in-place results and tied weights share a storage and are counted once.
What is the tracker's own: categories, module and owner attribution, and the event timeline.

Context of each event:
- phase ("forward", "backward", "optimizer", "zero_grad", "setup") and step, set by the driver;
- module path: in forward, from global module hooks; in backward, from autograd-node metadata.
  At each module boundary the tracker walks the new part of the autograd graph and tags its
  nodes with the module (see Note: [Backward attribution]);
- op: the aten op that allocated (or during which the free happened);
- owner: the index of the repeated block (e.g. decoder layer) the event belongs to, which the
  replay of repeated blocks needs.

Note: [Backward attribution]
    In backward, no module hook runs, but `torch._C._current_autograd_node()` returns the node
    being executed, and every node has a `metadata` dict. Before a module's forward starts we
    tag the untagged nodes reachable from its inputs with the enclosing module; when it ends we
    tag the untagged nodes reachable from its outputs with the module itself. Walks stop at
    tagged nodes, so each node is visited once and belongs to the innermost module that created
    it.

Categories (`CATEGORIES`) are decided per storage and revised once its role is known: a forward
allocation outliving its region is an activation, else a temporary; gradients and optimizer
state are found in `.grad` and `optimizer.state`."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from memfit._compat import aten_op
from memfit.errors import Failsafe
from memfit.estimator.flops import counted_flops
from memfit.estimator.trace.value_reads import certain_value, note_certain_value
from memfit.events import ALLOC, FREE, RELEASE_OP, Category, Event, StorageRecord
from memfit.storage_ledger import StorageLedger
from memfit.techniques.checkpointing import region_listeners

#: Ops that materialise `torch.tensor(...)` constants. Without a device argument these are
#: created on the CPU on a CUDA machine too.
SCALAR_CONSTANT_OPS = frozenset({"lift_fresh.default", "lift_fresh_copy.default"})

META_KEY = "memfit"

#: aten::_grouped_mm (MoE experts), from torch 2.8; None on a torch without it.
_GROUPED_MM = aten_op("_grouped_mm")


def memory_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose storage holds `t`'s memory: a DTensor's local shard (FSDP2, tensor
    parallel), else `t`. A DTensor is a wrapper without memory of its own."""
    dt = sys.modules.get("torch.distributed.tensor")
    if dt is not None and isinstance(t, dt.DTensor):
        return t._local_tensor
    return t


def parameter_modules(model: torch.nn.Module) -> dict[int, str]:
    """id(parameter) -> path of the module holding it ("" at the top); a tied parameter maps
    to the last module that holds it."""
    return {
        id(p): n.rsplit(".", 1)[0] if "." in n else ""
        for n, p in model.named_parameters(remove_duplicate=False)
    }


class Tracker(TorchDispatchMode):
    """Records allocations and frees of storages. Use as a context manager around the step.

    Args:
        model: the traced model (module paths are taken from its `named_modules`).
        block_paths: module paths of the repeated blocks, in order; the owner of an event is the
            index of the block it happens in, or -1.

    A trace (fake tensors) raises whatever goes wrong, and the estimator reports it as a
    TraceError. A live tracker (`memfit.measure`, over the user's real steps) has a
    `failsafe`: the user's op always runs first and outside it, and a failure of the
    tracker's own bookkeeping (after an op, in its module hooks, at a free) makes it step
    aside (`step_aside`): it stops recording and passes every later op straight through.
    """

    #: Set on live trackers (memfit.errors.Failsafe); None while tracing fake tensors.
    failsafe: Failsafe | None = None

    def __init__(self, model: torch.nn.Module, block_paths: Iterable[str] = ()) -> None:
        super().__init__()
        #: The storages: identity, records by sid (freed ones kept), finalizers.
        self.ledger: StorageLedger[StorageRecord] = StorageLedger(self._on_free, keep_freed=True)
        self.records = self.ledger.records
        self.events: list[Event] = []
        self.phase = "setup"
        self.step = 0
        self._op = RELEASE_OP
        self._stack: list[tuple[str, int]] = []
        self._region = 0
        self._region_counter = 0
        self._closed = False
        self._hooks: list[Any] = []
        self._names: dict[int, str] = {}
        self._owner: dict[int, int] = {}
        self._owner_by_name: dict[str, int] = {}
        self.add_model(model, block_paths)
        self.attention_backends: list[str] = []
        #: Step -> gradient storage of each trainable parameter (step_runner._optimizer_phase).
        self.grad_sids: dict[int, list[int | None]] = {}
        #: Owner of the parameter the optimizer works on (set by OwnerTrackingState), used for
        #: allocations with no tensor input, such as Adam's `state["step"]`.
        self.param_owner = -1
        self.param_module = ""
        #: True when the optimizer keeps its step counters on the host (foreach, not
        #: capturable): scalar constants it creates (`torch.tensor(1.0)` step increments, the
        #: counters themselves) then live in host memory on CUDA too.
        self.optimizer_host_scalars = False
        #: True while an optimizer steps inside backward (optimizer step in backward): its
        #: host scalars are host memory as in the optimizer phase.
        self.stepping_in_backward = False
        self._free_owner: dict[int, int] = {}
        #: FLOPs by (step, phase, owner), counted with PyTorch's own formulas
        #: (torch.utils.flop_counter). Recomputation in backward is phase "recompute".
        self.flops: dict[tuple[int, str, int], int] = {}
        #: Ops whose FLOP formula raised, with why: their FLOPs are left out of `flops`.
        self.uncounted_flops: dict[str, str] = {}
        self.certain_values: dict[int, bool] = {}  # sid -> its value (value_reads)
        self.op_workspaces: Callable[[Tracker, str, Any, Any], None] | None = None  # cuDNN's

    def add_model(self, model: torch.nn.Module, block_paths: Iterable[str] = ()) -> None:
        """Name `model`'s modules by their paths in it (and their repeated-block owners)."""
        paths = list(block_paths)
        for name, mod in model.named_modules():
            self._names[id(mod)] = name
            inside = (i for i, p in enumerate(paths) if name == p or name.startswith(p + "."))
            owner = next(inside, -1)
            self._owner[id(mod)] = owner
            self._owner_by_name[name] = owner

    def named_modules(self) -> dict[int, str]:
        """id(module) -> path, for the modules of the models added so far."""
        return self._names

    def owner_of_path(self, path: str) -> int:
        """Index of the repeated block that module `path` belongs to, or -1."""
        return self._owner_by_name.get(path, -1)

    # -- context --------------------------------------------------------------------------

    def context(self) -> tuple[str, int]:
        """(module path, owner) of whatever is running now."""
        if self._stack:
            return self._stack[-1]
        if self.phase == "backward":
            node = torch._C._current_autograd_node()
            if node is not None:
                tag = node.metadata.get(META_KEY)  # type: ignore[attr-defined]
                if tag is not None:
                    return tag
        return ("", -1)

    def in_forward_region(self) -> bool:
        """True while forward code runs: the forward phase or a checkpoint recomputation."""
        return self.phase == "forward" or (self.phase == "backward" and bool(self._stack))

    def set_phase(self, phase: str, step: int | None = None) -> None:
        self.phase = phase
        if step is not None:
            self.step = step
        if phase == "forward":
            self._region_counter += 1
            self._region = self._region_counter
        else:
            self._region = 0

    # -- registration of pre-existing tensors -----------------------------------------------

    def register(
        self, tensor: torch.Tensor, category: str, module: str = "", owner: int = -1
    ) -> None:
        """Record a tensor that exists before tracing starts (parameters, buffers, inputs)."""
        self._track(tensor, category=category, module=module, owner=owner, op="<" + category + ">")

    def mark(
        self,
        tensor: torch.Tensor,
        category: str,
        *,
        host: bool = False,
        owner: int | None = None,
        paged: bool = False,
    ) -> None:
        """Revise the category of the storage behind `tensor` (e.g. a new gradient).

        `owner`, when given, is the block its free belongs to outside forward and backward:
        a gradient is released with its parameter, whichever block's backward allocated it.
        `paged`: CUDA unified memory (StorageRecord.paged).
        """
        sid = self.sid_of(tensor)
        if sid is None:
            return
        rec = self.records[sid]
        rec.category = category
        rec.host = host or paged
        rec.paged = paged
        if owner is not None:
            self._free_owner[sid] = owner

    def live_sids(self) -> list[int]:
        """The storages allocated and not yet freed, in allocation order."""
        return self.ledger.live_ids()

    def sid_of(self, tensor: torch.Tensor) -> int | None:
        return self.ledger.id_of(memory_tensor(tensor).untyped_storage())

    # -- dispatch ---------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._closed:  # the trace is over, or a live tracker stepped aside: the op alone
            return func(*args, **kwargs)
        name = func.__name__ if hasattr(func, "__name__") else str(func)
        # The op itself first, outside any guard: its exceptions (a real OutOfMemoryError)
        # are the caller's. Then the tracker's own bookkeeping.
        out = self._run_op(func, name, args, kwargs)
        if self._closed:
            return out
        if self.failsafe is None:
            self._record_op(func, name, args, kwargs, out)
            return out
        try:
            self._record_op(func, name, args, kwargs, out)
        except Exception as e:
            self.step_aside(f"recording the aten op {name}", e)
        return out

    def _run_op(self, func: Any, name: str, args: Any, kwargs: dict[str, Any]) -> Any:
        prev = self._op
        self._op = name  # the op during which frees happen
        try:
            if self.failsafe is None and func is _GROUPED_MM and args[0].dtype != torch.bfloat16:
                return _grouped_mm_other_dtype(*args, **kwargs)
            return func(*args, **kwargs)
        except DataDependentOutputException:
            # A certain value is answered (memfit.estimator.trace.value_reads). Optimizers read
            # scalars for arithmetic only (Adafactor's RMS, found-inf checks): a neutral 1 stands
            # in. In forward and backward a value can decide shapes, so it stays an error there.
            if (known := certain_value(self, func, args)) is not None:
                return known
            if func is not torch.ops.aten._local_scalar_dense.default or self.phase in (
                "forward", "backward"
            ):  # fmt: skip
                raise
            return True if args[0].dtype == torch.bool else 1
        finally:
            self._op = prev

    def _record_op(self, func: Any, name: str, args: Any, kwargs: dict[str, Any],
                   out: Any) -> None:  # fmt: skip
        """The tracker's bookkeeping of an op that ran: its FLOPs and its new storages."""
        n = counted_flops(func, name, args, kwargs, out, self.uncounted_flops)
        if n:
            phase = "recompute" if self.phase == "backward" and self._stack else self.phase
            key = (self.step, phase, self.context()[1])
            self.flops[key] = self.flops.get(key, 0) + n
        origins = None
        if not self._stack and self.phase in ("optimizer", "zero_grad"):
            origins = self._input_owners(name, args)
        leaves = pytree.tree_leaves(out)
        for i, t in enumerate(leaves):
            if isinstance(t, torch.Tensor):
                if origins is None:
                    self._track(t, op=name)
                else:
                    owner, module = origins[i] if i < len(origins) else origins[-1]
                    self._track(t, op=name, owner=owner, module=module)
        note_certain_value(self, func, args, out)
        if self.op_workspaces is not None:
            self.op_workspaces(self, name, args, out)

    def step_aside(self, where: str, error: BaseException) -> None:
        """A live tracker's own failure in `where`: stop recording (every later op passes
        straight through) and report it once through the failsafe."""
        self.close()
        if self.failsafe is None:  # a trace: the estimator reports it
            raise error
        self.failsafe.trip(where, error)

    def _guarded(self, where: str, fn: Callable[..., Any], *args: Any) -> None:
        """`fn(*args)`, bookkeeping run from a hook inside the user's code: on a live tracker,
        its failure steps aside instead of reaching the user's code."""
        if self.failsafe is None:
            fn(*args)
            return
        try:
            fn(*args)
        except Exception as e:
            self.step_aside(where, e)

    def _input_owners(self, name: str, args: Any) -> list[tuple[int, str]]:
        """(owner, module) of each output outside forward/backward: that of the matching input.

        `_foreach_*` ops map output i to element i of their first list argument; other ops
        take the first tensor input that belongs to a module; allocations with no such input
        belong to the parameter the optimizer is working on (OwnerTrackingState).
        """
        if name.startswith("_foreach") or name.startswith("_fused"):
            for a in args:
                if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
                    return [self._origin_of_tensor(t) for t in a]
        for t in pytree.tree_leaves(args):
            if isinstance(t, torch.Tensor):
                origin = self._origin_of_tensor(t)
                if origin[0] >= 0 or origin[1]:
                    return [origin]
        return [(self.param_owner, self.param_module)]

    def _origin_of_tensor(self, t: torch.Tensor) -> tuple[int, str]:
        sid = self.sid_of(t)
        if sid is None:
            return (-1, "")
        rec = self.records[sid]
        return (rec.owner, rec.module)

    def _track(
        self,
        t: torch.Tensor,
        *,
        op: str,
        category: str | None = None,
        module: str | None = None,
        owner: int = -1,
    ) -> None:
        t = memory_tensor(t)
        if t.device.type == "meta":  # e.g. made only for its strides (transformers' TP gather)
            return
        storage = t.untyped_storage()
        if self.ledger.id_of(storage) is not None:
            return
        host = (
            self.optimizer_host_scalars
            and (self.phase == "optimizer" or self.stepping_in_backward)
            and op in SCALAR_CONSTANT_OPS
            and t.dim() == 0
        )
        self._new_record(storage, storage.nbytes(), op=op, category=category, module=module,
                         owner=owner, host=host)  # fmt: skip

    def _new_record(
        self,
        storage: Any,
        nbytes: int,
        *,
        op: str,
        category: str | None,
        module: str | None,
        owner: int,
        host: bool,
    ) -> int:
        sid = self.ledger.new_id()
        if module is None:
            module, ctx_owner = self.context()
            if ctx_owner >= 0 or self.phase in ("forward", "backward"):
                owner = ctx_owner
        if category is None:
            if self.phase == "inputs":
                category = Category.INPUTS
            elif self.in_forward_region():
                category = Category.ACTIVATIONS
            else:
                category = Category.TEMPORARIES
        if host:
            # Host scalars belong to no module (the parameter context may be stale).
            module = ""
        rec = StorageRecord(
            sid, nbytes, category, self.phase, self.step, op, module, owner, self._region, host
        )
        self.ledger.add(storage, sid, rec)
        self.events.append(Event(ALLOC, sid, self.phase, self.step, op, module, owner))
        return sid

    def on_storage_resize(self, storage: Any, nbytes: int) -> None:
        """`UntypedStorage.resize_`: FSDP2 frees an all-gathered parameter by resizing its
        storage to 0 and allocates it again by resizing it back; the storage object lives on,
        so no finalizer would see either. A resize is a free of the old size and an
        allocation of the new one."""
        if not self._closed:
            self._guarded("recording a storage resize", self._resize, storage, nbytes)

    def _resize(self, storage: Any, nbytes: int) -> None:
        sid = self.ledger.id_of(storage)
        if sid is not None:
            if self.records[sid].nbytes == nbytes:
                return
            self.ledger.release(storage)
            self._freed(sid)
        if nbytes > 0:
            self._new_record(storage, nbytes, op="resize_", category=None, module=None,
                             owner=-1, host=False)  # fmt: skip

    def _on_free(self, sid: int, rec: StorageRecord) -> None:
        # The ledger's finalizer: it runs inside whatever op or Python code dropped the storage.
        self._guarded("recording a free", self._freed, sid)

    def _freed(self, sid: int) -> None:
        """The FREE event of `sid`, whose allocation the ledger has ended."""
        if self._closed:
            return
        rec = self.records[sid]
        if rec.category == "activations" and rec.region == self._region and rec.region != 0:
            rec.category = Category.TEMPORARIES
        module, owner = self.context()
        if self.phase not in ("forward", "backward") and not self._stack:
            owner = self._free_owner.get(sid, rec.owner)
        self.events.append(Event(FREE, sid, self.phase, self.step, self._op, module, owner))

    # -- module hooks -----------------------------------------------------------------------

    def _pre_hook(self, module: torch.nn.Module, args: Any) -> None:
        if not self._closed:
            self._guarded("the tracker's forward pre-hook", self._enter_module, module, args)

    def _post_hook(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not self._closed and self._stack:
            self._guarded("the tracker's forward hook", self._leave_module, output)

    def _enter_module(self, module: torch.nn.Module, args: Any) -> None:
        enclosing = self.context() if self._stack else ("", -1)
        tag_graph(args, enclosing)
        mid = id(module)
        name = self._names.get(mid, type(module).__name__)
        owner = self._owner.get(mid, -1)
        if owner < 0 and self._stack:
            owner = self._stack[-1][1]
        self._stack.append((name, owner))

    def _leave_module(self, output: Any) -> None:
        ctx = self._stack.pop()
        tag_graph(output, ctx)

    def on_region_end(self) -> None:
        """Called when a recomputation in backward ends (the driver clears the autocast cache)."""

    def on_region_start(self) -> None:
        """Called when a recomputation in backward starts (the driver enters the emulation)."""

    def block_region(self, path: str, entering: bool) -> None:
        """A checkpointed block starts or ends (see `region_listeners` in
        memfit.techniques.checkpointing).

        In backward this is a recomputation: its allocations are activations of a new forward
        region, attributed to the block.
        """
        if not self._closed and self.phase == "backward":
            self._guarded("the tracker's checkpointed-region listener", self._block_region, path,
                          entering)  # fmt: skip

    def _block_region(self, path: str, entering: bool) -> None:
        if entering:
            self._region_counter += 1
            self._region = self._region_counter
            self._stack.append((path, self.owner_of_path(path)))
            self.on_region_start()
        else:
            if self._stack:
                self._stack.pop()
            if not self._stack:
                self._region = 0
            self.on_region_end()

    def __enter__(self) -> Tracker:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        self._hooks = [
            register_module_forward_pre_hook(self._pre_hook),
            register_module_forward_hook(self._post_hook, always_call=True),
        ]
        region_listeners.append(self.block_region)
        self._resize_patch = _patch_storage_resize(self)
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        _unpatch_storage_resize(self._resize_patch)
        if self.block_region in region_listeners:
            region_listeners.remove(self.block_region)
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def close(self) -> None:
        """Stop recording; detach every finalizer so nothing fires after the trace."""
        self._closed = True
        self.ledger.close()


def _grouped_mm_other_dtype(mat_a: torch.Tensor, mat_b: torch.Tensor, *rest: Any, **kw: Any) -> Any:
    """`_grouped_mm` for non-bf16 inputs, as CUDA runs it: output (M, N) in the input dtype.

    The meta kernel accepts bf16 only (it mirrors the fast path of _grouped_mm_cuda); CUDA
    builds run other dtypes through a per-group fallback kernel that writes into one output
    tensor. Assumption, not yet checked on a GPU: that fallback allocates nothing else.
    (transformers calls grouped_mm with fp32 weights under mixed precision, e.g. Mixtral.)
    """
    out = torch.ops.aten._grouped_mm.default(
        mat_a.to(torch.bfloat16), mat_b.to(torch.bfloat16), *rest, **kw
    )
    return out.to(mat_a.dtype)


class OwnerTrackingState(dict):
    """`optimizer.state` stand-in that tells the tracker which parameter is being worked on.

    torch.optim optimizers look up `self.state[p]` before creating p's state, so allocations
    made then (like Adam's scalar `step`) are owned by p's block.
    """

    def __init__(self, tracker: Tracker, owners: dict[int, tuple[int, str]]) -> None:
        super().__init__()
        self._tracker = tracker
        self._owners = owners

    def __missing__(self, key: Any) -> dict:
        value: dict = {}
        self[key] = value
        return value

    def __getitem__(self, key: Any) -> Any:
        owner, module = self._owners.get(id(key), (-1, ""))
        self._tracker.param_owner = owner
        self._tracker.param_module = module
        return super().__getitem__(key)


def tag_graph(roots: Any, ctx: tuple[str, int]) -> None:
    stack = [
        t.grad_fn
        for t in pytree.tree_leaves(roots)
        if isinstance(t, torch.Tensor) and t.grad_fn is not None
    ]
    while stack:
        node = stack.pop()
        md: dict = node.metadata  # type: ignore[assignment]
        if META_KEY in md:
            continue
        md[META_KEY] = ctx
        for nxt, _ in node.next_functions:
            if nxt is not None:
                stack.append(nxt)


def _patch_storage_resize(tracker: Tracker) -> Any:
    """Route `torch.UntypedStorage.resize_` through the tracker while it is active (the
    dispatcher never sees storage resizes). Returns what `_unpatch_storage_resize` restores."""
    original = torch.UntypedStorage.resize_

    def resize_(storage: Any, size: int) -> Any:
        out = original(storage, size)
        tracker.on_storage_resize(storage, int(size))
        return out

    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign,assignment]
    return original


def _unpatch_storage_resize(original: Any) -> None:
    torch.UntypedStorage.resize_ = original  # type: ignore[method-assign]
