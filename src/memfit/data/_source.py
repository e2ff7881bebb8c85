"""What every reader returns (`TextSource`), and the pieces the column formats share."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memfit.errors import BadInputError, closest

#: Rows per batch read from Parquet and from a saved Dataset.
ROWS_PER_BATCH = 1024


@dataclass
class TextSource:
    """An opened data set: iterate it for `(where, text)` pairs.

    Attributes:
        path: the file or folder.
        format: one of FORMATS.
        field: the column read (None for plain text).
        unit: "line" (1-based line numbers) or "row" (0-based row indices).
        total: the size of the pass, in bytes for the line formats and rows otherwise
            (the progress bar's total).
        done: how much of `total` has been read so far.
        skipped_blank: blank lines skipped (JSON Lines and plain text).
    """

    path: Path
    format: str
    field: str | None
    unit: str
    total: int
    done: int = 0
    skipped_blank: int = 0
    _rows: Iterator[tuple[int, str]] | None = dataclasses.field(default=None, repr=False)

    def __iter__(self) -> Iterator[tuple[int, str]]:
        assert self._rows is not None
        return self._rows


def rows_of_batches(
    p: Path, src: TextSource, batches: Iterator[list[Any]], field: str
) -> Iterator[tuple[int, str]]:
    """(0-based row, text) from batches of column values, counting rows into src.done."""
    row = 0
    for values in batches:
        for value in values:
            yield row, as_text(value, p, f"row {row}", field)
            row += 1
        src.done = row


def as_text(value: Any, p: Path, where: str, field: str) -> str:
    """A sample's value as text: a string; a list of strings, or a chat (a list of messages
    with "content"), joined by newlines. Anything else is an error naming where it is."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    if isinstance(value, list) and all(
        isinstance(v, dict) and isinstance(v.get("content"), str) for v in value
    ):
        return "\n".join(v["content"] for v in value)
    raise BadInputError(
        f"The {field!r} value at {where} of {p.name} is {type(value).__name__} "
        f"{_short(value)}, not text: memfit reads a string, a list of strings, or a list of "
        'messages with "content". Name a text column with field= (--field).'
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _missing_field(p: Path, where: str, field: str, present: list[str]) -> BadInputError:
    return BadInputError(
        f"{p.name} has no column {field!r} (in {where}); the columns present are "
        f"{', '.join(repr(c) for c in present) or 'none'}.{closest(field, present)} Name the "
        "text column with field= (--field)."
    )
