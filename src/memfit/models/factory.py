"""Loading a user's model factory: "file.py:build[:make_batch]" or "package.module:build".

A factory file is imported as if it ran alone from its own folder: while memfit imports it (and
while memfit.models.sources calls its build and make_batch), `sys.argv` is `[path]`, so argparse
code run at import reads no memfit option, and the file's folder is first on `sys.path`, so
`from helpers import x` finds the helpers.py beside it, as `python file.py` would. Both are
restored afterwards.

Known limit: a helper module imported this way stays in `sys.modules` under its own name, so
two factory files in different folders whose helpers share a name get the first one imported.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from memfit.errors import BadInputError

__all__ = ["as_script", "in_script", "load_functions", "script_of", "user_error"]


@contextlib.contextmanager
def as_script(file: Path) -> Iterator[None]:
    """Run the block as `python file` would see the world: `sys.argv == [str(file)]` and the
    file's folder first on `sys.path`; both restored after."""
    folder = str(file.resolve().parent)
    saved_argv = sys.argv
    sys.argv = [str(file)]
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.argv = saved_argv
        with contextlib.suppress(ValueError):  # the file may have removed it itself
            sys.path.remove(folder)


def load_functions(text: str) -> tuple[Callable[..., Any], Callable[..., Any] | None]:
    """ "file.py:fn[:make_batch]" (or "package.module:fn[:make_batch]") -> the functions.

    Without a third part, a `make_batch` beside `fn` is returned if the file has one. The
    functions are returned as they are (their `__globals__` are the file's: the find-batch
    command reads the model there); `in_script` runs them as the file's. A file that exits
    while it is imported
    (argparse's `parse_args()` outside `if __name__ == "__main__":` on arguments it does not
    take, `sys.exit()`) raises BadInputError, as does any other error of its import, with its
    traceback.
    """
    parts = text.split(":")
    if len(parts) < 2 or not parts[1]:
        raise BadInputError(
            f"{text!r} names no function: write file.py:function (e.g. train.py:build)."
        )
    target, fn_name = parts[0], parts[1]
    batch_name = parts[2] if len(parts) > 2 else None
    if target.endswith(".py"):
        file = Path(target)
        if not file.is_file():
            raise BadInputError(f"File {target!r} does not exist.")
        module = _import_file(file, target)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise BadInputError(f"Cannot import module {target!r}: {e}") from e
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise BadInputError(f"{target!r} has no function {fn_name!r}.")
    make_batch = getattr(module, batch_name or "make_batch", None)
    if batch_name and not callable(make_batch):
        raise BadInputError(f"{target!r} has no function {batch_name!r}.")
    return fn, make_batch if callable(make_batch) else None


def script_of(text: str) -> Path | None:
    """The file of a "file.py:fn" source, or None for "package.module:fn"."""
    target = text.split(":")[0]
    return Path(target) if target.endswith(".py") else None


def _import_file(file: Path, target: str) -> Any:
    mod_name = "memfit_user_" + file.stem
    spec = importlib.util.spec_from_file_location(mod_name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        with as_script(file):
            spec.loader.exec_module(module)
    except SystemExit as e:
        sys.modules.pop(mod_name, None)
        raise BadInputError(
            f"Importing {target!r} exited (SystemExit: {e.code!r}) before memfit could read "
            "its functions: the file runs code at import, such as argparse's parse_args() or "
            "sys.exit(). memfit imports it with sys.argv set to [its path], as if it ran with "
            'no arguments. Put that code under `if __name__ == "__main__":`.'
        ) from None
    except Exception as e:
        sys.modules.pop(mod_name, None)
        raise BadInputError(user_error(f"Importing {target!r}", e)) from e
    return module


def in_script(fn: Callable[..., Any], file: Path) -> Callable[..., Any]:
    """`fn`, called under `as_script(file)` (a lazy `import helpers` inside it works too)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with as_script(file):
            return fn(*args, **kwargs)

    return call


#: memfit's own source folder: its frames are left out of a user's error.
_MEMFIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def user_error(what: str, e: BaseException) -> str:
    """ "{what} raised {type}: {message}", then the frames from the first of the user's code on
    (memfit's and importlib's frames before it are noise to the user), as Python prints them
    but without the "Traceback" header: the user's error, not a crash of memfit's."""
    frames = traceback.extract_tb(e.__traceback__)
    first = 0
    while first < len(frames) and (
        os.path.abspath(frames[first].filename).startswith(_MEMFIT_DIR)
        or frames[first].filename.startswith("<frozen importlib")
    ):
        first += 1
    where = "".join(traceback.format_list(frames[first:]))
    return (
        f"{what} raised {type(e).__name__}: {e}\n{where}"
        + "".join(traceback.format_exception_only(type(e), e))
    ).rstrip("\n")
