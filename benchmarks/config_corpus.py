"""Every config transformers writes: memfit on the default config of each model type.

For each model type of the installed transformers with a causal-LM, masked-LM or seq2seq-LM
Auto class (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, `MODEL_FOR_MASKED_LM_MAPPING_NAMES`,
`MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES`), its default config (`AutoConfig.for_model`)
is written with `save_pretrained` to a folder, as a user's config.json is, and estimated by
memfit: a training step (batch 1, `SEQ_LEN` tokens), and for a causal LM a generation too
(prompt of `SEQ_LEN`, `NEW_TOKENS` new tokens). memfit's parameter count is compared with the
class built whole on the meta device by transformers itself. A model memfit cannot estimate
must be refused by name: a BadInputError or TraceError saying why ("refused"); any other
exception, or a parameter count that differs, is a failure.

The task: seq2seq-lm for an encoder-decoder config that has one, else masked-lm, else causal-lm
(an encoder such as BERT has both; its pretraining objective is the masked one).

    python benchmarks/config_corpus.py                  # every model type: the markdown table
    python benchmarks/config_corpus.py qwen2 t5 mamba   # these model types
    python benchmarks/config_corpus.py --limit 120      # give up on a type after 120 s
    python benchmarks/config_corpus.py --json out.json  # also every row as JSON

tests/models/test_config_corpus.py runs it on a subset, and holds the refusals to a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("MEMFIT_NO_CACHE", "1")  # every figure traced, not read back

import torch

import memfit
from memfit.errors import BadInputError, TraceError

#: Tokens of the training step and of the generation's prompt; batch 1.
SEQ_LEN = 64
#: Tokens a causal LM generates after its prompt.
NEW_TOKENS = 4
#: memfit's task -> transformers' Auto mapping, in the order the task is chosen.
MAPPINGS = {
    "seq2seq-lm": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "masked-lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
}
_AUTO = {
    "seq2seq-lm": "AutoModelForSeq2SeqLM",
    "masked-lm": "AutoModelForMaskedLM",
    "causal-lm": "AutoModelForCausalLM",
}


@dataclass
class Row:
    """One model type's outcome."""

    model_type: str
    task: str | None
    #: "pass", "refused" (a BadInputError or TraceError) or "failed" (anything else, or a
    #: parameter count that differs from transformers').
    status: str
    #: The refusal's or failure's exception class, and its message (first line).
    error: str | None = None
    reason: str | None = None
    train_seconds: float | None = None
    generate_seconds: float | None = None
    parameter_count: int | None = None
    transformers_parameter_count: int | None = None
    replayed: bool | None = None


class _OutOfTime(BaseException):
    """--limit ran out (a BaseException, so that no `except Exception` on the way wraps it)."""


def model_types() -> list[str]:
    """The model types with a causal-LM, masked-LM or seq2seq-LM Auto class, sorted."""
    from transformers.models.auto import modeling_auto

    return sorted({mt for name in MAPPINGS.values() for mt in getattr(modeling_auto, name)})


def corpus_task(model_type: str, config: Any) -> str:
    """The task the corpus estimates `model_type` for (see the module docstring)."""
    from transformers.models.auto import modeling_auto

    tasks = [t for t, name in MAPPINGS.items() if model_type in getattr(modeling_auto, name)]
    if getattr(config, "is_encoder_decoder", False) and "seq2seq-lm" in tasks:
        return "seq2seq-lm"
    return next(t for t in ("masked-lm", "causal-lm", "seq2seq-lm") if t in tasks)


def transformers_parameter_count(folder: Path, task: str) -> int:
    """Parameters of transformers' class for `task`, built whole from `folder` on meta (a
    tied weight counted once)."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = getattr(transformers, _AUTO[task]).from_config(config)
    return sum(p.numel() for p in dict.fromkeys(model.parameters()))


@contextlib.contextmanager
def _time_limit(seconds: int | None) -> Iterator[None]:
    if not seconds:
        yield
        return

    def out_of_time(_signum: int, _frame: Any) -> None:
        raise _OutOfTime

    previous = signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_one(model_type: str, *, seq_len: int = SEQ_LEN, limit: int | None = None) -> Row:
    """Estimate the default config of `model_type` (see the module docstring)."""
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    row = Row(model_type, None, "failed")
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        folder = Path(tmp) / model_type  # what memfit names the model
        try:
            with _time_limit(limit):
                config = transformers.AutoConfig.for_model(model_type)
                config.save_pretrained(folder)
                row.task = corpus_task(model_type, config)
                t0 = time.perf_counter()
                est = memfit.estimate(
                    folder, memfit.Workload(batch_size=1, seq_len=seq_len), task=row.task
                )
                row.train_seconds = round(time.perf_counter() - t0, 1)
                row.parameter_count, row.replayed = est.parameter_count, est.replayed
                if row.task == "causal-lm":
                    t0 = time.perf_counter()
                    gen = memfit.Workload(
                        batch_size=1, mode="generate", prompt_len=seq_len, new_tokens=NEW_TOKENS
                    )
                    memfit.estimate(folder, gen, task=row.task)
                    row.generate_seconds = round(time.perf_counter() - t0, 1)
                row.transformers_parameter_count = transformers_parameter_count(folder, row.task)
        except (BadInputError, TraceError) as e:
            row.status, row.error, row.reason = "refused", type(e).__name__, _first_line(e)
            return row
        except _OutOfTime:
            row.error, row.reason = "OutOfTime", f"over the --limit of {limit} s"
            return row
        except Exception as e:  # the corpus records every failure, to be fixed or refused
            row.error, row.reason = type(e).__name__, _first_line(e)
            return row
    if row.parameter_count == row.transformers_parameter_count:
        row.status = "pass"
    else:
        row.reason = (
            f"parameter count {row.parameter_count} != transformers' "
            f"{row.transformers_parameter_count}"
        )
    return row


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def markdown(rows: list[Row]) -> str:
    """The table of docs/models.md."""
    lines = [
        "| model type | task | result | train s | generate s |",
        "|---|---|---|---:|---:|",
    ]
    for r in rows:
        result = "pass" if r.status == "pass" else f"{r.status}: {r.error}: {r.reason}"
        result = result.replace("|", "\\|")
        lines.append(
            f"| {r.model_type} | {r.task or ''} | {result} | {_seconds(r.train_seconds)} "
            f"| {_seconds(r.generate_seconds)} |"
        )
    passed = sum(r.status == "pass" for r in rows)
    refused = sum(r.status == "refused" for r in rows)
    lines.append("")
    lines.append(
        f"{len(rows)} model types: {passed} pass, {refused} refused by name, "
        f"{len(rows) - passed - refused} failed."
    )
    return "\n".join(lines)


def _seconds(s: float | None) -> str:
    return "" if s is None else f"{s:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("types", nargs="*", help="model types (default: every one)")
    ap.add_argument("--limit", type=int, default=None, help="seconds per model type")
    ap.add_argument("--seq", type=int, default=SEQ_LEN, help=f"tokens (default {SEQ_LEN})")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    types = args.types or model_types()
    rows = []
    start = time.perf_counter()
    for mt in types:
        row = run_one(mt, seq_len=args.seq, limit=args.limit)
        rows.append(row)
        print(f"{mt}: {row.status} {row.error or ''} {row.reason or ''}"[:300], file=sys.stderr)
    print(markdown(rows))
    print(f"\n{time.perf_counter() - start:.0f} s in all.")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
