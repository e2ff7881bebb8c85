"""A `Workload` as the Python that builds it, for the "to use it" code a plan prints.

Every field that differs from its default is written, from the dataclass's own fields, so
`eval` of the text equals the workload (tests/planner/test_apply_code.py) and a field added to
`Workload` is printed without a change here. The recipe a plan chooses (micro-batch,
accumulation, sequence length, precision, optimizer) is written first and always, so the reader
sees it even at a default.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from memfit.workload import LoraConfig, Workload

#: Written first, even at their defaults.
LEAD = ("batch_size", "grad_accum", "seq_len", "precision", "optimizer")


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def _non_default(obj: Any, lead: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    """(name, value) of `obj`'s init fields: those in `lead` first (when set), then the others
    that differ from their defaults, in the dataclass's order."""
    fields = {f.name: f for f in dataclasses.fields(obj) if f.init}
    first = [(n, getattr(obj, n)) for n in lead if getattr(obj, n) is not None]
    rest = [
        (n, getattr(obj, n))
        for n, f in fields.items()
        if n not in lead and getattr(obj, n) != _default(f)
    ]
    return first + rest


def _code(value: Any, module: str) -> str:
    if isinstance(value, LoraConfig):
        args = ", ".join(f"{n}={v!r}" for n, v in _non_default(value, ("rank",)))
        return f"{module}.LoraConfig({args})"
    return repr(value)


def workload_code(w: Workload, module: str = "memfit") -> str:
    """`memfit.Workload(...)` that builds `w` (`module` is the name memfit is imported as)."""
    args = ", ".join(f"{n}={_code(v, module)}" for n, v in _non_default(w, LEAD))
    return f"{module}.Workload({args})"
