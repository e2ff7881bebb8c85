"""MF001 (graph kept alive), MF003 (retain_graph in a loop), MF007 (zero_grad keeps grads)."""

from __future__ import annotations

import pytest

from tests.lint._helpers import hits, lint

HEAD = """
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""

# -- MF001 ----------------------------------------------------------------------------------

LEAKS = {
    "accumulate": ("total = 0.0\nfor x in data:\n    loss = model(x).sum()\n"
                   "    loss.backward()\n    total += loss\n", 9),
    "accumulate-binop": ("total = 0\nfor x in data:\n    loss = model(x).sum()\n"
                         "    loss.backward()\n    total = total + loss * 2\n", 9),
    "append-loss": ("losses = []\nfor x in data:\n    loss = model(x).sum()\n"
                    "    loss.backward()\n    losses.append(loss)\n", 9),
    "append-output": ("outs = []\nfor x in data:\n    out = model(x)\n    loss = crit(out)\n"
                      "    loss.backward()\n    outs.append(out)\n", 10),
    "dict-of-lists": ("hist = {'l': []}\nfor x in data:\n    loss = model(x).sum()\n"
                      "    scaler.scale(loss).backward()\n    hist['l'].append(loss)\n", 9),
    "on-self": ("class T:\n    def fit(self):\n        for x in data:\n"
                "            loss = self.model(x).sum()\n            loss.backward()\n"
                "            self.last = loss\n", 10),
    "on-self-binop": ("class T:\n    def fit(self):\n        self.running = 0.0\n"
                      "        for x in data:\n            loss = self.model(x).sum()\n"
                      "            loss.backward()\n"
                      "            self.running = self.running + loss\n", 11),
    "carried": ("prev = None\nfor x in data:\n    loss = model(x).sum()\n"
                "    if prev is not None and loss > prev:\n        print('up')\n"
                "    loss.backward()\n    prev = loss\n", 11),
    "accelerator": ("total = 0.0\nfor b in loader:\n    out = model(**b)\n    loss = out.loss\n"
                    "    accelerator.backward(loss)\n    total += loss\n", 10),
    "outputs-attr": ("keep = []\nfor b in loader:\n    outputs = model(**b)\n"
                     "    outputs.loss.backward()\n    keep.append(outputs.logits)\n", 9),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(LEAKS))
def test_mf001_finds_a_graph_kept_past_the_iteration(name):
    src, line = LEAKS[name]
    assert hits(HEAD + src, "MF001") == [(line, "MF001")]


CLEAN = {
    "item": "total = 0.0\nfor x in data:\n    loss = model(x).sum()\n    loss.backward()\n"
            "    total += loss.item()\n",
    "detach": "losses = []\nfor x in data:\n    loss = model(x).sum()\n    loss.backward()\n"
              "    losses.append(loss.detach())\n",
    "float": "t = 0\nfor x in data:\n    loss = model(x).sum()\n    loss.backward()\n"
             "    t += float(loss) * x.size(0)\n",
    "no-backward": "t = 0\nfor x in data:\n    loss = model(x).sum()\n    t += loss\n",
    "reset-each-step": "for x in data:\n    t = 0\n    loss = model(x).sum()\n"
                       "    loss.backward()\n    t += loss\n",
    "labels-not-outputs": "ys = []\nfor x, y in data:\n    y = y.to('cuda')\n"
                          "    loss = crit(model(x), y)\n    loss.backward()\n    ys.append(y)\n",
    "batch-fetch": "xs = []\nfor i in range(3):\n    x, y = get_batch('train')\n"
                   "    loss = model(x, y)\n    loss.backward()\n    xs.append(x)\n",
    "argmax": "preds = []\nfor x in data:\n    out = model(x)\n    loss = crit(out)\n"
              "    loss.backward()\n    preds.append(out.argmax(1))\n",
    "under-no-grad": "t = 0.0\nfor x in data:\n    loss = model(x).sum()\n    loss.backward()\n"
                     "    with torch.no_grad():\n        t += loss\n",
    "multi-loss-sum": "for x in data:\n    loss = 0\n    for h in heads:\n"
                      "        loss += crit(h(x))\n    loss.backward()\n",
    "tbptt-hidden": "hidden = init()\nfor x, y in data:\n    hidden = repackage(hidden)\n"
                    "    out, hidden = model(x, hidden)\n    loss = crit(out, y)\n"
                    "    loss.backward()\n",
    "list-for-later-backward": "for step in range(3):\n    parts = []\n    for x in data:\n"
                               "        parts.append(model(x).sum())\n"
                               "    torch.stack(parts).mean().backward()\n",
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CLEAN))
def test_mf001_leaves_clean_loops_alone(name):
    assert hits(HEAD + CLEAN[name], "MF001") == []


def test_mf001_fix_is_item_for_a_number_and_detach_for_a_tensor_used_later():
    number = lint(HEAD + LEAKS["accumulate"][0], "MF001")[0]
    assert [e.text for e in number.edits] == [".item()"]
    tensor = HEAD + LEAKS["accumulate"][0] + "print(total.item())\n"
    assert [e.text for e in lint(tensor, "MF001")[0].edits] == [".detach()"]
    outputs = lint(HEAD + LEAKS["append-output"][0], "MF001")[0]
    assert outputs.edits == () and ".detach().cpu()" in outputs.fix


# -- MF003 ----------------------------------------------------------------------------------


def test_mf003_retain_graph_rebuilt_every_iteration():
    src = "for x in data:\n    loss = model(x).sum()\n    loss.backward(retain_graph=True)\n"
    assert hits(HEAD + src, "MF003") == [(7, "MF003")]


@pytest.mark.parametrize(
    "src",
    [
        # a second backward through the same graph follows (the doctor's clean_two_losses)
        "for x in data:\n    out = model(x)\n    a = out.sum()\n    b = out.abs().mean()\n"
        "    a.backward(retain_graph=True)\n    b.backward()\n",
        # the graph is built once, before the loop: each iteration needs it retained
        "out = model(x)\nfor i in range(4):\n    out[i].sum().backward(retain_graph=True)\n",
        # higher-order gradients
        "for x in data:\n    loss = model(x).sum()\n"
        "    g = torch.autograd.grad(loss, x, create_graph=True, retain_graph=True)\n",
        # not in a loop
        "loss = model(x).sum()\nloss.backward(retain_graph=True)\n",
        # a variable: cannot tell
        "for x in data:\n    loss = model(x).sum()\n    loss.backward(retain_graph=keep)\n",
    ],
)
def test_mf003_clean(src):
    assert hits(HEAD + src, "MF003") == []


# -- MF007 ----------------------------------------------------------------------------------


def test_mf007_zero_grad_set_to_none_false():
    src = "opt.zero_grad(set_to_none=False)\nopt.zero_grad()\nopt.zero_grad(set_to_none=True)\n"
    assert hits(HEAD + src, "MF007") == [(5, "MF007")]


@pytest.mark.parametrize("update", ["p.grad += g", "p.grad.add_(g)", "p.grad /= n"])
def test_mf007_clean_where_grads_are_updated_in_place(update):
    src = f"for p, g in pairs:\n    {update}\nopt.step()\nopt.zero_grad(set_to_none=False)\n"
    assert hits(HEAD + src, "MF007") == []
