"""`[tool.memfit.lint]` in pyproject.toml: the rules to run and the files to skip.

    [tool.memfit.lint]
    select = ["MF"]            # codes or prefixes; default: every rule
    ignore = ["MF004"]
    exclude = ["legacy/*", "notebooks"]

The nearest pyproject.toml at or above the starting folder is read; a command-line `--select`
or `--ignore` replaces the value of the same key here.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memfit.errors import BadInputError, closest

_KEYS = ("select", "ignore", "exclude")
_TABLE = "[tool.memfit.lint]"


@dataclass(frozen=True, kw_only=True)
class LintConfig:
    """The lint settings of a project (None: the key is not set)."""

    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    source: Path | None = None


def find_config(start: Path) -> LintConfig:
    """The `[tool.memfit.lint]` table of the nearest pyproject.toml at or above `start`."""
    for folder in [start.resolve(), *start.resolve().parents]:
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return read_config(candidate)
    return LintConfig()


def read_config(path: Path) -> LintConfig:
    text = path.read_text(encoding="utf-8")
    if "tool.memfit" not in text:
        return LintConfig(source=path)
    table = _table(_load_toml(text, path), path)
    unknown = sorted(set(table) - set(_KEYS))
    if unknown:
        raise BadInputError(
            f"{path}: {_TABLE} has an unknown key {unknown[0]!r}."
            f"{closest(unknown[0], list(_KEYS))} Known keys: {', '.join(_KEYS)}."
        )
    values = {k: _strings(table[k], k, path) for k in _KEYS if k in table}
    return LintConfig(
        select=values.get("select"),
        ignore=values.get("ignore"),
        exclude=values.get("exclude", ()),
        source=path,
    )


def _load_toml(text: str, path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise BadInputError(
                f"{path} has a {_TABLE} table, and reading TOML on Python 3.10 needs tomli: "
                "`pip install tomli` (Python 3.11 and later read it without)."
            ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise BadInputError(f"{path} is not valid TOML ({e}); fix the file.") from None


def _table(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    table = doc.get("tool", {}).get("memfit", {}).get("lint", {})
    if not isinstance(table, dict):
        raise BadInputError(f'{path}: {_TABLE} must be a table, like `select = ["MF001"]`.')
    return table


def _strings(value: Any, key: str, path: Path) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadInputError(
            f'{path}: {_TABLE} {key} = {value!r} is not a list of strings; write {key} = ["MF001"].'
        )
    return tuple(value)
