"""Byte sizes: the unit constants, reading sizes people write ("12GiB", "500 MiB", "16GB",
"1073741824") and writing sizes for people ("1.50 KiB").

Binary units (KiB, MiB, GiB, TiB = 1024^n) and decimal ones (kB, MB, GB, TB = 1000^n) are both
accepted and never confused; a bare number is bytes. Output uses binary units, labelled as such
(integer bytes everywhere inside; units only at display).
"""

from __future__ import annotations

import re

from memfit.errors import BadInputError

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40

#: Binary units for display, smallest first.
BINARY_UNITS = (("B", 1), ("KiB", KIB), ("MiB", MIB), ("GiB", GIB), ("TiB", TIB))

_UNITS = {
    "": 1, "b": 1,
    "kib": KIB, "mib": MIB, "gib": GIB, "tib": TIB,
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


def format_bytes(n: int | None) -> str:
    """1536 -> "1.50 KiB"; binary units, labelled as such; None -> "-"."""
    if n is None:
        return "-"
    value = float(n)
    for unit, _ in BINARY_UNITS:
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
