"""Traces run side by side, one forked process each, over the cores this process may use.

A trace is single-threaded Python (fake tensors dispatching through the tracker), so traces
that do not depend on each other (the 3- and 4-block traces of a replay check, the shapes a
plan will trace anyway) run in forked children and come back pickled in the trace cache's
compact form (memfit.estimator.trace.cache.pack_trace). A child inherits everything imported
and built (torch, transformers, the fake-tensor caches), so it starts in milliseconds.

Off unless `MEMFIT_JOBS=N` (N > 1) asks for it: whether cores run side by side cannot be
told from their count. On the 2-vCPU machine memfit is developed on, it changed from day to
day: once two processes ran at the speed of one (a pure-Python loop: 0.37 s alone, 0.67 s each
side by side), and there the children only added the fork and the transfer; on 2026-11-25
they ran side by side (0.58 s alone, 0.60 s each), and MEMFIT_JOBS=2 took the README's plan
from 15.9 to 14.1 s, the llama-2-7b 24 GB plan from 20.7 to 19.8 s and `memfit estimate
llama-2-7b` from 3.88 to 3.77 s (one new process each, empty cache). Most of a plan's traces
cannot run ahead: each one's result decides the next (a probe that fails rules out heavier
shapes, a fit ends a shape's search). A child also pays, once, the imports and caches of the
first trace of a process. Give N no larger than the cores that really run at once.

Sequential in any case, with the same results: where `os.fork` is missing (Windows) or unsafe
(another thread is running: a forked child would inherit its locks held), and inside a child.
A job whose child fails (an exception, a crash) runs again in this process, so its error is
raised here as it would be without the children.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from memfit.errors import BadInputError

T = TypeVar("T")

_in_child = False

#: A child running longer than this is killed and its job run here (a trace takes seconds; a
#: child that hangs, e.g. on a lock another thread held at the fork, must not hang memfit).
CHILD_SECONDS = 600.0


def workers() -> int:
    """How many traces may run at once here: MEMFIT_JOBS, else 1 (sequential). A value that
    is not a whole number of 1 or more is refused (BadInputError), not guessed at."""
    if _in_child:
        return 1
    asked = jobs_asked()
    if not hasattr(os, "fork") or sys.platform == "win32" or threading.active_count() > 1:
        return 1
    return asked


def jobs_asked() -> int:
    """MEMFIT_JOBS as a number of processes (1 when unset or empty)."""
    text = os.environ.get("MEMFIT_JOBS", "").strip()
    if not text:
        return 1
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise BadInputError(
            f"MEMFIT_JOBS={text!r} is not a number of processes: give a whole number, 1 or "
            "more (at most the cores that run at once; 1 traces one at a time), or unset it."
        )
    return int(text)


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
    started: dict[int, float] = {}  # pid -> time.monotonic() at the fork
    with tempfile.TemporaryDirectory(prefix="memfit-trace-") as folder:

        def path(i: int) -> str:
            return os.path.join(folder, f"{i}.pkl")

        def reap(block: bool) -> None:
            """Collect this call's children that ended (only them: another part of the
            program may have children of its own); with `block`, wait until one has. A child
            past CHILD_SECONDS is killed, and its job runs again here."""
            while children:
                for pid in list(children):
                    if time.monotonic() - started[pid] > CHILD_SECONDS:
                        os.kill(pid, signal.SIGKILL)
                    ended, status = os.waitpid(pid, os.WNOHANG)
                    if ended == 0:
                        continue
                    i = children.pop(pid)
                    del started[pid]
                    ok = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
                    if ok and os.path.exists(path(i)):
                        with open(path(i), "rb") as f:
                            results[i], done[i] = unpack(pickle.load(f)), True
                    if block:
                        return
                if not block:
                    return
                time.sleep(0.002)

        while pending:
            while pending and len(children) < n - 1 and len(pending) > 1:
                i = pending.pop(0)
                pid = _fork(jobs[i], pack, path(i))
                children[pid], started[pid] = i, time.monotonic()
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
