"""Token counts: a local Hugging Face tokenizer, or a labelled approximation when there is none.

Nothing is downloaded. A tokenizer is a folder holding `tokenizer.json` (what
`tokenizer.save_pretrained(folder)` writes for every fast tokenizer), read with the
`tokenizers` library. Its own truncation and padding settings are switched off, so a length is
the sample's whole length, and special tokens are added as the tokenizer's post-processor adds
them (a BOS or EOS counts, as it does in training).

Without one, `ApproximateTokenizer` counts `max(ceil(characters / 4), words)`: OpenAI's rule of
thumb of about 4 characters of English text a token, and at least one token per
whitespace-separated word. It gives no token ids, so no vocabulary coverage. Reports say
"approximate" wherever its numbers appear.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from memfit.errors import BadInputError

#: OpenAI's rule of thumb: "1 token ~= 4 chars in English" (help.openai.com, "What are tokens
#: and how to count them?").
CHARS_PER_TOKEN = 4


class Tokenizer(Protocol):
    """What the data pass needs of a tokenizer."""

    name: str
    approximate: bool
    vocab_size: int | None

    def encode(self, texts: list[str]) -> list[list[int]] | list[int]:
        """Token ids of each text (a real tokenizer), or each text's length (approximate)."""
        ...


@dataclass
class ApproximateTokenizer:
    """`max(ceil(len(text) / CHARS_PER_TOKEN), len(text.split()))` tokens per text; no ids.

    Example:
        >>> ApproximateTokenizer().encode(["a b c d", "x" * 10])
        [4, 3]
    """

    name: str = f"approximate (1 token per {CHARS_PER_TOKEN} characters, at least 1 per word)"
    approximate: bool = True
    vocab_size: int | None = None

    def encode(self, texts: list[str]) -> list[int]:
        return [max(-(-len(t) // CHARS_PER_TOKEN), len(t.split())) for t in texts]


@dataclass
class HfTokenizer:
    """A `tokenizers.Tokenizer` read from a folder's tokenizer.json (see `load_tokenizer`)."""

    name: str
    tokenizer: Any
    approximate: bool = False
    vocab_size: int | None = None

    def encode(self, texts: list[str]) -> list[list[int]]:
        # encode_batch runs on the Rust side's thread pool.
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=True)]


def load_tokenizer(folder: str | Path) -> HfTokenizer:
    """The tokenizer saved in `folder` (its tokenizer.json), truncation and padding off.

    Raises BadInputError when the folder or its tokenizer.json is missing (a slow tokenizer
    saved without tokenizer.json says how to convert it), or the file is not a tokenizer.

    Example:
        >>> tok = load_tokenizer("checkpoints/my-model")
        >>> tok.encode(["hello world"])
    """
    d = Path(folder)
    if d.is_file() and d.name == "tokenizer.json":
        d = d.parent
    if not d.is_dir():
        raise BadInputError(
            f"The tokenizer folder {str(d)!r} does not exist. Pass the folder that "
            "tokenizer.save_pretrained() wrote (it holds tokenizer.json)."
        )
    file = d / "tokenizer.json"
    if not file.exists():
        present = sorted(x.name for x in d.iterdir())[:8]
        raise BadInputError(
            f"The tokenizer folder {str(d)!r} has no tokenizer.json (it holds "
            f"{', '.join(present) or 'nothing'}). memfit reads fast tokenizers only: save one "
            "with AutoTokenizer.from_pretrained(folder).save_pretrained(folder), which writes "
            "tokenizer.json, or leave the tokenizer out for the approximate count."
        )
    from tokenizers import Tokenizer as RustTokenizer

    try:
        tok = RustTokenizer.from_file(str(file))
    except Exception as e:  # tokenizers raises a bare Exception for a malformed file
        raise BadInputError(
            f"{file} is not a tokenizer.json that the tokenizers library can read ({e}). "
            "Save the tokenizer again with save_pretrained()."
        ) from None
    tok.no_truncation()
    tok.no_padding()
    return HfTokenizer(
        name=str(d), tokenizer=tok, vocab_size=tok.get_vocab_size(with_added_tokens=True)
    )


def tokenizer_beside(model: str) -> Path | None:
    """The folder of a model given as a config.json path, when it also holds tokenizer.json
    (a checkpoint saved with save_pretrained); None otherwise."""
    p = Path(model)
    folder = p.parent if p.name == "config.json" else p
    if folder.is_dir() and (folder / "tokenizer.json").exists():
        return folder
    return None
