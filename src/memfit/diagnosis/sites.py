"""Where a tensor came from (the user's source line) and who keeps it (a variable name).

Used by `memfit.doctor`. Two questions, answered from the Python stack and the garbage collector:

* `site_of(frame, root)`: the user line that made a tensor. Frames of torch, memfit and runpy are
  skipped; when the op ran inside an `nn.Module` call, the line that called the outermost module
  (`out = model(x)`) is chosen rather than a line inside the model's `forward`, because that is
  where the fix (`no_grad`, `.detach()`, `del`) goes. The walk stops at the frame that entered
  the doctor. Classification of code objects is cached, so one call costs a walk of the stack.
* `describe_holder(obj, exclude)`: a name for what keeps `obj` alive: a local or global variable
  (`total_loss`), a container bound to one (`history (list)`, `metrics['loss']`), or an
  attribute (`self.cache`, `Trainer.cache`). Uses `gc.get_referrers`, which scans the heap: call
  it once per finding, not per op.

`Clock` is the state the recorders share: the step index, the root frame, the doctor's pauses.
"""

from __future__ import annotations

import gc
import inspect
import os
import runpy
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any, NamedTuple

import torch

_SKIP, _USER, _MODULE_CALL = 0, 1, 2
_MODULE_CALL_CODES = {
    torch.nn.Module._call_impl.__code__,
    torch.nn.Module._wrapped_call_impl.__code__,
}
_SKIP_DIRS = (
    os.path.dirname(os.path.abspath(torch.__file__ or "")) + os.sep,
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
)
_SKIP_FILES = {os.path.abspath(runpy.__file__ or "")}
_kind_cache: dict[CodeType, int] = {}

#: How far up the referrer chain `describe_holder` looks for a name (tensor -> list -> variable).
_HOLDER_DEPTH = 3


class Site(NamedTuple):
    """A line of user code, and the function (code object) it belongs to."""

    filename: str
    lineno: int
    code: CodeType

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}"


def _kind(code: CodeType) -> int:
    kind = _kind_cache.get(code)
    if kind is None:
        name = code.co_filename
        if code in _MODULE_CALL_CODES:
            kind = _MODULE_CALL
        elif name.startswith("<") or name in _SKIP_FILES:
            kind = _SKIP
        else:
            kind = _SKIP if os.path.abspath(name).startswith(_SKIP_DIRS) else _USER
        _kind_cache[code] = kind
    return kind


def site_of(frame: FrameType | None, root: FrameType | None) -> Site | None:
    """The user line responsible for the op running in `frame` (see the module docstring)."""
    cache = _kind_cache
    inner = outer_call = None
    in_module = False
    f = frame
    while f is not None:
        code = f.f_code
        kind = cache.get(code)
        if kind is None:
            kind = _kind(code)
        if kind == _MODULE_CALL:
            in_module = True
        elif kind == _USER:
            if inner is None:
                inner = f
            if in_module:
                outer_call, in_module = f, False
        if f is root:
            break
        f = f.f_back
    f = outer_call or inner
    return None if f is None else Site(f.f_code.co_filename, f.f_lineno or 0, f.f_code)


def user_frames(frame: FrameType | None, root: FrameType | None) -> list[FrameType]:
    """The user frames from `frame` out to `root` (inclusive), innermost first."""
    out = []
    f = frame
    while f is not None:
        if _kind(f.f_code) == _USER:
            out.append(f)
        if f is root:
            break
        f = f.f_back
    return out


def describe_holder(obj: Any, frames: list[FrameType], exclude: Iterable[Any] = ()) -> str | None:
    """A name for what keeps `obj` alive, or None when nothing nameable refers to it.

    `frames` are the running user frames (their locals are not visible to `gc.get_referrers`
    while they run); `exclude` are the caller's own containers that refer to `obj`.
    """
    skip = {id(x) for x in exclude}
    skip.add(id(frames))
    return _name(obj, frames, skip, _HOLDER_DEPTH)


def _frame_locals(f: FrameType) -> list[tuple[str, Any]]:
    """The (name, value) pairs of a frame's variables, leaving no reference behind."""
    ns = f.f_locals
    items = list(ns.items())
    if f.f_code.co_flags & inspect.CO_OPTIMIZED and type(ns) is dict and ns is not f.f_globals:
        # Before Python 3.13 this is a snapshot the frame keeps: left there, it would keep the
        # tensors it saw alive after the function rebinds its variables (a leak the doctor
        # would then report). The frame rebuilds it whenever it is read again.
        ns.clear()
    return items


def _name(obj: Any, frames: list[FrameType], skip: set[int], depth: int) -> str | None:
    for f in frames:
        for name, value in _frame_locals(f):
            if value is obj:
                return name
    if depth == 0:
        return None
    referrers = gc.get_referrers(obj)
    skip.add(id(referrers))
    globals_ids = {id(f.f_globals) for f in frames}
    for ref in referrers:
        if id(ref) in skip or isinstance(ref, FrameType) or ref is frames:
            continue
        if isinstance(ref, dict):
            key = next((k for k, v in ref.items() if v is obj), None)
            if key is None:
                continue
            if id(ref) in globals_ids or "__builtins__" in ref:
                return str(key)
            owner = _dict_owner(ref)
            if owner is not None:
                return f"{_name(owner, frames, skip, depth - 1) or type(owner).__name__}.{key}"
            parent = _name(ref, frames, skip, depth - 1)
            if parent is not None:
                return f"{parent}[{_key_text(key, frames)}]"
        elif isinstance(ref, (list, tuple, set, frozenset, deque)):
            parent = _name(ref, frames, skip, depth - 1)
            if parent is not None:
                return f"{parent} ({type(ref).__name__})"
        elif hasattr(ref, "__dict__") and not isinstance(ref, type):
            attr = next((k for k, v in vars(ref).items() if v is obj), None)
            if attr is not None:
                return f"{_name(ref, frames, skip, depth - 1) or type(ref).__name__}.{attr}"
    return None


def _key_text(key: Any, frames: list[FrameType]) -> str:
    """A dict key as written in code (`'loss'`, `3`); a tensor key (`optimizer.state` is keyed
    by parameters) by its parameter name when a module in the user frames holds it
    (`<model.fc.weight>`), else by type and shape (`<Parameter (1, 64)>`), never its values."""
    if isinstance(key, (str, int)):
        return repr(key)
    if isinstance(key, torch.Tensor):
        name = _parameter_name(key, frames)
        return f"<{name}>" if name else f"<{type(key).__name__} {tuple(key.shape)}>"
    return f"<{type(key).__name__}>"


def _parameter_name(p: torch.Tensor, frames: list[FrameType]) -> str | None:
    """`model.fc.weight` for a parameter of a module bound to a variable of the user frames."""
    for f in frames:
        for var, value in [*_frame_locals(f), *f.f_globals.items()]:
            if isinstance(value, torch.nn.Module):
                for name, q in value.named_parameters():
                    if q is p:
                        return f"{var}.{name}"
    return None


def _dict_owner(d: dict) -> Any:
    for ref in gc.get_referrers(d):
        if getattr(ref, "__dict__", None) is d and not isinstance(ref, type):
            return ref
    return None


@dataclass
class Clock:
    """State the doctor's recorders share: the step index, its own pauses, the root frame."""

    step: int = 0
    paused: bool = False
    #: The doctor stopped for good after its own failure (memfit.errors.Failsafe): the recorders
    #: pass everything through.
    stopped: bool = False
    root: FrameType | None = None
    site: Site | None = None  # set while a backward runs: every op in it is from that line

    def site_here(self, frame: FrameType) -> Site | None:
        return self.site if self.site is not None else site_of(frame, self.root)
