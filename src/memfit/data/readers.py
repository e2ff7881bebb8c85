"""Streaming readers of text data sets, one sample at a time, each with where it came from.

Formats: JSON Lines (`.jsonl`, `.ndjson`, and `.json` when it holds JSON Lines), CSV (`.csv`),
TSV (`.tsv`), plain text with one sample a line (`.txt`), Parquet (`.parquet`), and a folder a
`datasets` Dataset was saved to with `save_to_disk`. Nothing is loaded whole: the line formats
are read a line at a time, Parquet a record batch at a time, a saved Dataset through its
memory-mapped Arrow files.

Where a sample is: for the line formats, its 1-based line number in the file, as an editor
shows it (for a CSV record that spans several lines, the line it starts on); for Parquet and
a saved Dataset, its 0-based row index, as `dataset[i]` takes it. Blank lines of JSON Lines and
plain text are skipped (not samples) but still counted as lines.

Known limits: compressed files are not read (decompress them first); a JSON file that holds one
array is not streamed (convert it to JSON Lines).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memfit.data._arrow import open_saved_dataset
from memfit.data._source import (
    ROWS_PER_BATCH,
    TextSource,
    _missing_field,
    as_text,
    rows_of_batches,
)
from memfit.errors import BadInputError

#: The formats `open_texts` reads, by the name `format=` (and `--format`) takes.
FORMATS = ("jsonl", "csv", "tsv", "text", "parquet", "datasets")

_SUFFIXES = {
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv",
    ".txt": "text", ".text": "text", ".parquet": "parquet",
}  # fmt: skip

#: The column read when no field is named.
DEFAULT_FIELD = "text"


def open_texts(
    path: str | Path, *, field: str | None = None, format: str | None = None,
    split: str | None = None,
) -> TextSource:  # fmt: skip
    """Open `path` for one streaming pass over its texts (see the module docstring).

    `field` names the text column (default "text"); plain text has none, so a field given for
    it is an error. `split` picks a split of a saved DatasetDict and applies to nothing else.
    Raises BadInputError for a missing path, an unknown format, a missing column (listing the
    columns present), or a sample that is not text (naming its line or row).

    Example:
        >>> src = open_texts("train.jsonl", field="content")
        >>> for line, text in src: ...
    """
    p = Path(path)
    if not p.exists():
        raise BadInputError(f"The data path {str(p)!r} does not exist. Check the path.")
    fmt = _format_of(p, format)
    if fmt == "text" and field is not None:
        raise BadInputError(
            f"field={field!r} does not apply to plain text ({p.name}: one sample a line, no "
            "columns). Leave it out, or name the format of the file with format=."
        )
    if split is not None and fmt != "datasets":
        raise BadInputError(
            f"split={split!r} applies only to a folder saved with datasets' save_to_disk; "
            f"{p.name} is {fmt}. Leave it out."
        )
    opener = {
        "jsonl": _open_jsonl, "csv": _open_csv, "tsv": _open_csv, "text": _open_plain,
        "parquet": _open_parquet,
    }  # fmt: skip
    if fmt == "datasets":
        return open_saved_dataset(p, field or DEFAULT_FIELD, split)
    return opener[fmt](p, fmt, field or DEFAULT_FIELD)


def _format_of(p: Path, given: str | None) -> str:
    if given is not None:
        if given not in FORMATS:
            raise BadInputError(
                f"Unknown format={given!r}: memfit reads {', '.join(FORMATS)}. Pick one."
            )
        if (given == "datasets") != p.is_dir():
            what = "a folder" if p.is_dir() else "a file"
            raise BadInputError(
                f"format={given!r} does not fit {str(p)!r}, which is {what}: only "
                "format='datasets' is a folder (save_to_disk). Check the path or the format."
            )
        return given
    if p.is_dir():
        return "datasets"
    if p.suffix.lower() in (".gz", ".bz2", ".xz", ".zst", ".zip"):
        raise BadInputError(
            f"{p.name} is compressed, and memfit reads uncompressed files only: decompress it "
            f"first (e.g. `gunzip -k {p.name}`)."
        )
    fmt = _SUFFIXES.get(p.suffix.lower())
    if fmt is None:
        raise BadInputError(
            f"memfit cannot tell the format of {p.name} from its suffix {p.suffix!r}: name it "
            f"with format= (--format), one of {', '.join(FORMATS)}."
        )
    return fmt


def _lines(p: Path, src: TextSource) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line without its newline), counting bytes into src.done."""
    for number, line in _lines_keep_newline(p, src):
        yield number, line.rstrip("\r\n")


def _open_plain(p: Path, fmt: str, _field: str) -> TextSource:
    src = TextSource(path=p, format=fmt, field=None, unit="line", total=p.stat().st_size)

    def rows() -> Iterator[tuple[int, str]]:
        for number, line in _lines(p, src):
            if line.strip():
                yield number, line
            else:
                src.skipped_blank += 1

    src._rows = rows()
    return src


def _open_jsonl(p: Path, fmt: str, field: str) -> TextSource:
    src = TextSource(path=p, format=fmt, field=field, unit="line", total=p.stat().st_size)

    def rows() -> Iterator[tuple[int, str]]:
        for number, line in _lines(p, src):
            if not line.strip():
                src.skipped_blank += 1
                continue
            record = _json_record(p, number, line)
            if field not in record:
                raise _missing_field(p, f"line {number}", field, list(record))
            yield number, as_text(record[field], p, f"line {number}", field)

    src._rows = rows()
    return src


def _json_record(p: Path, number: int, line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        hint = (
            " The file looks like one JSON array; convert it to JSON Lines (one object a line), "
            "e.g. `jq -c '.[]' in.json > out.jsonl`."
            if number == 1 and line.lstrip().startswith("[")
            else ""
        )
        raise BadInputError(
            f"Line {number} of {p.name} is not JSON ({e.msg}, column {e.colno}).{hint}"
        ) from None
    if not isinstance(record, dict):
        raise BadInputError(
            f"Line {number} of {p.name} is a JSON {type(record).__name__}, not an object: "
            'JSON Lines data holds one object a line, e.g. {"text": "..."}.'
        )
    return record


def _open_csv(p: Path, fmt: str, field: str) -> TextSource:
    src = TextSource(path=p, format=fmt, field=field, unit="line", total=p.stat().st_size)
    delimiter = "\t" if fmt == "tsv" else ","
    # The header is read here, so a wrong field is an error before the pass starts.
    reader = csv.reader((line for _, line in _lines_keep_newline(p, src)), delimiter=delimiter)
    header = next(reader, None)
    if header is None:
        raise BadInputError(f"{p.name} is empty: a {fmt.upper()} file needs a header row.")
    if field not in header:
        raise _missing_field(p, "the header row", field, header)
    column = header.index(field)

    def rows() -> Iterator[tuple[int, str]]:
        start = reader.line_num + 1
        for record in reader:
            if record:  # a blank line is no record
                if len(record) <= column:
                    raise BadInputError(
                        f"The record at line {start} of {p.name} has {len(record)} columns, "
                        f"fewer than the header's {len(header)}: fix that row."
                    )
                yield start, record[column]
            start = reader.line_num + 1

    src._rows = rows()
    return src


def _lines_keep_newline(p: Path, src: TextSource) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line with its newline), counting bytes into src.done."""
    with p.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            src.done += len(raw)
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise BadInputError(
                    f"Line {number} of {p.name} is not UTF-8 ({e.reason} at byte {e.start}). "
                    "Re-encode the file as UTF-8 (e.g. `iconv -t utf-8`)."
                ) from None


def _open_parquet(p: Path, fmt: str, field: str) -> TextSource:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError(
            "Reading Parquet needs pyarrow: `pip install memfit[data]` (or pyarrow)."
        ) from e
    pf = pq.ParquetFile(p)
    names = pf.schema_arrow.names
    if field not in names:
        raise _missing_field(p, "its schema", field, names)
    src = TextSource(path=p, format=fmt, field=field, unit="row", total=pf.metadata.num_rows)
    batches = pf.iter_batches(batch_size=ROWS_PER_BATCH, columns=[field])
    src._rows = rows_of_batches(p, src, (b.column(0).to_pylist() for b in batches), field)
    return src
