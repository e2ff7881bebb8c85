"""memfit.data.readers: each format streamed with its line or row numbers, and bad input named."""

from __future__ import annotations

import json

import pytest

from memfit.data.readers import open_texts
from memfit.errors import BadInputError


def _rows(path, **kw):
    return list(open_texts(path, **kw))


def test_jsonl_lines_blank_lines_and_chat(tmp_path):
    p = tmp_path / "d.jsonl"
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    p.write_text(
        json.dumps({"text": "one"}) + "\n\n"
        + json.dumps({"text": ["a", "b"]}) + "\n"
        + json.dumps({"text": chat}) + "\n"
    )  # fmt: skip
    src = open_texts(p)
    assert list(src) == [(1, "one"), (3, "a\nb"), (4, "hi\nhello")]
    assert (src.unit, src.skipped_blank, src.done, src.total) == ("line", 1, p.stat().st_size,
                                                                   p.stat().st_size)  # fmt: skip


def test_jsonl_field_and_errors(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"content": "x", "id": 1}\n')
    assert _rows(p, field="content") == [(1, "x")]
    with pytest.raises(BadInputError, match=r"no column 'text'.*'content', 'id'.*--field"):
        _rows(p)
    with pytest.raises(BadInputError, match=r"'id' value at line 1 .* is int 1, not text"):
        _rows(p, field="id")
    p.write_text('{"text": "x"}\n{"text": \n')
    with pytest.raises(BadInputError, match=r"Line 2 of d\.jsonl is not JSON"):
        _rows(p)
    p.write_text('[{"text": "x"},\n{"text": "y"}]\n')
    with pytest.raises(BadInputError, match=r"one JSON array; convert it to JSON Lines"):
        _rows(p)
    p.write_bytes(b'{"text": "x"}\n{"text": "\xff"}\n')
    with pytest.raises(BadInputError, match=r"Line 2 of d\.jsonl is not UTF-8"):
        _rows(p)


def test_csv_and_tsv_rows_start_lines(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text('id,text\n1,hello\n2,"two\nlines"\n\n3,last\n')
    assert _rows(p) == [(2, "hello"), (3, "two\nlines"), (6, "last")]
    t = tmp_path / "d.tsv"
    t.write_text("body\tn\nx y\t1\n")
    assert _rows(t, field="body") == [(2, "x y")]
    with pytest.raises(BadInputError, match=r"no column 'text' \(in the header row\).*'body', 'n'"):
        _rows(t)
    p.write_text("text,id\nonly\n")  # a short row is fine while it has the column
    assert _rows(p) == [(2, "only")]
    p.write_text("id,text\n1\n")
    with pytest.raises(BadInputError, match=r"line 2 of d\.csv has 1 columns, fewer than"):
        _rows(p)


def test_plain_text_and_field_refused(tmp_path):
    p = tmp_path / "d.txt"
    p.write_text("first\n\n   \nfourth\r\n")
    src = open_texts(p)
    assert list(src) == [(1, "first"), (4, "fourth")] and src.skipped_blank == 2
    with pytest.raises(BadInputError, match=r"field='text' does not apply to plain text"):
        open_texts(p, field="text")


def test_parquet_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": [f"s{i}" for i in range(2500)], "n": list(range(2500))}), p)
    rows = _rows(p)
    assert len(rows) == 2500 and rows[0] == (0, "s0") and rows[2499] == (2499, "s2499")
    with pytest.raises(BadInputError, match=r"no column 'txt' \(in its schema\).*'text', 'n'"):
        _rows(p, field="txt")


def test_saved_dataset_and_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"text": ["a", "b", "c"]})
    ds.save_to_disk(str(tmp_path / "one"))
    src = open_texts(tmp_path / "one")
    assert (src.format, src.unit, list(src)) == ("datasets", "row", [(0, "a"), (1, "b"), (2, "c")])
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dict"))
    assert _rows(tmp_path / "dict", split="test")[2] == (2, "c")
    with pytest.raises(BadInputError, match=r"No split was named.*'train', 'test'.*--split"):
        _rows(tmp_path / "dict")
    with pytest.raises(BadInputError, match=r"split='train' does not apply: one holds one"):
        _rows(tmp_path / "one", split="train")
    (tmp_path / "plain").mkdir()
    with pytest.raises(BadInputError, match="is not a Dataset saved with save_to_disk"):
        _rows(tmp_path / "plain")


def test_paths_and_formats(tmp_path):
    with pytest.raises(BadInputError, match=r"'.*nope.jsonl' does not exist"):
        open_texts(tmp_path / "nope.jsonl")
    (tmp_path / "d.gz").write_bytes(b"")
    with pytest.raises(BadInputError, match=r"compressed.*gunzip -k d.gz"):
        open_texts(tmp_path / "d.gz")
    (tmp_path / "d.dat").write_text("x\n")
    with pytest.raises(BadInputError, match=r"suffix '.dat'.*--format"):
        open_texts(tmp_path / "d.dat")
    assert _rows(tmp_path / "d.dat", format="text") == [(1, "x")]
    with pytest.raises(BadInputError, match=r"Unknown format='xml'"):
        open_texts(tmp_path / "d.dat", format="xml")
    with pytest.raises(BadInputError, match=r"format='datasets' does not fit .* which is a file"):
        open_texts(tmp_path / "d.dat", format="datasets")
    with pytest.raises(BadInputError, match=r"split='x' applies only to a folder"):
        open_texts(tmp_path / "d.dat", format="text", split="x")
