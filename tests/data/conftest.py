"""Local tokenizers and tiny model configs for the memfit.data tests: built here, nothing
downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

#: The words of the WordLevel tokenizer, ids 1.. in this order (0 is "[UNK]").
WORDS = ("the", "cat", "sat", "on", "mat", "a", "dog")


def word_level(folder: Path) -> Path:
    """A WordLevel tokenizer splitting on whitespace: "[UNK]" 0, then WORDS as ids 1..7.
    A run of spaces is no token at all, as for any whitespace tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{w: i for i, w in enumerate(WORDS, start=1)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def byte_bpe(folder: Path) -> Path:
    """A byte-level BPE (as GPT-2's) trained on a few lines: a space is a token of its own."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=280, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([" ".join(WORDS)] * 5, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def tiny_gpt2_config(folder: Path, *, vocab: int = 300, positions: int = 64) -> Path:
    """config.json of a 2-layer GPT-2 (hidden 32, tied head) for the estimator."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2,
        "n_embd": 32, "n_head": 2, "vocab_size": vocab, "n_positions": positions,
        "bos_token_id": 0, "eos_token_id": 0,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder / "config.json"


@pytest.fixture
def words_tok(tmp_path: Path) -> Path:
    return word_level(tmp_path / "words_tok")


@pytest.fixture
def bpe_tok(tmp_path: Path) -> Path:
    return byte_bpe(tmp_path / "bpe_tok")


@pytest.fixture
def tiny_config(tmp_path: Path) -> Path:
    return tiny_gpt2_config(tmp_path / "tiny")
