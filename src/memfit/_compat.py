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

import functools
import importlib.metadata
from typing import Any

import torch
from packaging.version import Version

#: The oldest torch and transformers memfit supports; pyproject.toml declares the same floor and
#: the compatibility matrix tests it (docs/compat.md).
MIN_TORCH = Version("2.8")
MIN_TRANSFORMERS = Version("4.56")


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
    return TORCH_VERSION >= Version(version)


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
