"""The exit codes every `memfit` verb shares, and the one way a verb reports bad input.

0 success (fits, or no GPU named); 1 does not fit; 2 bad input. Verbs that need more say so in
their own module (`doctor`: 1 findings; `find-batch`: 3 the trial failed; `profile`: 1 the script
failed; a script interrupted with Ctrl-C: 130; `compare --fail-above`: 1 a difference is over the
limit). Every verb module imports this one, never `memfit.cli.app`, so the app can import the
verbs without a cycle.

The library speaks Python in its messages: it names a parameter as Python does (`batch_size`,
`batch_size=1`, `mode='train'`). `fail` rewrites those names into the flags the user typed
(`--batch`, `--batch 1`, `--mode train`), so one message serves both.
"""

from __future__ import annotations

import re

import typer

from memfit.cli.common.workload_options import workload_flags

EXIT_OK = 0
EXIT_DOES_NOT_FIT = 1
EXIT_BAD_INPUT = 2

#: Python parameter names (Workload fields, library keywords) and the flags that set them: the
#: workload options' own (memfit.cli.common.workload_options), then the verbs' keywords.
FLAGS = {
    **workload_flags(),
    "global_batch": "--global-batch",
    # serve (memfit.serving_capacity)
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "block_size": "--block-size",
    "context_len": "--context-len",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_num_seqs": "--max-num-seqs",
    "alloc_conf": "--alloc-conf",
    "task": "--task",
    # find-batch (memfit.find_batch_size)
    "start": "--start",
    "max_batch": "--max",
    "target_batch": "--target-batch",
}

_NAMES = "|".join(sorted(FLAGS, key=len, reverse=True))
# `name=value`: a quoted string, a LoraConfig, or a bare word (number, True, rtx-4090@12GiB).
_ASSIGNMENT = re.compile(
    rf"(?<![\w./-])(?P<name>{_NAMES})=(?:'(?P<quoted>[^']*)'|(?P<word>[\w.@+-]*\w))"
)
_LORA = re.compile(r"(?<![\w.-])lora=LoraConfig\(rank=(?P<rank>\d+)[^)]*\)")
# A bare name: only those no English sentence uses as a word (they have an underscore), or any
# known name opening the message ("gpus must be ...").
_BARE = re.compile(
    rf"(?<![\w.'/-])(?P<name>{'|'.join(n for n in FLAGS if '_' in n)})(?![\w=]|\.\w)"
    rf"|^(?P<first>{_NAMES})(?![\w=-])"
)


def _assignment(m: re.Match[str]) -> str:
    flag = FLAGS[m["name"]]
    value = m["quoted"] if m["quoted"] is not None else m["word"]
    if value == "True":
        return flag
    if value == "False":
        return f"--no-{flag[2:]}"
    return f"{flag} {value}"


#: Where a quoted traceback of the user's own code starts: its text is left as it is.
_TRACEBACK = "Traceback (most recent call last):"


def cli_wording(message: str) -> str:
    """A library message with its Python parameter names written as the CLI's flags (a
    traceback of the user's code quoted in it is left alone)."""
    head, marker, tail = message.partition(_TRACEBACK)
    head = _LORA.sub(lambda m: f"--lora-rank {m['rank']}", head)
    head = _ASSIGNMENT.sub(_assignment, head)
    head = _BARE.sub(lambda m: FLAGS[m["name"] or m["first"]], head)
    return head + marker + tail


def fail(message: str) -> typer.Exit:
    """Print `error: MESSAGE` on stderr (Python parameter names written as flags, see
    `cli_wording`) and return the bad-input exit for the caller to raise
    (`raise fail(...) from None`), so the verb's control flow stays visible at the call site."""
    typer.echo(f"error: {cli_wording(message)}", err=True)
    return typer.Exit(EXIT_BAD_INPUT)
