"""Run a trial on fake tensors, as CUDA would run it: no host memory for its tensors.

`memfit.simulate` counts what a trial allocates in a simulated GPU's allocator, but by itself the
trial's tensors are real: a large batch of a small model needs as much host RAM as the GPU it
stands for (16 GB for a T4), and CPU kernels are not the CUDA ones (CPU attention without
dropout support materialises the scores; torch.optim runs its per-tensor loop on CPU tensors,
not CUDA's foreach). Inside `fake_tensors(...)`:
- the model's parameters and buffers, and the optimizer's references to them and its state,
  are swapped for fake tensors of the same shapes (restored on exit, values untouched), and
  every tensor the trial makes is fake (`FakeTensorMode`): sizes are exact, nothing is computed;
- the optimizer runs its foreach implementation, as torch.optim picks it for CUDA tensors;
- scaled-dot-product attention takes the kernel CUDA would pick for the GPU (memfit's
  `CudaEmulation`, as in the estimate);
- values are not computed: `.item()`, `bool(t)` and the like read 1 (as a step count, a loss or
  a finite check would in a normal step), GradScaler's found-inf flag reads 0 (the optimizer
  step runs); a trial whose control flow depends on other values takes that branch. Ops whose
  output shape depends on values (`nonzero`, boolean masks) cannot run: `FakeRunUnsupported`
  says which, and `memfit find-batch --real` runs the trial on real tensors instead.

Tensors made before entering and not passed (a dataset in host memory) stay real; a view of
one made inside (a batch sliced from it) becomes a fake tensor and counts as an allocation.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from memfit.errors import BadInputError
from memfit.estimator import UNIFORM_OPS, CudaEmulation

__all__ = ["FakeRunUnsupported", "fake_tensors"]

#: What a fake run cannot do: an op whose output shape depends on values, or an op fake tensors
#: have no kernel for.
FAKE_UNSUPPORTED = (DynamicOutputShapeException, UnsupportedOperatorException)

#: aten ops that read a value out of a tensor (`.item()`, `bool(t)`, `int(t)`).
_SCALAR_READS = frozenset({"_local_scalar_dense.default", "is_nonzero.default"})


class FakeRunUnsupported(BadInputError):
    """The trial did something a fake run cannot (see the module docstring)."""


class _NormalStepScalars(TorchDispatchMode):
    """Answer value reads as a normal step would see them, instead of failing (fake tensors
    hold no values): 1 (a step count, a loss, a finite check), except
    - GradScaler's found-inf flag, which reads 0 (no inf: the optimizer step runs and makes its
      state);
    - a uniform sample in [0, 1) compared with a number (transformers' LayerDrop before 5.18,
      `torch.rand([]) < self.layerdrop`, even at 0): the likelier outcome, which is the certain
      one at a bound outside (0, 1) (`rand < 0` is never true, so every layer runs)."""

    def __init__(self) -> None:
        super().__init__()
        self._found_inf: set[int] = set()
        self._uniform: WeakIdKeyDictionary = WeakIdKeyDictionary()  # rand outputs
        self._decided: WeakIdKeyDictionary = WeakIdKeyDictionary()  # comparison -> its answer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__
        if name in _SCALAR_READS:
            t = args[0]
            if t in self._decided:
                return self._decided[t]
            one = 0 if id(t) in self._found_inf else 1
            if t.dtype == torch.bool:
                return bool(one)
            return float(one) if t.dtype.is_floating_point else one
        if name.startswith("_amp_foreach_non_finite_check_and_unscale_"):
            self._found_inf.add(id(args[1]))  # (grads, found_inf, inv_scale)
        out = func(*args, **(kwargs or {}))
        if name in UNIFORM_OPS:
            self._uniform[out] = True
        elif name in _COMPARISONS and args[0] in self._uniform:
            self._decided[out] = _likelier(name, args[1])
        return out


#: A tensor compared with a Python number.
_COMPARISONS = frozenset({"lt.Scalar", "le.Scalar", "gt.Scalar", "ge.Scalar"})


def _likelier(name: str, bound: float) -> bool:
    """The likelier answer of `u <op> bound` for u uniform in [0, 1) (False on a tie)."""
    below = min(max(float(bound), 0.0), 1.0)  # P(u < bound), also P(u <= bound)
    return (below if name.startswith("l") else 1.0 - below) > 0.5


@contextlib.contextmanager
def fake_tensors(
    model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None,
    *,
    capability: tuple[int, int] | None,
) -> Iterator[FakeTensorMode]:
    """Run the block on fake tensors, with `model` and `optimizer` swapped to fakes (restored
    on exit); `capability` is the simulated GPU's, for the attention kernel choice."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    restore = _swap(model, optimizer, mode)
    emulation = CudaEmulation(dtype=None, capability=capability)
    try:
        with mode, _NormalStepScalars(), emulation:
            yield mode
    except DataDependentOutputException as e:
        raise FakeRunUnsupported(_unsupported(e)) from e
    except FAKE_UNSUPPORTED as e:
        raise FakeRunUnsupported(_unsupported(e)) from e
    finally:
        restore()


def _unsupported(e: Exception) -> str:
    return (
        f"The trial ran an op that fake tensors cannot (they hold no values): {e}. Run it on "
        "real tensors with `memfit find-batch --real` (host RAM as large as the simulated "
        "GPU's memory may be needed), or make the op's output shape independent of values."
    )


def _swap(
    model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None, mode: FakeTensorMode
) -> Any:
    """Swap the model's tensors and the optimizer's references for fakes; returns the undo."""
    memo: dict[int, torch.Tensor] = {}
    slots: list[tuple[dict[str, Any], str, torch.Tensor]] = []

    def fake_of(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in memo:
            with mode:
                new = torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype)
            if isinstance(t, torch.nn.Parameter):
                new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
            memo[id(t)] = new
        return memo[id(t)]

    if model is not None:
        for mod in model.modules():
            for table in (mod._parameters, mod._buffers):
                for name, t in table.items():
                    if t is not None:
                        slots.append((table, name, t))
                        table[name] = fake_of(t)  # type: ignore[assignment]
    groups: list[tuple[dict[str, Any], list[Any], Any]] = []
    state = None
    if optimizer is not None:
        for g in optimizer.param_groups:
            groups.append((g, g["params"], g.get("foreach")))
            g["params"] = [fake_of(p) for p in g["params"]]
            if "foreach" in g and g["foreach"] is None:
                g["foreach"] = True  # what torch.optim picks for CUDA tensors
        state = optimizer.state
        fresh: Any = defaultdict(dict)
        for p, s in state.items():
            fresh[fake_of(p)] = {k: fake_of(v) if isinstance(v, torch.Tensor) else v
                                 for k, v in s.items()}  # fmt: skip
        optimizer.state = fresh

    def restore() -> None:
        for table, name, t in slots:
            table[name] = t
        for g, params, foreach in groups:
            g["params"] = params
            if "foreach" in g:
                g["foreach"] = foreach
        if optimizer is not None:
            optimizer.state = state  # type: ignore[assignment]  # the fake run's state is dropped

    return restore
