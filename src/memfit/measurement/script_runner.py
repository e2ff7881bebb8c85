"""Run a user's training script as `__main__`, inside a context the caller provides.

`memfit doctor` runs the script under `doctor()`; `memfit profile` can run it under a measuring
context. The script sees the argv and import path it would see under `python script.py args`.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import traceback
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from memfit.errors import BadInputError, MemfitError


class ScriptFailed(MemfitError):
    """The user's script raised (or exited with a non-zero status, or was interrupted: Ctrl-C).

    Raised after the caller's context has exited normally, so that whatever it measured up to
    the failure is complete and can be reported next to the script's own traceback.

    Attributes:
        path: the script.
        exception: what the script raised (a `SystemExit` for a non-zero exit, a
            `KeyboardInterrupt` for Ctrl-C).
        traceback: the formatted traceback, starting at the script's frames.
        exit_code: the status `python script.py` would have exited with (130 after Ctrl-C).
    """

    def __init__(self, path: str, exception: BaseException, formatted: str, exit_code: int):
        super().__init__(f"{path} failed: {type(exception).__name__}: {exception}")
        self.path = path
        self.exception = exception
        self.traceback = formatted
        self.exit_code = exit_code


def run_script(
    path: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    wrap: AbstractContextManager[Any] | None = None,
) -> None:
    """Run the script at `path` as `__main__` with `sys.argv == [path, *args]`, inside `wrap`.

    `sys.path[0]` is the script's directory while it runs; argv and sys.path are restored after.
    `SystemExit(0)` (or `None`) from the script is success.

    Raises:
        BadInputError: `path` is not a file (nor a directory with `__main__.py`).
        ScriptFailed: the script raised, exited with a non-zero status, or was interrupted.

    Example:
        >>> with_doctor = doctor()
        >>> run_script("train.py", ["--epochs", "1"], wrap=with_doctor)
        >>> with_doctor.findings
    """
    script = os.path.abspath(os.fspath(path))
    is_package = os.path.isdir(script) and os.path.isfile(os.path.join(script, "__main__.py"))
    if not (os.path.isfile(script) or is_package):
        raise BadInputError(
            f"Script {os.fspath(path)!r} does not exist (or is not a file). Give the path of "
            "the Python file you run with `python`, e.g. `train.py -- --epochs 1`."
        )
    failure: BaseException | None = None
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [script, *args]
    sys.path.insert(0, script if is_package else os.path.dirname(script))
    # The script's variables outlive the context, as they would at the end of `python script.py`
    # (the context sees the state the script ended in, not its teardown).
    script_globals: dict[str, Any] = {}
    try:
        with wrap if wrap is not None else contextlib.nullcontext():
            try:
                script_globals = runpy.run_path(script, run_name="__main__")
            except SystemExit as e:
                if e.code not in (None, 0):
                    failure = e
            except (Exception, KeyboardInterrupt) as e:  # re-raised below as ScriptFailed
                failure = e  # Ctrl-C too: the caller still reports what it saw up to then
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
    script_globals.clear()
    if failure is not None:
        raise ScriptFailed(
            os.fspath(path), failure, _format(failure, script), _exit_code(failure)
        ) from failure


#: The status of a process ended by SIGINT (Ctrl-C), as shells report it: 128 + 2.
EXIT_INTERRUPTED = 130


def _exit_code(e: BaseException) -> int:
    if isinstance(e, SystemExit):
        return e.code if isinstance(e.code, int) else 1
    return EXIT_INTERRUPTED if isinstance(e, KeyboardInterrupt) else 1


def _format(e: BaseException, script: str) -> str:
    """The traceback from the first frame of the script on (runpy's frames are noise)."""
    if isinstance(e, SystemExit):
        return f"{os.path.basename(script)} exited with status {e.code!r}\n"
    first = e.__traceback__
    while first is not None and not first.tb_frame.f_code.co_filename.startswith(script):
        first = first.tb_next
    return "".join(traceback.format_exception(type(e), e, first))
