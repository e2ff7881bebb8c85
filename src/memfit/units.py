"""Byte sizes written by people: "12GiB", "500 MiB", "16GB", "1073741824".

Binary units (KiB, MiB, GiB, TiB = 1024^n) and decimal ones (kB, MB, GB, TB = 1000^n) are both
accepted and never confused; a bare number is bytes.
"""

from __future__ import annotations

import re

from memfit.errors import BadInputError

_UNITS = {
    "": 1, "b": 1,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}  # fmt: skip

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str) -> int:
    """ "12GiB" -> 12884901888. Raises BadInputError naming the value and the accepted forms."""
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise BadInputError(
            f"Cannot read the size {text!r}. Write a number of bytes with an optional unit: "
            "12GiB, 500MiB (binary) or 16GB (decimal)."
        )
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise BadInputError(f"The size {text!r} must be more than 0 bytes.")
    return value
