"""`simulate`: run real CPU code as if its tensors lived in a GPU's memory.

Every storage allocated while the context is active is malloc'ed in memfit's simulated CUDA
caching allocator (`memfit.cuda.allocator`) and freed there when PyTorch releases it. The
storages' identity, records and free callbacks are a `memfit.storage_ledger.StorageLedger`'s,
as in the estimator's tracer; the allocator calls are this mode's own. A malloc that does not
fit raises `torch.OutOfMemoryError` at that op with PyTorch's message, so OOM handling
(`memfit.guard.retry`) runs on a laptop.

Example:
    >>> with simulate("rtx-4090", model=model, optimizer=opt) as gpu:
    ...     train_step(batch)
    >>> gpu.peak_allocated_bytes, gpu.peak_reserved_bytes

Allocator capacity: with `gpu` alone, the GPU's memory minus what lives outside the allocator
(CUDA context, kernels: `memfit.cuda.overhead`, as `memfit.estimate` does); `budget_bytes`
alone, exactly that; both, `budget_bytes` is the process's share of that GPU as nvidia-smi
counts it, the context coming off it first; neither, unlimited (peaks are still measured).
As in the estimate, the cuBLAS workspaces (of `gpu`, else of the default GPU) go through the
allocator and stay: one "workspaces" allocation at the first matmul, after its output, and a
second at the first matmul of backward, which the autograd engine runs on its own thread with
its own cuBLAS handle (`workspaces=False` leaves them out). cuDNN convolution workspaces
are not modelled.

Tensors that exist before entering count only when passed: `model=` (parameters, buffers,
gradients), `optimizer=` (state), `tensors=` (filed as inputs); scanning every live tensor
would count the rest of the process too. Only storages an op allocates are counted: a view,
an in-place op or an `out=` on a tensor that was not passed costs nothing (a batch sliced from
a host dataset, `X[i:j]`, counts once copied: `.clone()`, as `.to("cuda")` would copy it). A
counted storage that an op resizes (`resize_`, a larger `out=`) is malloc'ed at its new size.

Categories: parameters, buffers, gradients (`.grad`), optimizer_state (in `optimizer.state`),
activations (made in a module's forward, or after it until backward starts), temporaries (made
in backward or in `optimizer.step()`), inputs (made outside all of these: usually the batch;
after an OOM, until the next forward), workspaces. Modules come from global module hooks in
forward and autograd-node tags in backward (memfit.estimator.trace.tracker, Note: [Backward
attribution]).

cuBLAS operand copies (a matrix with strides cuBLAS cannot take, e.g. the expanded gradient of
`loss = x.sum()`, cloned for the call) are allocated and freed inside their op, as in the estimate.

Limitations: one thread, one stream; storages on the meta device are ignored (fake tensors'
are counted: see `memfit.simulation.fake_run`, which runs a trial on them); with
`optimizer=`, step counters of non-fused torch.optim optimizers are host memory, as on CUDA.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from memfit.cuda.allocator import CachingAllocator
from memfit.cuda.allocator_config import AllocatorConfig
from memfit.cuda.allocator_oom import AllocatorOutOfMemoryError as _AllocatorFull
from memfit.cuda.allocator_oom import OutOfMemory
from memfit.cuda.target import get_gpu
from memfit.errors import BadInputError
from memfit.estimator import META_KEY, SCALAR_CONSTANT_OPS, operand_copies, tag_graph
from memfit.models.structure import find_repeated_blocks
from memfit.simulation.capacity import simulated_capacity
from memfit.simulation.fake_run import fake_tensors
from memfit.simulation.records import LiveTensor, OomState, optimizer_state_sizes
from memfit.storage_ledger import StorageLedger
from memfit.techniques.optimizer import host_state_keys

__all__ = ["LiveTensor", "OomState", "SimulatedGPU", "active", "simulate"]

#: aten ops that run on cuBLAS; the first one allocates the cuBLAS workspace (CublasHandlePool).
MATMUL_OPS = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "addr",
     "_addmm_activation", "_scaled_mm", "_int_mm"}
)  # fmt: skip

_ACTIVE: list[SimulatedGPU] = []


def active() -> SimulatedGPU | None:
    """The innermost active simulated GPU, or None."""
    return _ACTIVE[-1] if _ACTIVE else None


class SimulatedGPU(TorchDispatchMode):
    """The context manager `simulate` returns; see the module docstring."""

    def __init__(self, gpu: str | None = None, *, budget_bytes: int | None = None,
                 alloc_conf: str | None = None, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, tensors: Any = (),
                 workspaces: bool = True, fake: bool = False) -> None:  # fmt: skip
        super().__init__()
        self._fake = fake
        self._fake_cm: Any = None
        self._capability = get_gpu(gpu).compute_capability if gpu is not None else None
        capacity, self.total_capacity_bytes, ws = simulated_capacity(gpu, budget_bytes)
        self.capacity_bytes = capacity
        cfg = AllocatorConfig.from_string(alloc_conf) if alloc_conf else AllocatorConfig()
        if cfg.per_process_memory_fraction is not None and not self.total_capacity_bytes:
            raise BadInputError(
                f"alloc_conf {alloc_conf!r} sets a memory fraction, which is a fraction of a "
                "GPU's memory: name the GPU (simulate('a100-80gb', ...)) or give budget_bytes."
            )
        self._cfg = cfg
        self.allocator = CachingAllocator(
            cfg, capacity_bytes=capacity, total_bytes=self.total_capacity_bytes or None
        )  # a memory fraction is of the GPU's total, as in setMemoryFraction
        self.model, self.optimizer, self._extra = model, optimizer, tensors
        self._workspace_bytes = ws if workspaces else 0
        # One cuBLAS workspace per (handle, stream): the caller's thread, and the autograd
        # engine's thread, which runs backward; each is allocated at its first matmul.
        self._workspace_threads = {"main", "autograd"} if workspaces else set()
        self.oom: OomState | None = None
        #: The storages on the simulated GPU (and the workspaces, which have none), by record id.
        self._ledger: StorageLedger[LiveTensor] = StorageLedger(self._on_free)
        self._blocks: dict[int, int] = {}  # record id -> allocator block (device memory only)
        self._stack: list[str] = []
        self._phase = "inputs"
        self._names = {id(m): n for n, m in model.named_modules()} if model is not None else {}
        self._host_steps = False
        if optimizer is not None:
            self._host_steps = "step" in host_state_keys(optimizer)
        self._hooks: list[Any] = []
        self._entered = False

    # -- public state ----------------------------------------------------------------------

    @property
    def peak_allocated_bytes(self) -> int:
        """`torch.cuda.max_memory_allocated()` of the simulated GPU."""
        return self.allocator.peak_allocated

    @property
    def peak_reserved_bytes(self) -> int:
        """`torch.cuda.max_memory_reserved()` of the simulated GPU."""
        return self.allocator.peak_reserved

    @property
    def allocated_bytes(self) -> int:
        return self.allocator.allocated

    @property
    def reserved_bytes(self) -> int:
        return self.allocator.reserved

    def empty_cache(self) -> None:
        """`torch.cuda.empty_cache()` on the simulated GPU."""
        self.allocator.empty_cache()

    @property
    def fake(self) -> bool:
        """Whether the code runs on fake tensors (`simulate(..., fake=True)`)."""
        return self._fake

    def restart(self) -> None:
        """Start again as a new process of the same job would (fake runs only): a new
        allocator holding the model's tensors, no optimizer state, no other tensor; peaks
        from here on. The tensors of earlier code are no longer followed."""
        if not self._fake:
            raise BadInputError(
                "restart() needs simulate(..., fake=True): on real tensors the optimizer "
                "state it drops would be the user's."
            )
        self._ledger.clear()
        self._blocks = {}
        self.oom = None
        self.allocator = CachingAllocator(
            self._cfg, capacity_bytes=self.capacity_bytes,
            total_bytes=self.total_capacity_bytes or None,
        )  # fmt: skip
        if self._workspace_bytes:
            self._workspace_threads = {"main", "autograd"}
        if self.optimizer is not None:
            self.optimizer.state.clear()  # the fake run's own state (fake_run swaps it)
        self._register_existing()

    def live_tensors(self) -> list[LiveTensor]:
        """The storages on the simulated GPU now, categorised (see the module docstring)."""
        self._recategorise()
        recs = dict(self._ledger.records)  # a copy: a gc pass may free storages meanwhile
        return [recs[rid] for rid in list(self._blocks) if rid in recs]

    # -- enter / exit ----------------------------------------------------------------------

    def __enter__(self) -> SimulatedGPU:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        if self._entered:
            raise RuntimeError("A simulate() context can be entered once; make a new one.")
        self._entered = True
        if self._fake:  # before registering: the model's tensors become the fakes
            self._fake_cm = fake_tensors(self.model, self.optimizer, capability=self._capability)
            self._fake_cm.__enter__()
        try:
            self._register_existing()
        except torch.OutOfMemoryError as e:
            self._detach()
            if self._fake_cm is not None:
                self._fake_cm.__exit__(type(e), e, e.__traceback__)
            raise
        self._hooks = [
            register_module_forward_pre_hook(self._pre_hook),
            register_module_forward_hook(self._post_hook, always_call=True),
        ]
        if self.optimizer is not None:
            self._hooks.append(self.optimizer.register_step_pre_hook(self._opt_pre))
            self._hooks.append(self.optimizer.register_step_post_hook(self._opt_post))
        _ACTIVE.append(self)
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        super().__exit__(*exc)
        _ACTIVE.remove(self)
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._detach()
        if self._fake_cm is not None:  # restores the real tensors; a fake-run failure is named
            return self._fake_cm.__exit__(*exc)
        return None

    def _detach(self) -> None:
        """Stop following frees: the state stays as it was at exit."""
        self._ledger.close()

    def _register_existing(self) -> None:
        m, opt = self.model, self.optimizer
        if m is not None:
            owner = {id(p): n.rpartition(".")[0] for n, p in m.named_parameters()}
            for p in m.parameters():
                self._track(p, "<parameters>", category="parameters", module=owner[id(p)])
            for n, b in m.named_buffers():
                self._track(b, "<buffers>", category="buffers", module=n.rpartition(".")[0])
            for p in m.parameters():
                if p.grad is not None:
                    self._track(p.grad, "<gradients>", category="gradients", module=owner[id(p)])
        if opt is not None:
            for state in opt.state.values():
                for key, v in state.items():
                    if isinstance(v, torch.Tensor) and not (key == "step" and self._host_steps):
                        self._track(v, "<optimizer_state>", category="optimizer_state")
        extra, self._extra = self._extra, ()  # hold no reference: they must be free to die
        for t in pytree.tree_leaves(extra):
            if isinstance(t, torch.Tensor):
                self._track(t, "<inputs>", category="inputs")

    # -- dispatch --------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if self._phase != "backward" and torch._C._current_autograd_node() is not None:
            self._phase = "backward"  # until the engine finishes this backward pass
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
        packet = getattr(getattr(func, "overloadpacket", None), "__name__", "")
        thread = "autograd" if self._phase == "backward" else "main"
        workspace = (
            self._workspace_bytes and thread in self._workspace_threads and packet in MATMUL_OPS
        )
        out = func(*args, **(kwargs or {}))
        given: set[int] | None = None  # the storages of the op's tensor arguments
        for t in pytree.tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            if self._ledger.id_of(storage) is None:
                if given is None:
                    given = _storage_keys((args, kwargs))
                if storage._cdata in given:
                    continue  # a view, in-place op or out= of a tensor made before entering
            self._track(t, name)
        copies = operand_copies(name, args)
        if copies:
            self._transients(copies, name)
        if workspace:  # cuBLAS allocates it inside the call, once the output exists
            ws = self._workspace_bytes
            rec = LiveTensor(nbytes=ws, category="workspaces", op=name, module="",
                             phase=self._phase, shape=(ws,), dtype="uint8")  # fmt: skip
            rid = self._ledger.new_id()
            self._malloc(rid, rec)  # kept for the life of the process
            self._ledger.records[rid] = rec  # no storage: never freed
            self._workspace_threads.discard(thread)  # once per thread (a failed malloc retries)
        return out

    def _transients(self, sizes: list[int], op: str) -> None:
        """Blocks a kernel allocates together inside `op` and frees before it returns
        (cuBLAS operand copies: memfit.estimator.trace.cublas_operands)."""
        rids = []
        for nbytes in sizes:
            rec = LiveTensor(nbytes=nbytes, category="temporaries", op=op,
                             module=self._context(), phase=self._phase, shape=(nbytes,),
                             dtype="uint8")  # fmt: skip
            rid = self._ledger.new_id()
            self._ledger.records[rid] = rec  # no storage: freed below
            rids.append(rid)
            try:
                self._malloc(rid, rec)
            except BaseException:
                self._drop(rids)
                raise
        self._drop(rids)

    def _drop(self, rids: list[int]) -> None:
        for rid in rids:
            self._on_free(rid, self._ledger.records.pop(rid))

    def _context(self) -> str:
        if self._stack:
            return self._stack[-1]
        node = torch._C._current_autograd_node()
        if node is not None:
            tag = node.metadata.get(META_KEY)  # type: ignore[attr-defined]
            if tag is not None:
                return tag[0]
        return ""

    def _category(self) -> str:
        if self._phase in ("backward", "optimizer"):
            return "temporaries"
        return "activations" if self._stack or self._phase == "forward" else "inputs"

    def _track(self, t: torch.Tensor, op: str, *, category: str | None = None,
               module: str | None = None) -> None:  # fmt: skip
        storage = t.untyped_storage()
        known = self._ledger.id_of(storage)
        if known is not None:
            self._resize(known, t, op)
            return
        if storage.device.type == "meta" and not isinstance(t, FakeTensor):
            return  # a fake tensor's storage is on meta too, and stands for a real one
        host = (
            self._host_steps and self._phase == "optimizer" and op in SCALAR_CONSTANT_OPS
            and t.dim() == 0
        )  # fmt: skip
        rec = LiveTensor(
            nbytes=storage.nbytes(), category=category or self._category(), op=op,
            module=self._context() if module is None else module, phase=self._phase,
            shape=tuple(t.shape), dtype=str(t.dtype).removeprefix("torch."),
        )  # fmt: skip
        rid = self._ledger.new_id()
        if not host:
            self._malloc(rid, rec)
        self._ledger.add(storage, rid, rec)

    def _malloc(self, rid: int, rec: LiveTensor) -> None:
        if rec.nbytes == 0:
            return
        # A gc pass inside malloc frees storages: freed in the allocator once malloc is done.
        with self._ledger.holding_frees():
            try:
                self._blocks[rid] = self.allocator.malloc(rec.nbytes)
            except _AllocatorFull as e:
                self._raise_oom(e.oom, rec)

    def _resize(self, rid: int, t: torch.Tensor, op: str) -> None:
        """A known storage that an op grew or shrank (`resize_`, `out=`): malloc the new size,
        then free the old block, as CUDA's resize_bytes_cuda allocates and copies first."""
        rec = self._ledger.records.get(rid)
        nbytes = t.untyped_storage().nbytes()
        if rec is None or nbytes == rec.nbytes or (rec.nbytes and rid not in self._blocks):
            return  # unchanged, or host memory (a step counter)
        new = replace(rec, nbytes=nbytes, op=op, module=self._context(), phase=self._phase,
                      shape=tuple(t.shape))  # fmt: skip
        old = self._blocks.pop(rid, None)
        try:
            self._malloc(rid, new)
        except torch.OutOfMemoryError:
            if old is not None:
                self._blocks[rid] = old  # the simulated storage keeps its old size
            raise
        self._ledger.records[rid] = new
        if old is not None:
            self.allocator.free(old)

    def _on_free(self, rid: int, rec: LiveTensor) -> None:
        """The ledger's finalizer: PyTorch freed the storage of `rid`."""
        block = self._blocks.pop(rid, None)
        if block is not None:
            self.allocator.free(block)

    def _raise_oom(self, oom: OutOfMemory, rec: LiveTensor) -> None:
        module = rec.module or self._context()  # the workspace belongs to no module
        message = oom.message(
            op=rec.op, module=module or "<top>", total_capacity_bytes=self.total_capacity_bytes
        )
        self.oom = OomState(
            oom=oom, message=message, op=rec.op, module=module, phase=rec.phase,
            live=tuple(self.live_tensors()), request=rec, config=self.allocator.config,
            total_capacity_bytes=self.total_capacity_bytes,
            block_paths=tuple(find_repeated_blocks(self.model)) if self.model is not None else (),
            model=type(self.model).__name__ if self.model is not None else None,
            optimizer_state=optimizer_state_sizes(self.optimizer),
            optimizer=type(self.optimizer).__name__ if self.optimizer is not None else None,
        )  # fmt: skip
        # The failed step is over: what comes next (the retry's batch) is not its forward,
        # backward or update (the engine drops the backward's end callback on an error). The
        # module stack unwinds through the always-called forward hooks.
        self._phase = "inputs"
        err = torch.OutOfMemoryError(message)
        err.memfit_oom = self.oom  # type: ignore[attr-defined]  # read by memfit.simulation.oom
        raise err from None

    def _recategorise(self) -> None:
        """Give gradients and optimizer state their category, now that their role is known."""
        roles: list[tuple[Any, str]] = []
        if self.model is not None:
            roles += [(p.grad, "gradients") for p in self.model.parameters()]
        if self.optimizer is not None:
            roles += [
                (v, "optimizer_state") for s in self.optimizer.state.values() for v in s.values()
            ]
        recs = self._ledger.records
        for t, category in roles:
            if isinstance(t, torch.Tensor):
                rid = self._ledger.id_of(t.untyped_storage())
                if rid is not None and recs[rid].category != category:
                    recs[rid] = replace(recs[rid], category=category)

    # -- hooks -----------------------------------------------------------------------------

    def _pre_hook(self, module: torch.nn.Module, args: Any) -> None:
        tag_graph(args, (self._stack[-1] if self._stack else "", -1))
        if not self._stack:
            self._phase = "forward"
        self._stack.append(self._names.get(id(module), type(module).__name__))

    def _post_hook(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._stack:
            tag_graph(output, (self._stack.pop(), -1))
        if not self._stack and not torch.is_grad_enabled():
            self._phase = "inputs"  # an inference forward: nothing to backpropagate

    def _backward_done(self) -> None:
        self._phase = "inputs"

    def _opt_pre(self, *_: Any) -> None:
        self._phase = "optimizer"

    def _opt_post(self, *_: Any) -> None:
        self._phase = "inputs"


def simulate(gpu: str | None = None, *, budget_bytes: int | None = None,
             alloc_conf: str | None = None, model: torch.nn.Module | None = None,
             optimizer: torch.optim.Optimizer | None = None, tensors: Any = (),
             workspaces: bool = True, fake: bool = False) -> SimulatedGPU:  # fmt: skip
    """A context in which real CPU code runs on the memory of `gpu` (see the module docstring).

    Args:
        gpu: a catalog GPU name (`memfit gpus`); unknown names list the closest ones.
        budget_bytes: allocator capacity in bytes (with `gpu`: the process's share of it).
        alloc_conf: a PYTORCH_CUDA_ALLOC_CONF string, e.g. "expandable_segments:True".
        model, optimizer, tensors: tensors that exist before entering and live on the GPU.
        workspaces: allocate the cuBLAS workspace at the first matmul, as CUDA does.
        fake: run on fake tensors as CUDA would (memfit.simulation.fake_run): no host memory
            for the tensors, CUDA's attention kernel and foreach optimizers; values are not
            computed. `model` and `optimizer` get their real tensors back on exit.
    """
    return SimulatedGPU(
        gpu, budget_bytes=budget_bytes, alloc_conf=alloc_conf, model=model, optimizer=optimizer,
        tensors=tensors, workspaces=workspaces, fake=fake,
    )  # fmt: skip


def _storage_keys(tree: Any) -> set[int]:
    """The StorageImpl addresses of the strided tensors in `tree`."""
    return {
        t.untyped_storage()._cdata
        for t in pytree.tree_leaves(tree)
        if isinstance(t, torch.Tensor) and t.layout == torch.strided and not t.is_nested
    }
