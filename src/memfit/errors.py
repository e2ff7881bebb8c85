"""The exceptions memfit raises, and how it treats its own failure inside a user's run.

The library raises; only the CLI turns exceptions into exit codes. Inside a training loop memfit
did not write, memfit's own failure is reported once and never breaks the run: `Failsafe`.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar


class MemfitError(Exception):
    """Base class of every error memfit raises on purpose."""


class BadInputError(MemfitError, ValueError):
    """The user gave a value memfit cannot use. The message quotes the value and says the fix.

    The CLI maps this to exit code 2.
    """


class TraceError(MemfitError, RuntimeError):
    """The model could not be traced (data-dependent shape, custom extension, ...).

    The message names the op and the module path and says which option avoids it.
    """


def closest(name: str, known: list[str], n: int = 3) -> str:
    """Return "did you mean a, b or c?" for an unknown name, or "" when nothing is close."""
    import difflib

    hits = difflib.get_close_matches(name.lower(), [k.lower() for k in known], n=n, cutoff=0.5)
    lower_to_real = {k.lower(): k for k in known}
    names = [lower_to_real[h] for h in hits]
    if not names:
        return ""
    if len(names) == 1:
        return f" Did you mean {names[0]!r}?"
    return " Did you mean " + ", ".join(repr(x) for x in names[:-1]) + f" or {names[-1]!r}?"


# -- Never break the user's run ---------------------------------------------------------------
#
# Note: [Never break the run]
#     memfit's own failure inside the user's code is memfit's alone.
#
# Code that memfit runs inside a training loop it did not write (the Trainer and Lightning
# callbacks, `memfit.measure`, `memfit.doctor`, `oom_guard`, the hooks and dispatch modes they
# install) goes through one `Failsafe` per session (DESIGN.md, "Never break the run"). The
# user's own work (an op, a step, a hook of the technique itself) always runs outside it, so
# its exceptions, a real `torch.OutOfMemoryError` included, reach the user unchanged. memfit's
# bookkeeping around it runs inside: the first exception there
#
# - is reported once, naming what failed and why (the session's `print_fn`, else
#   `warnings.warn` with `MemfitFailureWarning`), its traceback logged at DEBUG level on the
#   "memfit" logger;
# - is kept as text on `failed` (results say they are incomplete: `Measurement.failed`,
#   `Doctor.failed`, a callback's `failed`);
# - trips the failsafe: the session's `on_trip` actions run (a dispatch mode steps aside and
#   passes every later op straight through), and every hook guarded by it returns as if it
#   were absent.
#
# Exceptions memfit raises on purpose (a callback's `WontFitError`, `strict=True`) are not
# failures and are not guarded. `KeyboardInterrupt` and other non-`Exception`s pass through.
#
# Example:
#     >>> fs = Failsafe("memfit.measure")
#     >>> hook = fs.hook(count_gradient, "the gradient hook")   # returns None once tripped

_log = logging.getLogger("memfit")

_T = TypeVar("_T")


class MemfitFailureWarning(RuntimeWarning):
    """memfit failed inside the user's run and stopped observing it; the run went on."""


class Failsafe:
    """The failure state of one session of memfit inside user code (Note: [Never break the
    run], above).

    Args:
        what: the session, as the report names it ("memfit.measure").
        print_fn: where the one report goes; None: `warnings.warn(MemfitFailureWarning)`.
    """

    def __init__(self, what: str, print_fn: Callable[[str], None] | None = None) -> None:
        self.what = what
        self.print_fn = print_fn
        #: "where: ExceptionType: message" of the first failure, or None.
        self.failed: str | None = None
        self._on_trip: list[Callable[[], None]] = []

    def on_trip(self, action: Callable[[], None]) -> None:
        """Run `action` when the failsafe trips (stop a dispatch mode, pause a recorder)."""
        self._on_trip.append(action)

    def trip(self, where: str, error: BaseException) -> None:
        """Record memfit's failure in `where`, stop the session, and report it (the first time
        only: later failures of a stopped session are consequences of the first)."""
        if self.failed is not None:
            return
        self.failed = f"{where}: {type(error).__name__}: {error}"
        _log.debug("%s failed in %s", self.what, where, exc_info=error)
        for action in self._on_trip:
            try:
                action()
            except Exception as e:  # the stop itself failed: said in the same report
                self.failed += f" (and stopping it raised {type(e).__name__}: {e})"
                _log.debug("stopping %s failed", self.what, exc_info=e)
        message = (
            f"memfit: {self.what} stopped after its own error in {self.failed}. Your run goes "
            f"on as it would without memfit; what {self.what} reports is incomplete (the "
            "traceback is logged at DEBUG level on the 'memfit' logger)."
        )
        if self.print_fn is not None:
            self.print_fn(message)
        else:
            warnings.warn(message, MemfitFailureWarning, stacklevel=3)

    @contextmanager
    def guard(self, where: str) -> Iterator[None]:
        """Run the block; memfit's exception in it trips the failsafe instead of propagating."""
        try:
            yield
        except Exception as e:
            self.trip(where, e)

    def call(self, where: str, fn: Callable[..., _T], *args: Any, default: _T, **kwargs: Any) -> _T:
        """`fn(*args, **kwargs)`, or `default` when it raises (the failsafe trips) or the
        failsafe has tripped already."""
        if self.failed is not None:
            return default
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            self.trip(where, e)
            return default

    def hook(self, fn: Callable[..., Any], where: str) -> Callable[..., Any]:
        """`fn` as a hook that returns None, as if absent, once tripped or when it raises
        (module, optimizer and gradient hooks read None as "change nothing")."""

        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            return self.call(where, fn, *args, default=None, **kwargs)

        return guarded
