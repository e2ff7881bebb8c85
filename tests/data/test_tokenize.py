"""memfit.data.tokenize: a local tokenizer.json, its own truncation switched off, and the
folders that are not one."""

from __future__ import annotations

import pytest

from memfit.data.tokenize import load_tokenizer, tokenizer_beside
from memfit.errors import BadInputError


def test_truncation_and_padding_of_the_file_are_off(tmp_path, words_tok):
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(str(words_tok / "tokenizer.json"))
    t.enable_truncation(2)
    t.enable_padding(length=8)
    t.save(str(words_tok / "tokenizer.json"))
    tok = load_tokenizer(words_tok / "tokenizer.json")  # the file itself is accepted too
    assert tok.encode(["the cat sat on", "dog"]) == [[1, 2, 3, 4], [7]]
    assert tok.vocab_size == 8 and not tok.approximate


def test_folders_that_are_not_a_tokenizer(tmp_path):
    with pytest.raises(BadInputError, match=r"'.*missing' does not exist.*save_pretrained"):
        load_tokenizer(tmp_path / "missing")
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "vocab.txt").write_text("a\n")
    with pytest.raises(BadInputError, match=r"has no tokenizer.json \(it holds vocab.txt\)"):
        load_tokenizer(slow)
    (slow / "tokenizer.json").write_text("{not json")
    with pytest.raises(BadInputError, match=r"not a tokenizer\.json that the tokenizers library"):
        load_tokenizer(slow)


def test_tokenizer_beside_a_config(tmp_path, words_tok):
    (words_tok / "config.json").write_text("{}")
    assert tokenizer_beside(str(words_tok / "config.json")) == words_tok
    assert tokenizer_beside("gpt2") is None


def test_import_is_light():
    import subprocess
    import sys

    code = (
        "import sys, memfit.data, memfit.cli.app\n"
        "heavy = ('transformers', 'tokenizers', 'pyarrow', 'datasets')\n"
        "assert not [m for m in heavy if m in sys.modules], sys.modules.keys() & set(heavy)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
