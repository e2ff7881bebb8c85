"""Fine-tune a GPT-2-shaped model on synthetic tokens with the plan memfit makes for a GPU.

    python examples/gpt2_finetune.py --gpu t4 --steps 3

Runs on CPU in seconds; on a GPU it runs unchanged (and measures with CUDA's statistics).
"""

from __future__ import annotations

import torch
import transformers
from _common import parse_args, plan_apply_train

import memfit

VOCAB, SEQ = 1024, 128


def build() -> torch.nn.Module:
    cfg = transformers.GPT2Config(
        n_layer=4, n_embd=128, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel._from_config(cfg)


def make_batch(n: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (n, SEQ))
    return {"input_ids": ids, "labels": ids}


if __name__ == "__main__":
    args = parse_args(__doc__ or "")
    plan_apply_train(
        source=build(), build=build, make_batch=make_batch,
        goal=memfit.Goal(global_batch=16, seq_len=SEQ, optimizer="adamw"),
        gpu=args.gpu, steps=args.steps,
    )  # fmt: skip
