"""Version-dependent behaviour of the libraries memfit runs inside, each named once.

memfit runs in the user's environment, so the torch and transformers it traces are the user's
(DESIGN.md, "The user's stack"). Every behaviour that differs between the supported versions is
a function or constant here, whose docstring says which versions it applies to and why
(transformers' `utils/import_utils.is_torch_greater_or_equal` pattern). The compatibility matrix
(docs/compat.md, `.ci/compat`) runs the tests of each on every stack.

Versions are compared as versions (`packaging.version.Version`), never as strings. transformers'
version is read from its metadata, so this module does not import it (`import memfit` stays
light).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import logging
from collections.abc import Iterator
from typing import Any

import torch
from packaging.version import Version

#: The oldest torch and transformers memfit supports; pyproject.toml declares the same floor and
#: the compatibility matrix tests it (docs/compat.md).
MIN_TORCH = Version("2.8")
MIN_TRANSFORMERS = Version("5.17")


def _release(text: str) -> Version:
    """The release part of a version string: '2.11.0+cu130' -> 2.11.0, '5.18.0.dev0' -> 5.18.0."""
    return Version(Version(text.split("+", 1)[0]).base_version)


#: The installed torch's release (local build tags such as '+cpu' dropped).
TORCH_VERSION = _release(torch.__version__)


@functools.cache
def transformers_version() -> Version | None:
    """The installed transformers' release, read from its metadata (no import); None when it is
    not installed."""
    try:
        return _release(importlib.metadata.version("transformers"))
    except importlib.metadata.PackageNotFoundError:
        return None


def transformers_at_least(version: str) -> bool:
    """True when transformers is installed at `version` or newer."""
    installed = transformers_version()
    return installed is not None and installed >= Version(version)


def torch_at_least(version: str) -> bool:
    """True when the installed torch is `version` or newer."""
    return Version(version) <= TORCH_VERSION


def aten_op(name: str, overload: str = "default") -> Any | None:
    """`torch.ops.aten.<name>.<overload>`, or None when this torch has no such op.

    Ops appear across releases (`_grouped_mm` from torch 2.8, `_scaled_grouped_mm` later);
    `torch.ops.aten.<name>` raises AttributeError for an op the build does not have, so code
    that compares against a newer op looks it up here once.
    """
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return None
    return getattr(packet, overload, None)


def checkpointing_enable_method() -> str:
    """The name of the method that checkpoints a transformers model's blocks.

    transformers 5.23 renamed `gradient_checkpointing_enable` to `activation_checkpointing_enable`
    (the old name stays as an alias there); before 5.23 only the old name exists.
    """
    if transformers_at_least("5.23"):
        return "activation_checkpointing_enable"
    return "gradient_checkpointing_enable"


def checkpointing_training_argument() -> str:
    """The `TrainingArguments` field that turns checkpointing on: `activation_checkpointing`
    from transformers 5.23 (the old `gradient_checkpointing` is deprecated there), else
    `gradient_checkpointing`."""
    if transformers_at_least("5.23"):
        return "activation_checkpointing"
    return "gradient_checkpointing"


#: The oldest transformers whose `generate` memfit traces: `mode="generate"` patches
#: `transformers.generation.utils.StopCheck` (memfit.estimator.generation.oracle.Oracle), which
#: 5.17 introduced.
MIN_TRANSFORMERS_GENERATE = Version("5.17")


def generate_keeps_all_ones_mask() -> bool:
    """True when `generate` passes its all-ones 2-D attention mask to every model call.

    transformers < 5.18 keeps the mask `generate` makes for a prompt without padding
    (`_prepare_attention_mask_for_generation`, grown by one position per step); 5.18 drops a mask
    that is all ones before the first call. With the mask, masking_utils decides whether the
    causal mask can be skipped (`_ignore_causal_mask_sdpa`) by reading it, after checking
    `is_tracing(padding_mask)`, and `is_tracing` counts a FakeTensor as tracing: on fake
    tensors the mask is never skipped, on the device it is (is_causal SDPA, the flash kernel).
    memfit.estimator.generation.oracle.device_mask_checks restores the device's decision on
    these versions; on 5.18+ no mask reaches the check.
    """
    return not transformers_at_least("5.18")


#: Loggers whose import-time warnings concern the library itself, not the user's run:
#: torchao's "Failed to load <kernel>.so" (its CUDA kernels, which a CPU machine cannot load)
#: and torch's pytree warning, from torch 2.13, that torchao still registers its enums as
#: pytree constants. transformers 5 imports torchao with its quantizers whenever it is
#: installed, so every traced command would print them.
IMPORT_NOISE_LOGGERS = ("torchao", "torch.utils._pytree")


@contextlib.contextmanager
def quiet_imports() -> Iterator[None]:
    """Warnings of IMPORT_NOISE_LOGGERS left out during the block (errors still shown); their
    levels are restored after it. For commands that run no code of the user's."""
    loggers = [logging.getLogger(name) for name in IMPORT_NOISE_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def ensure_c10d_meta_kernels() -> None:
    """Meta kernels for the c10d collectives, which FakeTensorMode needs to run a collective
    on fake tensors over the "fake" process group.

    Newer torch registers them when torch.distributed is imported
    (`torch.distributed._meta_registrations`, present in 2.11); torch 2.8 registers the same
    kernels only when `torch.distributed._tools.fake_collectives` (MemTracker's) is imported,
    and without them a fake FSDP2 all-gather raises "c10d::_allgather_base_: ... no fake impl
    or Meta kernel". Importing torch's own module registers them once per process, and leaves
    no second registration to clash with it.
    """
    import importlib.util

    if importlib.util.find_spec("torch.distributed._meta_registrations") is None:
        importlib.import_module("torch.distributed._tools.fake_collectives")
