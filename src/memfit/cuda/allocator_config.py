"""Configuration of the simulated CUDA caching allocator (``PYTORCH_CUDA_ALLOC_CONF``).

The constants and the size rounding rules below were read from PyTorch's
``c10/cuda/CUDACachingAllocator.cpp`` and ``c10/core/AllocatorConfig.{h,cpp}``
(``CUDAAllocatorConfig.cpp`` before 2.8); the code here is our own. Function names
in comments point at the C++ function the behaviour was read from.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from memfit.errors import BadInputError, closest
from memfit.units import MIB

__all__ = [
    "K_LARGE_BUFFER",
    "K_MIN_BLOCK_SIZE",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_SMALL_BUFFER",
    "K_SMALL_SIZE",
    "MIB",
    "AllocatorConfig",
    "cuda_block_size",
    "format_size",
]

# c10/core/AllocatorConfig.h (CUDACachingAllocator.cpp in <= 2.7):
K_MIN_BLOCK_SIZE = 512  # kMinBlockSize: all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 * MIB  # kSmallSize: largest "small" allocation
K_SMALL_BUFFER = 2 * MIB  # kSmallBuffer: small requests are packed in 2 MiB segments
K_MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc: requests in (1, 10) MiB share a 20 MiB segment
K_ROUND_LARGE = 2 * MIB  # kRoundLarge: bigger requests are rounded up to 2 MiB
K_LARGE_BUFFER = 20 * MIB  # kLargeBuffer (default large_segment_size_mb)

# AcceleratorAllocatorConfig: kRoundUpPowerOfTwoIntervals = 16 intervals [1 MiB, 64 GiB)
_N_INTERVALS = 16

# Keys PyTorch accepts whose effect is modelled here.
_MODELLED_KEYS = (
    "expandable_segments",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "large_segment_size_mb",
    "per_process_memory_fraction",
)
# Keys PyTorch accepts that do not change device-memory accounting (locking, pinned host
# memory, graph-capture reuse, early OOM): accepted and ignored. "backend" is checked.
_IGNORED_KEYS = (
    "backend",
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "pinned_free_catch_all",
    "graph_capture_record_stream_reuse",
    "throw_on_cudamalloc_oom",
)
VALID_KEYS = _MODELLED_KEYS + _IGNORED_KEYS


def cuda_block_size(nbytes: int) -> int:
    """Bytes the caching allocator hands out for a request of `nbytes` without rounding
    divisions: a multiple of kMinBlockSize (``round_size``); a zero-byte request allocates
    nothing (the tensor has no storage)."""
    if nbytes <= 0:
        return 0
    return (nbytes + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE * K_MIN_BLOCK_SIZE


def format_size(size: int) -> str:
    """Byte count as PyTorch prints it in OOM messages (c10 ``format_size``).

    ``<= 1024`` -> "N bytes"; ``<= 1 MiB`` -> KiB; ``<= 1 GiB`` -> MiB; else GiB, all with
    two decimals. The bounds are inclusive, so exactly 1 GiB prints as "1024.00 MiB".
    """
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024.0:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576.0:.2f} MiB"
    return f"{size / 1073741824.0:.2f} GiB"


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass(frozen=True, kw_only=True)
class AllocatorConfig:
    """Settings of the native CUDA caching allocator, as ``PYTORCH_CUDA_ALLOC_CONF`` sets them.

    Sizes are in bytes (the string form uses MiB, like PyTorch's ``*_mb`` keys).

    * ``max_split_size``: blocks this large or larger are never split and are not handed
      to smaller requests. ``None`` = unlimited (PyTorch's default, SIZE_MAX).
    * ``max_non_split_rounding_size``: an oversize cached block serves a request of at
      least ``max_split_size`` only if it is smaller than request + this. ``None`` = the
      large segment size (20 MiB), PyTorch's default.
    * ``garbage_collection_threshold``: fraction in (0, 1). As in PyTorch it only acts
      when a per-process memory fraction is set (``set_fraction`` in the C++ code).
    * ``roundup_power2_divisions``: one int for all sizes, or a 16-tuple with one value
      per power-of-two interval (index 0: sizes < 2 MiB, index k: [2^k, 2^(k+1)) MiB,
      index 15: >= 32 GiB), as the ``[256:4,>:1]`` list form fills it.
    * ``large_segment_size``: segment cudaMalloc'ed for 1-10 MiB requests and the page of
      large-pool expandable segments (``large_segment_size_mb``, PyTorch >= 2.10; 20 MiB).
    * ``per_process_memory_fraction``: like ``torch.cuda.set_per_process_memory_fraction``:
      caps reserved memory at fraction * capacity and enables garbage collection.
    """

    expandable_segments: bool = False
    max_split_size: int | None = None
    garbage_collection_threshold: float | None = None
    roundup_power2_divisions: int | tuple[int, ...] | None = None
    max_non_split_rounding_size: int | None = None
    large_segment_size: int = K_LARGE_BUFFER
    per_process_memory_fraction: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.expandable_segments, bool):
            raise BadInputError(
                f"expandable_segments must be True or False, got {self.expandable_segments!r}."
            )
        lss = self.large_segment_size
        # AcceleratorAllocatorConfig::parseLargeSegmentSize: must be > kMinLargeAlloc.
        if not isinstance(lss, int) or lss <= K_MIN_LARGE_ALLOC:
            raise BadInputError(
                f"large_segment_size must be an int > {K_MIN_LARGE_ALLOC} bytes (10 MiB), "
                f"got {lss!r}."
            )
        # parseMaxSplitSize / parseMaxNonSplitRoundingSize: must be >= large segment size.
        for name, key in (
            ("max_split_size", "max_split_size_mb"),
            ("max_non_split_rounding_size", "max_non_split_rounding_mb"),
        ):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < lss):
                got = f"{v // MIB} MiB" if isinstance(v, int) and v % MIB == 0 else repr(v)
                raise BadInputError(
                    f"{key} must be at least {lss // MIB} (MiB, the large segment size), got "
                    f"{got}. ({name} = {v!r} bytes.)"
                )
        gc = self.garbage_collection_threshold
        # parseGarbageCollectionThreshold: "set it in (0.0, 1.0)".
        if gc is not None and not (isinstance(gc, int | float) and 0.0 < gc < 1.0):
            raise BadInputError(f"garbage_collection_threshold must be in (0.0, 1.0), got {gc!r}.")
        fr = self.per_process_memory_fraction
        # setMemoryFraction: "invalid fraction ... Please set within [0, 1]".
        if fr is not None and not (isinstance(fr, int | float) and 0.0 <= fr <= 1.0):
            raise BadInputError(f"per_process_memory_fraction must be in [0.0, 1.0], got {fr!r}.")
        div = self.roundup_power2_divisions
        if div is None:
            pass
        elif isinstance(div, int) and not isinstance(div, bool):
            # parseRoundUpPower2Divisions (single value): must be a power of 2.
            if not _is_pow2(div):
                raise BadInputError(f"roundup_power2_divisions must be a power of 2, got {div!r}.")
        elif isinstance(div, tuple):
            if len(div) != _N_INTERVALS or not all(
                isinstance(d, int) and (d == 0 or _is_pow2(d)) for d in div
            ):
                raise BadInputError(
                    f"roundup_power2_divisions as a tuple needs {_N_INTERVALS} values, each 0 "
                    f"or a power of 2, got {div!r}."
                )
        else:
            raise BadInputError(
                f"roundup_power2_divisions must be None, an int or a tuple, got {div!r}."
            )

    # ---- derived values used by the simulator -------------------------------------------

    @property
    def max_split_bytes(self) -> int:
        """max_split_size with ``None`` mapped to "infinite" (PyTorch uses SIZE_MAX)."""
        return self.max_split_size if self.max_split_size is not None else 1 << 62

    @property
    def max_non_split_rounding_bytes(self) -> int:
        if self.max_non_split_rounding_size is not None:
            return self.max_non_split_rounding_size
        # parseArgs: max_non_split_rounding_size_ defaults to large_segment_size_.
        return self.large_segment_size

    def divisions_for(self, size: int) -> int:
        """Divisions for a size (AcceleratorAllocatorConfig::roundup_power2_divisions(size))."""
        div = self.roundup_power2_divisions
        if div is None:
            return 0
        if isinstance(div, int):
            return div
        # interval index = floor(log2(size)) - 20, clamped to [0, 15]
        index = min(max(size.bit_length() - 1 - 20, 0), _N_INTERVALS - 1)
        return div[index]

    def round_size(self, size: int) -> int:
        """Block size for a request (CUDACachingAllocator.cpp: round_size)."""
        if size < K_MIN_BLOCK_SIZE:
            return K_MIN_BLOCK_SIZE
        divisions = self.divisions_for(size)
        if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
            return _roundup_power2_next_division(size, divisions)
        return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)

    def allocation_size(self, size: int) -> int:
        """cudaMalloc size for a rounded request (CUDACachingAllocator.cpp: get_allocation_size)."""
        if size <= K_SMALL_SIZE:
            return K_SMALL_BUFFER
        if size < K_MIN_LARGE_ALLOC:
            return self.large_segment_size
        return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)

    # ---- string form --------------------------------------------------------------------

    @classmethod
    def from_string(cls, conf: str) -> AllocatorConfig:
        """Parse a ``PYTORCH_CUDA_ALLOC_CONF`` value such as
        ``"expandable_segments:True,max_split_size_mb:128"``.

        Follows AcceleratorAllocatorConfig::parseArgs: comma-separated ``key:value`` pairs,
        list values in brackets, whitespace ignored, the last occurrence of a key wins.
        A malformed string, an unknown key or a bad value raises BadInputError.
        """
        if not isinstance(conf, str):
            raise BadInputError(f"PYTORCH_CUDA_ALLOC_CONF must be a string, got {conf!r}.")
        toks = _tokenize(conf)
        kw: dict[str, object] = {}
        i = 0
        n = len(toks)
        while i < n:
            key = toks[i]
            if key in ",:[]":
                raise _malformed(conf, f"expected a key, found {key!r}")
            if key not in VALID_KEYS:
                raise BadInputError(
                    f"Unknown PYTORCH_CUDA_ALLOC_CONF key {key!r} in {conf!r}."
                    f"{closest(key, list(VALID_KEYS))} Valid keys: {', '.join(VALID_KEYS)}."
                )
            if i + 1 >= n or toks[i + 1] != ":":
                raise _malformed(conf, f"expected ':' and a value after {key!r}")
            i += 2
            if i >= n or toks[i] in ",:]":
                raise _malformed(conf, f"missing value for {key!r}")
            if toks[i] == "[":
                end = i + 1
                while end < n and toks[end] != "]":
                    end += 1
                if end >= n:
                    raise _malformed(conf, f"missing ']' in the value of {key!r}")
                value: str | list[str] = toks[i + 1 : end]
                i = end + 1
            else:
                value = toks[i]
                i += 1
            if i < n:
                if toks[i] != ",":
                    raise _malformed(conf, f"expected ',' after the value of {key!r}")
                i += 1  # a trailing ',' is accepted, as PyTorch's parser does
            _apply_key(conf, key, value, kw)
        # parseArgs reads large_segment_size_mb first; the minimum of the other sizes follows it.
        try:
            return cls(**kw)  # type: ignore[arg-type]
        except BadInputError as e:
            raise BadInputError(f"Bad PYTORCH_CUDA_ALLOC_CONF {conf!r}: {e}") from None

    def to_string(self) -> str:
        """The ``PYTORCH_CUDA_ALLOC_CONF`` string for the non-default settings."""
        parts: list[str] = []
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if self.large_segment_size != K_LARGE_BUFFER:
            parts.append(f"large_segment_size_mb:{self.large_segment_size // MIB}")
        if self.max_split_size is not None:
            parts.append(f"max_split_size_mb:{self.max_split_size // MIB}")
        if self.max_non_split_rounding_size is not None:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding_size // MIB}")
        if self.garbage_collection_threshold is not None:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold}")
        div = self.roundup_power2_divisions
        if isinstance(div, int):
            parts.append(f"roundup_power2_divisions:{div}")
        elif isinstance(div, tuple):
            items = ",".join(f"{1 << k}:{d}" for k, d in enumerate(div))
            parts.append(f"roundup_power2_divisions:[{items}]")
        if self.per_process_memory_fraction is not None:
            parts.append(f"per_process_memory_fraction:{self.per_process_memory_fraction}")
        return ",".join(parts)


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    """CUDACachingAllocator.cpp: roundup_power2_next_division."""
    if _is_pow2(size):
        return size
    power2_floor = 1 << (size.bit_length() - 1)
    step = power2_floor >> (divisions.bit_length() - 1)  # >> floor(log2(divisions))
    if step == 0:
        return power2_floor << 1
    floor = size & ~(step - 1)
    return size if floor == size else floor + step


def _tokenize(conf: str) -> list[str]:
    """c10 ConfigTokenizer: ',', ':', '[' and ']' are tokens; whitespace separates nothing."""
    out: list[str] = []
    buf = ""
    for ch in conf:
        if ch in ",:[]":
            if buf:
                out.append(buf)
                buf = ""
            out.append(ch)
        elif not ch.isspace():
            buf += ch
    if buf:
        out.append(buf)
    return out


def _malformed(conf: str, why: str) -> BadInputError:
    return BadInputError(
        f"Malformed PYTORCH_CUDA_ALLOC_CONF {conf!r}: {why}. Expected comma-separated "
        f"key:value pairs such as 'expandable_segments:True,max_split_size_mb:128'. "
        f"Valid keys: {', '.join(VALID_KEYS)}."
    )


def _bad_value(conf: str, key: str, value: object, expected: str) -> BadInputError:
    shown = value if isinstance(value, str) else "[" + ",".join(value) + "]"  # type: ignore[arg-type]
    return BadInputError(
        f"Bad value {shown!r} for PYTORCH_CUDA_ALLOC_CONF key {key!r} in {conf!r}: "
        f"expected {expected}."
    )


def _to_int(conf: str, key: str, value: object, expected: str) -> int:
    if not isinstance(value, str) or not re.fullmatch(r"-?\d+", value):
        raise _bad_value(conf, key, value, expected)
    return int(value)


def _to_float(conf: str, key: str, value: object, expected: str) -> float:
    if not isinstance(value, str):
        raise _bad_value(conf, key, value, expected)
    try:
        out = float(value)
    except ValueError:
        raise _bad_value(conf, key, value, expected) from None
    if not math.isfinite(out):
        raise _bad_value(conf, key, value, expected)
    return out


def _to_bool(conf: str, key: str, value: object) -> bool:
    # ConfigTokenizer::toBool accepts exactly "True" or "False".
    if value == "True":
        return True
    if value == "False":
        return False
    raise _bad_value(conf, key, value, "True or False (capitalised)")


def _apply_key(conf: str, key: str, value: str | list[str], kw: dict[str, object]) -> None:
    if key == "expandable_segments":
        kw["expandable_segments"] = _to_bool(conf, key, value)
    elif key in ("max_split_size_mb", "max_non_split_rounding_mb", "large_segment_size_mb"):
        mb = _to_int(conf, key, value, "a whole number of MiB")
        field = {
            "max_split_size_mb": "max_split_size",
            "max_non_split_rounding_mb": "max_non_split_rounding_size",
            "large_segment_size_mb": "large_segment_size",
        }[key]
        if mb < 0:
            # std::stoull("-1") wraps to SIZE_MAX, which PyTorch clamps to "unlimited".
            if key == "large_segment_size_mb":
                raise _bad_value(conf, key, value, "a positive number of MiB > 10")
            kw[field] = None
        else:
            kw[field] = mb * MIB
    elif key == "garbage_collection_threshold":
        kw[key] = _to_float(conf, key, value, "a number in (0.0, 1.0)")
    elif key == "per_process_memory_fraction":
        kw[key] = _to_float(conf, key, value, "a number in (0.0, 1.0]")
    elif key == "roundup_power2_divisions":
        kw[key] = _parse_divisions(conf, key, value)
    elif key == "backend":
        if value == "cudaMallocAsync":
            raise BadInputError(
                f"PYTORCH_CUDA_ALLOC_CONF {conf!r} selects backend:cudaMallocAsync; memfit "
                "models only the native caching allocator (backend:native)."
            )
        if value != "native":
            raise _bad_value(conf, key, value, "native or cudaMallocAsync")
    # other keys in _IGNORED_KEYS: accepted, no effect on device memory


def _parse_divisions(conf: str, key: str, value: str | list[str]) -> int | tuple[int, ...]:
    """AcceleratorAllocatorConfig::parseRoundUpPower2Divisions."""
    expected = "a power of 2, or a list like [256:4,>:1] of <power-of-2 MiB>:<0 or power of 2>"
    if isinstance(value, str):
        v = _to_int(conf, key, value, expected)
        if not _is_pow2(v):
            raise _bad_value(conf, key, value, expected)
        return v
    table = [0] * _N_INTERVALS
    first = True
    last_index = 0
    items = value
    j = 0
    while j < len(items):
        # each item: boundary ':' divisions, separated by ','
        if j + 2 >= len(items) or items[j + 1] != ":":
            raise _bad_value(conf, key, value, expected)
        bound, div_s = items[j], items[j + 2]
        div = _to_int(conf, key, div_s, expected)
        if not (div == 0 or _is_pow2(div)):
            raise _bad_value(conf, key, value, expected)
        if bound == ">":
            for k in range(last_index + 1, _N_INTERVALS):
                table[k] = div
        else:
            b = _to_int(conf, key, bound, expected)
            if not _is_pow2(b):
                raise _bad_value(conf, key, value, expected)
            index = min(max(b.bit_length() - 1, 0), _N_INTERVALS - 1)
            if first:
                for k in range(index):
                    table[k] = div
                first = False
            table[index] = div
            last_index = index
        j += 3
        if j < len(items):
            if items[j] != ",":
                raise _bad_value(conf, key, value, expected)
            j += 1
            if j >= len(items):
                raise _bad_value(conf, key, value, expected)
    return tuple(table)
