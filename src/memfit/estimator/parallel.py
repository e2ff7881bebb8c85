"""Traces run side by side, one forked process each, over the cores this process may use.

A trace is single-threaded Python (fake tensors dispatching through the tracker), so traces
that do not depend on each other (the 3- and 4-block traces of a replay check, the shapes a
plan will trace anyway) run in forked children and come back pickled in the trace cache's
compact form (memfit.estimator.trace_cache.pack_trace). A child inherits everything imported
and built (torch, transformers, the fake-tensor caches), so it starts in milliseconds.

Off unless `MEMFIT_JOBS=N` (N > 1) asks for it: whether cores run side by side cannot be
told from their count. On the 2-vCPU machine memfit is developed on, two processes run at the
speed of one (a pure-Python loop: 0.37 s alone, 0.67 s each side by side), so there the
children only add the fork and the transfer, and the first traces of a process, which import
the model's code, are paid once per child. Give N no larger than the cores that really run at
once.

Sequential in any case, with the same results: where `os.fork` is missing (Windows) or unsafe
(another thread is running: a forked child would inherit its locks held), and inside a child.
A job whose child fails (an exception, a crash) runs again in this process, so its error is
raised here as it would be without the children.
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

_in_child = False


def workers() -> int:
    """How many traces may run at once here: MEMFIT_JOBS, else 1 (sequential)."""
    if _in_child or not hasattr(os, "fork") or sys.platform == "win32":
        return 1
    if threading.active_count() > 1:
        return 1
    text = os.environ.get("MEMFIT_JOBS", "")
    return int(text) if text.isdigit() and int(text) >= 1 else 1


def run_all(
    jobs: Sequence[Callable[[], T]],
    *,
    pack: Callable[[T], Any] = lambda x: x,
    unpack: Callable[[Any], T] = lambda x: x,
) -> list[T]:
    """Every job's result, in order. Forked children (at most `workers() - 1` at a time)
    take jobs from the front, this process from the back; a child's `pack`ed result comes
    back pickled and is `unpack`ed here."""
    n = workers()
    if n <= 1 or len(jobs) <= 1:
        return [job() for job in jobs]
    results: list[Any] = [None] * len(jobs)
    done = [False] * len(jobs)
    pending = list(range(len(jobs)))
    children: dict[int, int] = {}  # pid -> job index
    with tempfile.TemporaryDirectory(prefix="memfit-trace-") as folder:

        def path(i: int) -> str:
            return os.path.join(folder, f"{i}.pkl")

        def reap(block: bool) -> None:
            while children:
                pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
                if pid == 0:
                    return
                i = children.pop(pid, -1)
                ok = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
                if i >= 0 and ok and os.path.exists(path(i)):
                    with open(path(i), "rb") as f:
                        results[i], done[i] = unpack(pickle.load(f)), True
                if block:
                    return

        while pending:
            while pending and len(children) < n - 1 and len(pending) > 1:
                i = pending.pop(0)
                children[_fork(jobs[i], pack, path(i))] = i
            if pending:
                i = pending.pop()
                results[i], done[i] = jobs[i](), True
            reap(block=False)
        while children:
            reap(block=True)
    # A child that failed: run its job here, so that its error (or result) is this process's.
    return [results[i] if done[i] else jobs[i]() for i in range(len(jobs))]


def _fork(job: Callable[[], Any], pack: Callable[[Any], Any], path: str) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    global _in_child
    _in_child = True
    code = 1
    try:
        # The job's warnings are the parent's too (it runs the same kind of trace): once.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        packed = pack(job())
        with open(path + ".tmp", "wb") as f:
            pickle.dump(packed, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(path + ".tmp", path)
        code = 0
    except BaseException:
        code = 1
    finally:
        os._exit(code)
