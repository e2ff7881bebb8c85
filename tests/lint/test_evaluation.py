"""MF002: a model run after `.eval()` with grad enabled."""

from __future__ import annotations

import pytest

from tests.lint._helpers import hits

BAD = """
import torch

def evaluate(model, loader):
    model.eval()
    total = 0.0
    for x, y in loader:
        out = model(x)
        total += (out.argmax(1) == y).sum().item()
    model.train()
    return total
"""


def test_mf002_eval_loop_without_no_grad():
    assert hits(BAD, "MF002") == [(8, "MF002")]


def test_mf002_reports_self_model_and_forward():
    src = (
        "class A:\n    def val(self, x):\n        self.net.eval()\n"
        "        return self.net.forward(x)\n"
    )
    assert hits(src, "MF002") == [(4, "MF002")]


@pytest.mark.parametrize(
    "src",
    [
        BAD.replace(
            "    for x, y in loader:", "    with torch.no_grad():\n     for x, y in loader:"
        ),
        BAD.replace("def evaluate", "@torch.no_grad()\ndef evaluate"),
        BAD.replace("def evaluate", "@torch.inference_mode\ndef evaluate"),
        # every call of the function in this file is under no_grad
        BAD + "with torch.no_grad():\n    evaluate(m, dl)\n",
        # the function turns grad off itself
        BAD.replace("    model.eval()\n", "    model.eval()\n    torch.set_grad_enabled(False)\n"),
        # eval mode for training (frozen batch-norm statistics): a backward follows
        "model.eval()\nfor x in data:\n    loss = model(x).sum()\n    loss.backward()\n",
        # back in train mode before the call
        "model.eval()\nmodel.train()\nout = model(x)\n",
        # the tutorial's phases: set_grad_enabled decides
        "for phase in ('train', 'val'):\n    model.eval()\n"
        "    with torch.set_grad_enabled(phase == 'train'):\n        out = model(x)\n",
        # Lightning runs these under no_grad
        "class M:\n    def validation_step(self, batch, i):\n        self.model.eval()\n"
        "        return self.model(batch)\n",
        # generate() is no_grad already; only the forward call is checked
        "model.eval()\nids = model.generate(x)\n",
    ],
)
def test_mf002_clean(src):
    assert hits(src, "MF002") == []


def test_mf002_one_finding_per_evaluation():
    src = "model.eval()\na = model(x)\nb = model(y)\n"
    assert hits(src, "MF002") == [(2, "MF002")]
