"""The training script `doctor` and `profile` run: checked before it runs."""

from __future__ import annotations

from pathlib import Path

from memfit.errors import BadInputError


def check_script(script: Path) -> None:
    """The script compiles: a syntax error is bad input (exit 2), found before any work, not a
    finding of a run that never started. A path that is not a file (missing, or a package run
    by its __main__) is left to the script runner, which says so."""
    if not script.is_file():
        return
    try:
        source = script.read_bytes()
    except OSError as e:
        raise BadInputError(
            f"cannot read the script {str(script)!r} ({e.strerror or e}). Give the path of a "
            "Python training script, e.g. memfit doctor train.py."
        ) from None
    try:
        compile(source, str(script), "exec", dont_inherit=True)
    except SyntaxError as e:
        where = f"line {e.lineno}" + (f", column {e.offset}" if e.offset else "")
        raise BadInputError(
            f"{str(script)!r} is not valid Python: {e.msg} ({where}). Fix the script, then run "
            "it again."
        ) from None
    except ValueError as e:  # a source with NUL bytes
        raise BadInputError(f"{str(script)!r} is not a Python script: {e}.") from None
