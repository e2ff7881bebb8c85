"""A local checkpoint folder as a model source: what its files say without reading its weights.

`read_checkpoint(folder)` reads, of every `*.safetensors` file in the folder, only the header:
the first 8 bytes (the header's length, an unsigned little-endian 64-bit integer) and that many
bytes of JSON mapping each tensor's name to its `dtype`, `shape` and `data_offsets`
(https://huggingface.co/docs/safetensors/index, "Format"; safetensors' own reader checks the
same fields). No tensor data is read, so 100 GB of weights cost a few MB of reads, one file at a
time. Each tensor's byte count is checked against its offsets (a header that disagrees with
itself is a BadInputError naming the file and tensor).

The dtype the model is loaded in is the config's, as transformers 5 reads it
(memfit.estimator.auto_precision): `dtype`, else its older name `torch_dtype`.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from memfit.errors import BadInputError

__all__ = ["CheckpointHeaders", "StoredTensor", "read_checkpoint", "read_header"]

#: Bytes of the header-length prefix (safetensors format: "8 bytes: N, an unsigned
#: little-endian 64-bit integer, containing the size of the header").
HEADER_LENGTH_BYTES = 8
#: safetensors refuses headers above 100 MB (safetensors/src/tensor.rs `MAX_HEADER_SIZE =
#: 100_000_000`); so does memfit, before reading one.
MAX_HEADER_BYTES = 100_000_000
#: The header's own key for free-form string metadata (not a tensor).
METADATA_KEY = "__metadata__"
#: Bits per element of each safetensors dtype code (safetensors/src/tensor.rs `Dtype::bitsize`).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16,
    "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64,
    "F64": 64, "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip
#: The torch dtype name of each code, as `safetensors.torch` maps them (`_TYPES`).
TORCH_NAME = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu", "I16": "int16", "U16": "uint16",
    "F16": "float16", "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32",
    "I64": "int64", "U64": "uint64", "F64": "float64", "C64": "complex64",
}  # fmt: skip


@dataclass(frozen=True)
class StoredTensor:
    """One tensor as a safetensors header describes it."""

    name: str
    dtype: str  # the safetensors code, e.g. "BF16"
    shape: tuple[int, ...]
    nbytes: int
    file: str

    @property
    def torch_dtype(self) -> str:
        """The torch dtype name ("bfloat16"), or the code itself when torch has none."""
        return TORCH_NAME.get(self.dtype, self.dtype)


@dataclass(frozen=True)
class CheckpointHeaders:
    """Every tensor of a checkpoint's safetensors files, from their headers only."""

    tensors: dict[str, StoredTensor]
    files: tuple[str, ...]
    header_bytes_read: int

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def bytes_by_dtype(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors.values():
            out[t.torch_dtype] = out.get(t.torch_dtype, 0) + t.nbytes
        return out

    def under(self, prefix: str) -> dict[str, StoredTensor]:
        """The tensors whose names start with `prefix` + "." (those of one module)."""
        return {n: t for n, t in self.tensors.items() if n.startswith(prefix + ".")}


def read_header(path: Path) -> tuple[dict[str, StoredTensor], int]:
    """(the tensors of one safetensors file, bytes read): only its header is read."""
    try:
        with path.open("rb") as f:
            prefix = f.read(HEADER_LENGTH_BYTES)
            if len(prefix) != HEADER_LENGTH_BYTES:
                raise BadInputError(
                    f"{path}: {len(prefix)} bytes, shorter than a safetensors header's 8-byte "
                    "length: the file is truncated or not safetensors. Download it again."
                )
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES:
                raise BadInputError(
                    f"{path}: header length {length} bytes is over safetensors' limit of "
                    f"{MAX_HEADER_BYTES}: not a safetensors file. Remove it from the folder."
                )
            raw = f.read(length)
    except OSError as e:
        raise BadInputError(f"Cannot read {path}: {e}") from e
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInputError(f"{path}: the safetensors header is not JSON ({e}).") from e
    if not isinstance(header, dict):
        raise BadInputError(f"{path}: the safetensors header is not a JSON object.")
    out: dict[str, StoredTensor] = {}
    for name, info in header.items():
        if name == METADATA_KEY:
            continue
        out[name] = _tensor(path, name, info)
    return out, HEADER_LENGTH_BYTES + len(raw)


def _tensor(path: Path, name: str, info: object) -> StoredTensor:
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        raise BadInputError(
            f"{path}: tensor {name!r} has no dtype, shape and data_offsets in the header."
        )
    code, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
    bits = DTYPE_BITS.get(code)
    if bits is None:
        raise BadInputError(
            f"{path}: tensor {name!r} has dtype {code!r}, which safetensors does not define "
            f"(known: {', '.join(DTYPE_BITS)})."
        )
    nbytes = -(-math.prod(shape) * bits // 8)
    if end - begin != nbytes:
        raise BadInputError(
            f"{path}: tensor {name!r} ({code} {list(shape)}) needs {nbytes} bytes but its "
            f"data_offsets span {end - begin}: the header is inconsistent."
        )
    return StoredTensor(name, code, shape, nbytes, path.name)


def read_checkpoint(folder: Path) -> CheckpointHeaders | None:
    """The headers of every `*.safetensors` in `folder` (sorted by name), or None when there
    is none. A tensor name stored twice is an error naming both files."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    tensors: dict[str, StoredTensor] = {}
    read = 0
    for path in files:
        found, n = read_header(path)
        read += n
        for name, t in found.items():
            if name in tensors:
                raise BadInputError(
                    f"{folder}: tensor {name!r} is stored in both {tensors[name].file} and "
                    f"{t.file}. Remove the stale file."
                )
            tensors[name] = t
    return CheckpointHeaders(tensors, tuple(p.name for p in files), read)


#: The sharded checkpoint's index, whose "metadata" may name the dtype (transformers'
#: `_get_dtype`: `if is_sharded and "dtype" in sharded_metadata`).
INDEX_FILE = "model.safetensors.index.json"
#: What `ModelSpec.extra` holds the headers and the read dtype under.
HEADERS_KEY = "checkpoint"
DTYPE_KEY = "checkpoint_dtype"


def state_dict_dtype(folder: Path, headers: CheckpointHeaders) -> tuple[str, str]:
    """(dtype name, where it was read) as transformers 5's `dtype="auto"` reads it when the
    config names none (modeling_utils `_get_dtype`): the sharded index's metadata "dtype", else
    `get_state_dict_dtype` of the first file: its first floating tensor that is not float8 /
    float4, in `safe_open(...).keys()` order (sorted names), else its first tensor's dtype."""
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            meta = json.loads(index.read_text()).get("metadata") or {}
        except (OSError, json.JSONDecodeError) as e:
            raise BadInputError(f"Cannot read {index}: {e}") from e
        if isinstance(meta, dict) and isinstance(meta.get("dtype"), str):
            return str(meta["dtype"]).removeprefix("torch."), f"{INDEX_FILE} metadata dtype"
    first = headers.files[0]
    names = sorted(n for n, t in headers.tensors.items() if t.file == first)
    for n in names:
        t = headers.tensors[n]
        if t.dtype in ("F16", "BF16", "F32", "F64"):
            return t.torch_dtype, f"{first}: first floating tensor {n!r} (safetensors header)"
    if not names:
        return "float32", f"{first} holds no tensor (transformers' default float32)"
    return headers.tensors[names[0]].torch_dtype, f"{first}: first tensor {names[0]!r}"


def checkpoint_notes(folder: Path, headers: CheckpointHeaders) -> list[str]:
    """What the estimate says of the checkpoint's files (where its figures come from)."""
    by_dtype = ", ".join(f"{d} {n}" for d, n in sorted(headers.bytes_by_dtype().items()))
    return [
        f"checkpoint {folder}: {len(headers.tensors)} tensors in {len(headers.files)} "
        f"safetensors files, {headers.total_bytes} bytes stored (by dtype, bytes: {by_dtype}); "
        f"read from their headers only ({headers.header_bytes_read} bytes read, no tensor data)."
    ]
