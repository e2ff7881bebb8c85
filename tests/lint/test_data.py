"""MF006 (dataset on the GPU before the loop), MF008 (padding without truncation), MF009
(pin_memory over GPU tensors)."""

from __future__ import annotations

import pytest

from tests.lint._helpers import hits

# -- MF006 ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "move",
    ["X_train = X_train.cuda()", "train_data = train_data.to(device)",
     "dataset.data = dataset.data.to('cuda')", "val_images = val_images.float().to(dev)"],
)  # fmt: skip
def test_mf006_whole_split_moved_before_the_loop(move):
    src = f"{move}\nfor i in range(10):\n    step(i)\n"
    assert hits(src, "MF006") == [(1, "MF006")]


@pytest.mark.parametrize(
    "src",
    [
        # per batch, in the loop
        "for x, y in loader:\n    x = x.to(device)\n",
        "for b in loader:\n    train_x = train_x.to(device)\n",
        # not a dataset name
        "model = model.to(device)\nfor i in range(3):\n    step()\n",
        "x = x.cuda()\nfor i in range(3):\n    step()\n",
        # to the CPU, or a cast
        "X_train = X_train.to('cpu')\nfor i in range(3):\n    step()\n",
        "X_train = X_train.to(torch.float16)\nfor i in range(3):\n    step()\n",
        # no loop after it
        "X_train = X_train.cuda()\n",
    ],
)
def test_mf006_clean(src):
    assert hits(src, "MF006") == []


# -- MF008 ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    ["tokenizer(texts, padding=True)", "self.tokenizer(batch['text'], padding='longest')",
     "tok(texts, padding='max_length', return_tensors='pt')",
     "tokenizer.batch_encode_plus(texts, padding=True)"],
)  # fmt: skip
def test_mf008_pads_without_truncation(call):
    src = f"def collate(batch, texts):\n    return {call}\n"
    assert hits(src, "MF008") == [(2, "MF008")]


@pytest.mark.parametrize(
    "call",
    [
        "tokenizer(texts, padding=True, truncation=True)",
        "tokenizer(texts, padding='max_length', max_length=128)",
        "tokenizer(texts)",
        "tokenizer(texts, padding=False)",
        "tokenizer(texts, padding=pad)",
        "tokenizer(texts, **kwargs)",
        "tokenizer.pad(features, padding=True)",
        # the text is written in the file: its length is known
        "tokenizer(['a b', 'c'], padding=True)",
        "tokenizer(PROMPTS, padding=True)",
    ],
)
def test_mf008_clean(call):
    head = "PROMPTS = ('hi', 'there')\ndef collate(texts, kwargs, pad, features):\n"
    src = f"{head}    return {call}\n"
    assert hits(src, "MF008") == []


def test_mf008_untruncated_length_check_is_deliberate():
    src = (
        "def encode(self, prompt):\n"
        "    ids = self.tokenizer(prompt, padding='max_length', max_length=77, truncation=True)\n"
        "    untruncated_ids = self.tokenizer(prompt, padding='longest').input_ids\n"
        "    return ids, untruncated_ids\n"
    )
    assert hits(src, "MF008") == []


# -- MF009 ----------------------------------------------------------------------------------


def test_mf009_pin_memory_on_gpu_dataset():
    src = (
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "x, y = x.cuda(), y.cuda()\n"
        "xs = x.to(device)\n"
        "ds = TensorDataset(xs, y)\n"
        "a = DataLoader(ds, batch_size=8, pin_memory=True)\n"
        "b = DataLoader(TensorDataset(X.cuda(), Y.cuda()), pin_memory=True)\n"
    )
    assert hits(src, "MF009") == [(5, "MF009"), (6, "MF009")]


@pytest.mark.parametrize(
    "src",
    [
        "ds = TensorDataset(x, y)\ndl = DataLoader(ds, pin_memory=True)\n",
        "ds = TensorDataset(x.cuda(), y.cuda())\ndl = DataLoader(ds, pin_memory=False)\n",
        "ds = TensorDataset(x.cuda())\ndl = DataLoader(ds)\n",
        "dl = DataLoader(dataset, pin_memory=True)\n",
    ],
)
def test_mf009_clean(src):
    assert hits(src, "MF009") == []
