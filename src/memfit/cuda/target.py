"""The target of an estimate: `--gpu` resolved to a catalog card, optionally limited to a
memory budget ("rtx-4090@12GiB", or a bare "12GiB").

What a budget means: the memory this process may use on the card, counted the way nvidia-smi
counts a process (CUDA context and kernels included, not only what PyTorch allocates). Sizes
are read by `memfit.units.parse_bytes`: "12GB" is decimal (12 x 10^9 bytes = 11.18 GiB),
"12GiB" binary (12 x 2^30 bytes); the two are never confused. A size inside a card's name
("rtx-3060-12gb", "rtx-4060-ti-16gb") is part of the name, not a budget.
"""

from __future__ import annotations

import re
from dataclasses import replace

from memfit.cuda._gpu_data import CATALOG
from memfit.cuda.gpus import GPU
from memfit.cuda.overhead import device_overhead
from memfit.errors import BadInputError, closest
from memfit.units import GIB, parse_bytes

__all__ = [
    "BUDGET_MEANING",
    "DEFAULT_GPU",
    "GPU_OPTION_HELP",
    "get_gpu",
    "list_gpus",
    "with_budget",
]

#: The GPU whose kernels, CUDA context and workspaces are assumed when no GPU is named, and
#: for a bare budget such as "12GiB".
DEFAULT_GPU = "a100-80gb"

#: One sentence on what a budget is, for error messages and help texts.
BUDGET_MEANING = (
    "A budget is the memory the process may use as nvidia-smi counts it (CUDA context "
    "included); 12GB means 12 x 10^9 bytes (11.18 GiB), 12GiB means 12 x 2^30 bytes."
)

#: Help text for a `--gpu` option.
GPU_OPTION_HELP = (
    "Target GPU: a name from `memfit gpus` (rtx-4090, a100-80gb, rtx-4060-ti-16gb, ...), "
    "optionally limited to a budget, NAME@SIZE (rtx-4090@12GiB), or a bare SIZE (A100 kernels "
    "and context assumed). " + BUDGET_MEANING
)


def _normalize(text: str) -> str:
    """Lowercase, '-'-joined, vendor words dropped: 'NVIDIA GeForce RTX 4090' -> 'rtx-4090'."""
    cleaned = text.strip().lower()
    for sep in ("_", " ", "/", "."):
        cleaned = cleaned.replace(sep, "-")
    tokens = [t for t in cleaned.split("-") if t and t not in ("nvidia", "geforce")]
    return "-".join(tokens)


def _compact(text: str) -> str:
    return _normalize(text).replace("-", "")


def _build_index() -> tuple[dict[str, GPU], dict[str, tuple[GPU, ...]]]:
    """(name -> card, name -> the cards it could mean).

    Canonical names and aliases must be unique. A torch display name may be shared by memory
    variants ("NVIDIA GeForce RTX 4060 Ti" is printed by the 8 GB and the 16 GB card): that
    name, and the same without "rtx" ("4060 ti"), then resolves to an error listing them.
    """
    index: dict[str, GPU] = {}
    for gpu in CATALOG:
        for key in (gpu.name, *gpu.aliases):
            compact = _compact(key)
            other = index.get(compact)
            if other is not None and other.name != gpu.name:
                raise AssertionError(f"GPU alias {key!r} is ambiguous: {other.name} and {gpu.name}")
            index[compact] = gpu
    by_display: dict[str, list[GPU]] = {}
    for gpu in CATALOG:
        by_display.setdefault(_compact(gpu.display_name), []).append(gpu)
    ambiguous: dict[str, tuple[GPU, ...]] = {}
    for compact, gpus in by_display.items():
        if len(gpus) == 1:
            other = index.setdefault(compact, gpus[0])
            if other.name != gpus[0].name:
                raise AssertionError(
                    f"GPU name {gpus[0].display_name!r} is ambiguous: {other.name} and "
                    f"{gpus[0].name}"
                )
            continue
        for key in {compact, compact.removeprefix("rtx")}:
            if key in index:
                raise AssertionError(f"GPU alias {key!r} is also a shared display name")
            ambiguous[key] = tuple(gpus)
    return index, ambiguous


_INDEX, _AMBIGUOUS = _build_index()


def list_gpus() -> list[GPU]:
    """Every GPU in the catalog, in catalog order (oldest architecture first)."""
    return list(CATALOG)


def _looks_like_size(name: str) -> bool:
    # A unit is required: "4090" is a card, "4090MiB" a budget.
    return bool(re.match(r"^\s*\d+(\.\d+)?\s*[kmgt]i?b\s*$", name, re.IGNORECASE))


def _sizes(n: int) -> str:
    """Both units, so that a GB/GiB mix-up shows: "11.18 GiB = 12.00 GB"."""
    return f"{n / GIB:.2f} GiB = {n / 10**9:.2f} GB"


def with_budget(gpu: GPU, size: str) -> GPU:
    """`gpu` limited to a memory budget (a MIG slice, a shared card, a safety cap).

    The budget is the memory the process may use as nvidia-smi counts it: it replaces the
    card's capacity, and the CUDA context and kernels (`memfit.cuda.overhead`) come out of it
    before PyTorch's allocator gets the rest. "12GB" is 12 x 10^9 bytes, "12GiB" 12 x 2^30
    (`memfit.units.parse_bytes`). It must be larger than what CUDA keeps outside PyTorch's
    allocator, and not larger than the card's capacity as PyTorch reports it.
    """
    budget = parse_bytes(size)
    outside = device_overhead(gpu).outside_allocator_bytes()
    if budget <= outside:
        raise BadInputError(
            f"The budget {size.strip()!r} ({_sizes(budget)}) is smaller than the memory "
            f"CUDA itself takes on {gpu.display_name} outside PyTorch's allocator (CUDA context "
            f"and kernels, {outside / GIB:.2f} GiB): nothing would be left for tensors. "
            f"Give a budget above {outside / GIB:.2f} GiB. {BUDGET_MEANING}"
        )
    if budget > gpu.total_memory_bytes:
        raise BadInputError(
            f"The budget {size.strip()!r} ({_sizes(budget)}) is more than "
            f"{gpu.display_name} has ({gpu.total_memory_gib:.2f} GiB, as "
            "torch.cuda.get_device_properties reports it; nvidia-smi shows a larger total "
            "because the driver keeps some memory back). Give a smaller budget or another GPU. "
            f"{BUDGET_MEANING}"
        )
    return replace(
        gpu,
        name=f"{gpu.name}@{size.strip()}",
        display_name=f"{gpu.display_name} limited to {budget / GIB:.2f} GiB",
        total_memory_bytes=budget,
    )


def get_gpu(name: str) -> GPU:
    """Look a GPU up by canonical name, alias or torch display name (case-insensitive).

    ``"4090"``, ``"RTX4090"``, ``"NVIDIA GeForce RTX 4090"`` and ``"rtx-4090"`` all work.
    ``"a100"`` is the 80 GB SXM4 card, ``"h100"`` the SXM5 card and ``"v100"`` the 16 GB SXM2.
    A size in a card's name belongs to the name: ``"rtx-3060-12gb"`` and ``"4060ti 16GB"`` are
    cards. A name shared by memory variants (``"4060 ti"``, ``"NVIDIA GeForce RTX 4060 Ti"``)
    raises BadInputError listing them. An unknown name raises BadInputError quoting it and
    naming the closest known names.

    Budgets: ``"rtx-4090@12GiB"`` is the card limited to 12 GiB, and a bare ``"12GiB"`` the
    same budget on an A100's kernels and context (see `with_budget`). A budget is the memory
    the process may use as nvidia-smi counts it, CUDA context included; ``"12GB"`` is decimal
    (12 x 10^9 bytes = 11.18 GiB) and ``"12GiB"`` binary (12 x 2^30 bytes), both accepted and
    never confused (`memfit.units.parse_bytes`). A bare number ("12") is not a size: write the
    unit.
    """
    if isinstance(name, str) and "@" in name:
        base, _, size = name.partition("@")
        return with_budget(get_gpu(base) if base.strip() else get_gpu(DEFAULT_GPU), size)
    if isinstance(name, str) and name.strip()[:1].isdigit() and _looks_like_size(name):
        return with_budget(get_gpu(DEFAULT_GPU), name)
    if not isinstance(name, str):
        raise BadInputError(
            "A GPU is named by a string (e.g. 'rtx-4090' or 'rtx-4090@12GiB'), got "
            f"{name!r} ({type(name).__name__})."
        )
    if not name.strip():
        raise BadInputError(
            f"GPU name {name!r} is empty; use one of: {', '.join(g.name for g in CATALOG)}."
        )
    compact = _compact(name)
    gpu = _INDEX.get(compact)
    if gpu is not None:
        return gpu
    variants = _AMBIGUOUS.get(compact)
    if variants is not None:
        listed = ", ".join(f"{g.name} ({g.total_memory_gib:.2f} GiB)" for g in variants)
        raise BadInputError(
            f"GPU {name!r} is ambiguous: {variants[0].display_name} comes with different "
            f"memory sizes. Name one of: {listed}."
        )
    wanted = _normalize(name)
    # Suggest canonical names first; fall back to aliases ("3070" is closer to "3060").
    hint = closest(wanted, [g.name for g in CATALOG]) or closest(
        wanted, [a for g in CATALOG for a in g.aliases]
    )
    if name.strip().replace(".", "", 1).isdigit():
        hint += f" A budget needs a unit: {name.strip()}GiB (binary) or {name.strip()}GB (decimal)."
    raise BadInputError(
        f"Unknown GPU {name!r}.{hint} Known GPUs: {', '.join(g.name for g in CATALOG)}."
    )
