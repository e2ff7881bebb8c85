"""The target of an estimate: `--gpu` resolved to a catalog card, optionally limited to a
memory budget ("rtx-4090@12GiB", or a bare "12GiB")."""

from __future__ import annotations

import re
from dataclasses import replace

from memfit.cuda._gpu_data import CATALOG
from memfit.cuda.gpus import GPU
from memfit.cuda.overhead import device_overhead
from memfit.errors import BadInputError, closest
from memfit.units import GIB, parse_bytes

__all__ = ["DEFAULT_GPU", "get_gpu", "list_gpus", "with_budget"]

#: The GPU whose kernels, CUDA context and workspaces are assumed when no GPU is named, and
#: for a bare budget such as "12GiB".
DEFAULT_GPU = "a100-80gb"


def _normalize(text: str) -> str:
    """Lowercase, '-'-joined, vendor words dropped: 'NVIDIA GeForce RTX 4090' -> 'rtx-4090'."""
    cleaned = text.strip().lower()
    for sep in ("_", " ", "/", "."):
        cleaned = cleaned.replace(sep, "-")
    tokens = [t for t in cleaned.split("-") if t and t not in ("nvidia", "geforce")]
    return "-".join(tokens)


def _compact(text: str) -> str:
    return _normalize(text).replace("-", "")


def _build_index() -> dict[str, GPU]:
    index: dict[str, GPU] = {}
    for gpu in CATALOG:
        for key in (gpu.name, gpu.display_name, *gpu.aliases):
            compact = _compact(key)
            other = index.get(compact)
            if other is not None and other.name != gpu.name:
                raise AssertionError(f"GPU alias {key!r} is ambiguous: {other.name} and {gpu.name}")
            index[compact] = gpu
    return index


_INDEX = _build_index()


def list_gpus() -> list[GPU]:
    """Every GPU in the catalog, in catalog order (oldest architecture first)."""
    return list(CATALOG)


def _looks_like_size(name: str) -> bool:
    # A unit is required: "4090" is a card, "4090MiB" a budget.
    return bool(re.match(r"^\s*\d+(\.\d+)?\s*[kmgt]i?b\s*$", name, re.IGNORECASE))


def with_budget(gpu: GPU, size: str) -> GPU:
    """`gpu` limited to a memory budget (a MIG slice, a shared card, a safety cap).

    The budget replaces the capacity PyTorch would see; it must be larger than what CUDA keeps
    outside PyTorch's allocator (context, kernels), and not larger than the card.
    """
    budget = parse_bytes(size)
    outside = device_overhead(gpu).outside_allocator_bytes()
    if budget <= outside:
        raise BadInputError(
            f"The budget {size.strip()!r} ({budget / GIB:.2f} GiB) is smaller than the memory "
            f"CUDA itself takes on {gpu.display_name} outside PyTorch's allocator (CUDA context "
            f"and kernels, {outside / GIB:.2f} GiB): nothing would be left for tensors. "
            f"Give a budget above {outside / GIB:.2f} GiB."
        )
    if budget > gpu.total_memory_bytes:
        raise BadInputError(
            f"The budget {size.strip()!r} ({budget / GIB:.2f} GiB) is more than "
            f"{gpu.display_name} has ({gpu.total_memory_gib:.2f} GiB). Give a smaller budget "
            "or another GPU."
        )
    return replace(
        gpu,
        name=f"{gpu.name}@{size.strip()}",
        display_name=f"{gpu.display_name} limited to {budget / GIB:.2f} GiB",
        total_memory_bytes=budget,
    )


def get_gpu(name: str) -> GPU:
    """Look a GPU up by canonical name, alias or torch display name (case-insensitive).

    ``"rtx-4090@12GiB"`` is the card limited to a budget; a bare ``"12GiB"`` assumes an A100's
    kernels and context (see `with_budget`).

    ``"4090"``, ``"RTX4090"``, ``"NVIDIA GeForce RTX 4090"`` and ``"rtx-4090"`` all work.
    ``"a100"`` is the 80 GB SXM4 card, ``"h100"`` the SXM5 card and ``"v100"`` the 16 GB SXM2.
    An unknown name raises BadInputError quoting it and naming the closest known names.
    """
    if isinstance(name, str) and "@" in name:
        base, _, size = name.partition("@")
        return with_budget(get_gpu(base) if base.strip() else get_gpu(DEFAULT_GPU), size)
    if isinstance(name, str) and name.strip()[:1].isdigit() and _looks_like_size(name):
        return with_budget(get_gpu(DEFAULT_GPU), name)
    if not isinstance(name, str) or not name.strip():
        raise BadInputError(
            f"GPU name {name!r} is empty; use one of: {', '.join(g.name for g in CATALOG)}."
        )
    gpu = _INDEX.get(_compact(name))
    if gpu is not None:
        return gpu
    wanted = _normalize(name)
    # Suggest canonical names first; fall back to aliases ("5090" is closer to "4090").
    hint = closest(wanted, [g.name for g in CATALOG]) or closest(
        wanted, [a for g in CATALOG for a in g.aliases]
    )
    raise BadInputError(
        f"Unknown GPU {name!r}.{hint} Known GPUs: {', '.join(g.name for g in CATALOG)}."
    )
