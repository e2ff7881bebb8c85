"""MF004 (checkpoint without use_reentrant) and MF005 (a None input to a reentrant one)."""

from __future__ import annotations

import pytest

from tests.lint._helpers import hits

IMP = "from torch.utils.checkpoint import checkpoint\n"


@pytest.mark.parametrize(
    "imports, call",
    [
        ("import torch", "torch.utils.checkpoint.checkpoint"),
        ("from torch.utils.checkpoint import checkpoint", "checkpoint"),
        ("from torch.utils.checkpoint import checkpoint as ckpt", "ckpt"),
        ("import torch.utils.checkpoint as cp", "cp.checkpoint"),
        ("from torch.utils import checkpoint", "checkpoint.checkpoint"),
        ("from torch.utils.checkpoint import checkpoint_sequential", "checkpoint_sequential"),
    ],
)
def test_mf004_every_spelling_of_torch_checkpoint(imports, call):
    assert hits(f"{imports}\ny = {call}(block, x)\n", "MF004") == [(2, "MF004")]


@pytest.mark.parametrize(
    "src",
    [
        f"{IMP}y = checkpoint(f, x, use_reentrant=False)\n",
        f"{IMP}y = checkpoint(f, x, use_reentrant=True)\n",
        f"{IMP}y = checkpoint(f, x, **kw)\n",
        # a project's own checkpoint, not torch's
        "from timm.models import checkpoint\ny = checkpoint(f, x)\n",
        "from deepspeed import checkpointing\ny = checkpointing.checkpoint(f, x)\n",
    ],
)
def test_mf004_clean(src):
    assert hits(src, "MF004") == []


def test_mf005_none_input_to_reentrant_checkpoint():
    imp = "from torch.utils.checkpoint import checkpoint\n"
    assert hits(imp + "y = checkpoint(f, x, None, use_reentrant=True)\n", "MF005") == [(2, "MF005")]
    assert hits(imp + "y = checkpoint(f, x, None)\n", "MF005") == [(2, "MF005")]
    assert hits(imp + "y = checkpoint(f, x, None, use_reentrant=False)\n", "MF005") == []
    assert hits(imp + "y = checkpoint(f, x, mask, use_reentrant=True)\n", "MF005") == []
    assert hits(imp + "y = checkpoint(f, x, None, use_reentrant=flag)\n", "MF005") == []
