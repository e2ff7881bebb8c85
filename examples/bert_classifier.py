"""Train a BERT-shaped sentence classifier on synthetic tokens with memfit's plan.

python examples/bert_classifier.py --gpu rtx-3060 --steps 3
"""

from __future__ import annotations

import torch
import transformers
from _common import parse_args, plan_apply_train

import memfit

VOCAB, SEQ = 2048, 128


def build() -> torch.nn.Module:
    cfg = transformers.BertConfig(
        hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512,
        vocab_size=VOCAB, max_position_embeddings=SEQ, num_labels=2,
    )  # fmt: skip
    return transformers.BertForSequenceClassification._from_config(cfg)


def make_batch(n: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(0, VOCAB, (n, SEQ)), "labels": torch.randint(0, 2, (n,))}


if __name__ == "__main__":
    args = parse_args(__doc__ or "")
    plan_apply_train(
        source=build(), build=build, make_batch=make_batch,
        goal=memfit.Goal(global_batch=16, seq_len=SEQ, optimizer="adamw"),
        gpu=args.gpu, steps=args.steps,
    )  # fmt: skip
