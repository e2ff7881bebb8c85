"""Write the JSON Lines file the README's `memfit data` example reads: 100,000 samples of
English-like text whose lengths follow a log-normal law (most short, a long tail), plus one
planted outlier: a line with 100,000 spaces, as a bad scrape leaves.

    python examples/make_train_jsonl.py train.jsonl
    memfit data train.jsonl --model gpt2 --gpu rtx-4090 --batch 16

The file is the same on every machine (a fixed seed), so the README's figures can be rerun.
"""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

SAMPLES = 100_000
#: The sample (0-based) that holds the planted whitespace run.
OUTLIER_AT = 73_411
WORDS = (
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "from", "memory", "model", "training",
    "gradient", "allocator", "sequence", "tokens", "batch", "precision", "checkpoint",
)  # fmt: skip


def sample(rng: random.Random) -> str:
    # Words per sample: log-normal, median ~80, a tail past a thousand.
    n = max(3, int(math.exp(rng.gauss(math.log(80), 0.75))))
    return " ".join(rng.choices(WORDS, k=n))


def main(path: str) -> int:
    rng = random.Random(0)
    with Path(path).open("w", encoding="utf-8") as f:
        for i in range(SAMPLES):
            text = "def f():" + " " * 100_000 + "return 0" if i == OUTLIER_AT else sample(rng)
            f.write(json.dumps({"text": text}) + "\n")
    print(f"wrote {SAMPLES:,} samples to {path}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/make_train_jsonl.py OUT.jsonl")
    sys.exit(main(sys.argv[1]))
