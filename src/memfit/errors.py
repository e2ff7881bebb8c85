"""The exceptions memfit raises. The library raises; only the CLI turns them into exit codes."""

from __future__ import annotations


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
