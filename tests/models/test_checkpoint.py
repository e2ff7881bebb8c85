"""A local checkpoint folder: safetensors headers read exactly, and nothing else read."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

import memfit
from memfit.errors import BadInputError
from memfit.models import checkpoint
from memfit.models.checkpoint import read_checkpoint, read_header
from memfit.models.sources import resolve_model
from tests.conftest import TINY_LLAMA_CONFIG


def _write(path: Path, tensors: dict[str, tuple[str, list[int], int]], data: bytes) -> int:
    """A safetensors file written by hand: {name: (dtype, shape, nbytes)} laid end to end,
    then `data` as the tensor bytes. Returns the header's length."""
    header, at = {}, 0
    for name, (dtype, shape, n) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + n]}
        at += n
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return len(raw)


THREE = {
    "a.weight": ("BF16", [3, 5], 30),
    "b.qweight": ("I32", [4, 2], 32),
    "c.scale": ("F8_E4M3", [7], 7),
}


def test_three_tensors_dtype_and_shape_without_reading_data(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "model.safetensors"
    length = _write(path, THREE, b"\xab" * (30 + 32 + 7))
    reads: list[int] = []
    real_open = Path.open

    def counting_open(self: Path, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        f = real_open(self, *args, **kwargs)  # type: ignore[call-overload]
        real_read = f.read

        def read(n: int = -1) -> bytes:
            out = real_read(n)
            reads.append(len(out))
            return out

        f.read = read
        return f

    monkeypatch.setattr(Path, "open", counting_open)
    found, n = read_header(path)
    assert {k: (t.torch_dtype, t.shape, t.nbytes) for k, t in found.items()} == {
        "a.weight": ("bfloat16", (3, 5), 30),
        "b.qweight": ("int32", (4, 2), 32),
        "c.scale": ("float8_e4m3fn", (7,), 7),
    }
    assert sum(reads) == n == 8 + length  # the length prefix and the header: no tensor byte


def test_inconsistent_header_names_the_tensor(tmp_path: Path) -> None:
    _write(tmp_path / "m.safetensors", {"x": ("F32", [2, 2], 12)}, b"\0" * 12)
    with pytest.raises(BadInputError, match=r"'x' \(F32 \[2, 2\]\) needs 16 bytes"):
        read_checkpoint(tmp_path)


def test_a_hundred_gigabytes_of_headers_in_under_a_second(tmp_path: Path) -> None:
    """20 sparse files of 5 GB each (the data never written, so never there to read)."""
    gb5 = 5 * 10**9
    for i in range(20):
        path = tmp_path / f"model-{i:05d}-of-00020.safetensors"
        names = {f"layers.{i}.t{j}": ("BF16", [gb5 // 200 // 2], gb5 // 200) for j in range(200)}
        _write(path, names, b"")
        with path.open("r+b") as f:
            f.truncate(path.stat().st_size + gb5)
    t0 = time.perf_counter()
    headers = read_checkpoint(tmp_path)
    seconds = time.perf_counter() - t0
    assert headers is not None and headers.total_bytes == 20 * gb5
    assert len(headers.tensors) == 4000
    assert seconds < 1.0


def test_folder_dtype_from_headers_as_transformers_reads_it(tmp_path: Path) -> None:
    """No dtype in the config: transformers 5's dtype="auto" takes the first floating tensor
    (sorted names) of the first file, skipping float8."""
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG))
    _write(tmp_path / "model.safetensors",
           {"a.scale": ("F8_E4M3", [4], 4), "b.weight": ("BF16", [2], 4)}, b"\0" * 8)  # fmt: skip
    spec = resolve_model(str(tmp_path))
    assert spec.extra[checkpoint.DTYPE_KEY][0] == "bfloat16"
    assert any("2 tensors in 1 safetensors files, 8 bytes stored" in n for n in spec.notes)


def test_folder_estimate_reads_precision_from_headers(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = {k: v for k, v in TINY_LLAMA_CONFIG.items() if k not in ("model_type", "architectures")}
    model = LlamaForCausalLM(LlamaConfig(**cfg)).half()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(tmp_path / "model.safetensors"))  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG))
    prof = memfit.estimate(
        str(tmp_path), memfit.Workload(mode="inference", batch_size=1, seq_len=8, precision="auto")
    )
    assert prof.workload.precision == "fp16-true"
    stored = sum(v.numel() * 2 for v in model.state_dict().values())
    assert any(f"{stored} bytes stored" in n for n in prof.notes)
