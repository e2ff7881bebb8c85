"""memfit._compat on the installed stack, and the supported range against the matrix CI runs.

This file is in the compatibility subset (.ci/compat), so each check runs on every stack.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
import torch
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from memfit import _compat

ROOT = Path(__file__).resolve().parents[1]


def _matrix() -> dict[str, dict[str, str]]:
    """The stacks of .ci/compat, by name: their exact versions."""
    text = (ROOT / ".ci" / "compat").read_text()
    rows = re.findall(r'^\s*"([\w-]+)\|([^|]+)\|([^|]+)\|([^|]+)\|([^|]+)\|', text, re.M)
    assert rows, "no stack found in .ci/compat"
    keys = ("torch", "transformers", "peft", "accelerate")
    return {name: dict(zip(keys, versions, strict=True)) for name, *versions in rows}


def _requirement(name: str) -> SpecifierSet:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for req in project["dependencies"]:
        m = re.match(rf"^{re.escape(name)}([<>=!~].*)$", req)
        if m:
            return SpecifierSet(m.group(1))
    raise AssertionError(f"{name} is not a dependency in pyproject.toml")


def test_release_drops_local_and_dev_tags():
    assert _compat._release("2.11.0+cu130") == Version("2.11.0")
    assert _compat._release("5.18.0.dev0") == Version("5.18.0")
    assert _compat._release("2.13.0") == Version("2.13.0")


def test_the_matrix_has_the_three_stacks_the_design_asks_for():
    stacks = _matrix()
    assert {"oldest", "gpu-image", "newest"} <= set(stacks)
    # The GPU image's pair, as the H200 measurements ran it (shared/gpu-evidence).
    assert stacks["gpu-image"]["torch"] == "2.11.0"
    assert stacks["gpu-image"]["transformers"] == "5.17.0"


@pytest.mark.parametrize("package", ["torch", "transformers"])
def test_pyproject_declares_exactly_the_tested_range(package):
    stacks = _matrix()
    spec = _requirement(package)
    versions = sorted(Version(s[package]) for s in stacks.values())
    oldest, newest = versions[0], versions[-1]
    # The floor is the oldest stack's version, and the cap lets in no later minor release than
    # the newest stack's.
    assert all(v in spec for v in versions), (spec, versions)
    floor = [s.version for s in spec if s.operator == ">="]
    assert floor == [str(oldest)], (spec, oldest)
    next_minor = Version(f"{newest.major}.{newest.minor + 1}")
    assert next_minor not in spec, (spec, newest)
    # _compat names the same floor (major.minor).
    minimum = {"torch": _compat.MIN_TORCH, "transformers": _compat.MIN_TRANSFORMERS}[package]
    assert minimum == Version(f"{oldest.major}.{oldest.minor}")


def test_the_installed_stack_is_in_the_supported_range():
    assert _compat.TORCH_VERSION in _requirement("torch")
    installed = _compat.transformers_version()
    assert installed is not None and installed in _requirement("transformers")


def test_aten_op_finds_ops_and_answers_none_for_absent_ones():
    assert _compat.aten_op("mm") is torch.ops.aten.mm.default
    assert _compat.aten_op("no_such_op_in_any_torch") is None
    assert _compat.aten_op("mm", "no_such_overload") is None


def test_checkpointing_names_exist_in_the_installed_transformers():
    import dataclasses

    import transformers

    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    assert _compat.checkpointing_training_argument() in fields
    assert hasattr(transformers.PreTrainedModel, _compat.checkpointing_enable_method())
