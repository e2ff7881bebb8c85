"""Bad input, everywhere a user can give it: every row is refused with the exit code (CLI) or the
exception (Python API) it should get, and a message that names the value and says the fix.

None may end in a traceback or a number: the CLI exits 2 with its message (typer's own usage
errors exit 2 too) and no exception escapes it; the API raises a memfit error, or the TypeError
or FileNotFoundError Python itself would. A row is (the input, the exit code or exception type,
a fragment of the message): a command line as typed (`{tmp}` is a folder of files the rows
read), or a Python expression as a user writes it. Rows are refused before any tracing where the
input allows it; the few that need a trace use a 356-parameter MLP, so the table runs in
seconds.

Every row passes: none is marked as a known failure.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

import memfit
from memfit import BadInputError, LoraConfig, Workload
from memfit.cli.app import app
from memfit.models.sources import resolve_model
from memfit.planner.search import Goal
from memfit.report.compare import check_limits, compare, load_report

# The files rows name as {tmp}/NAME, written once into a temporary folder.
FILES = {
    "tiny.py": """
import torch

def build():
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

def make_batch(batch_size):
    return torch.randn(batch_size, 16)

def same_batch(batch_size):
    return torch.randn(4, 16)

def broken():
    raise RuntimeError("boom in user code")

def not_a_module():
    return 3
""",
    "trial.py": """
import torch

model = torch.nn.Linear(8, 8)

def trial(batch):
    model(torch.randn(batch, 8)).sum().backward()
""",
    "train.py": "print('a training script')\n",
    "no_type/config.json": json.dumps({"n_layer": 2}),
    "broken/config.json": "{not json",
    "empty.json": "{}",
    "not_yaml.yaml": "compute_environment: [LOCAL_MACHINE\nnum_processes: 2\n",
    "syntax.py": "def train(:\n    pass\n",
    "list.json": "[]",
    "strings.json": json.dumps({"peak_allocated_bytes": "lots"}),
    "report.json": json.dumps(
        {
            "peak_allocated_bytes": 1024,
            "peak_reserved_bytes": 2048,
            "device_total_bytes": 4096,
            "breakdown": {"activations": 512},
        }
    ),
}


def cli(command: str, exit_code: int, fragment: str) -> Any:
    """`memfit COMMAND` must exit `exit_code` with `fragment` in its output."""
    return pytest.param("cli", command, exit_code, fragment, id=f"memfit {command}"[:90])


def py(expression: str, error: type[BaseException], fragment: str) -> Any:
    """The Python `expression` must raise `error` with `fragment` in its message."""
    return pytest.param("py", expression, error, fragment, id=expression[:90])


def tiny_module() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def tiny_spec(tmp: Path) -> Any:
    """The MLP of {tmp}/tiny.py with its own make_batch."""
    return resolve_model(f"{tmp}/tiny.py:build")


TRAIN = "only a training step uses"
POSITIVE = "must be a positive integer"

# fmt: off
ROWS = [
    # ---------------------------------------------------------------- memfit estimate: values
    cli("estimate lama-2-7b", 2, "llama-2-7b"),
    cli("estimate gpt2 --batch 0", 2, f"--batch {POSITIVE}, got 0. Pass e.g. --batch 1"),
    cli("estimate gpt2 --batch 1000000000000 --seq 128", 2,
        "batch 1000000000000 x 128 tokens: their token ids alone (8 B each) take 931.32 TiB"),
    cli("estimate gpt2 --timeline /proc/x.html", 2,
        "--timeline '/proc/x.html': no file can be written in '/proc'"),
    cli("estimate gpt2 --snapshot /proc/x.pickle", 2, "no file can be written in '/proc'"),
    cli("estimate gpt2 --accelerate-config {tmp}/not_yaml.yaml", 2,
        "is not a readable accelerate config (while parsing a flow sequence)"),
    cli("estimate {tmp}/list.json", 2, "holds a JSON list, not a config"),
    cli("doctor {tmp}/syntax.py", 2, "syntax.py' is not valid Python: invalid syntax (line 1"),
    cli("profile {tmp}/syntax.py", 2, "is not valid Python"),
    cli("doctor {tmp}", 2, "does not exist (or is not a file)"),
    cli("estimate gpt2 --batch -3", 2, "got -3"),
    cli("estimate gpt2 --batch four", 2, "Invalid value for '--batch'"),
    cli("estimate gpt2 --seq 0", 2, f"--seq {POSITIVE}"),
    cli("estimate gpt2 --seq 4096", 2, "Use --seq 1024 or less"),
    cli("estimate gpt2 --image-size 0", 2, f"--image-size {POSITIVE}"),
    cli("estimate gpt2 --precision bf17", 2, "Unknown precision 'bf17'. Choose one of"),
    cli("estimate gpt2 --optimizer adamm", 2, "Unknown optimizer 'adamm'. Did you mean"),
    cli("estimate gpt2 --mode eval", 2, "Unknown mode 'eval'"),
    cli("estimate gpt2 --grad-accum 0", 2, f"--grad-accum {POSITIVE}"),
    cli("estimate gpt2 --checkpointing all", 2, "Unknown checkpointing 'all'"),
    cli("estimate gpt2 --attention flash", 2, "Unknown attention 'flash'"),
    cli("estimate gpt2 --lora-rank 0", 2, f"LoRA rank {POSITIVE}, got 0"),
    cli("estimate gpt2 --lora-targets q_proj", 2, "--lora-targets needs --lora-rank"),
    cli("estimate gpt2 --lora-rank 4 --lora-targets ,", 2, "LoRA targets ',' names no module"),
    cli("estimate gpt2 --gpus 0", 2, f"--gpus {POSITIVE}"),
    cli("estimate gpt2 --task nonsense", 2, "Task 'nonsense' is not available"),
    cli("estimate gpt2 --alloc-conf expandable_segmentz:True", 2, "expandable_segments"),
    cli("estimate gpt2 --alloc-conf garbage", 2, "garbage"),
    # ------------------------------------------------------------------ memfit estimate: --gpu
    cli("estimate gpt2 --gpu rtx-4091", 2, "Did you mean 'rtx-4090'"),
    cli("estimate gpt2 --gpu ''", 2, "is empty"),
    cli("estimate gpt2 --gpu rtx-4090@1000GiB", 2, "is more than"),
    cli("estimate gpt2 --gpu rtx-4090@100MiB", 2, "smaller than the memory CUDA"),
    cli("estimate gpt2 --gpu rtx-4090@lots", 2, "Cannot read the size 'lots'"),
    cli("estimate gpt2 --gpu 12XB", 2, "Unknown GPU '12XB'"),
    # ----------------------------------------------- memfit estimate: options that do not apply
    cli("estimate gpt2 --mode inference --optimizer adamw", 2,
        f"--optimizer adamw: {TRAIN} it, and mode is 'inference'"),
    cli("estimate gpt2 --mode inference --optimizer sgd --json", 2,
        "Drop it, or use --mode train"),
    cli("estimate gpt2 --mode inference --grad-accum 4", 2, f"--grad-accum 4: {TRAIN} it"),
    cli("estimate gpt2 --mode inference --checkpointing blocks", 2,
        f"--checkpointing blocks: {TRAIN}"),
    cli("estimate gpt2 --mode inference --lora-rank 8", 2, f"--lora-rank 8: {TRAIN}"),
    cli("estimate gpt2 --mode inference --offload-optimizer", 2, f"--offload-optimizer: {TRAIN}"),
    cli("estimate gpt2 --mode inference --grad-accum 2 --lora-rank 2", 2,
        f"--grad-accum 2, --lora-rank 2: {TRAIN} them"),
    cli("estimate gpt2 --optimizer none --offload-optimizer", 2, "optimizer is 'none'"),
    cli("estimate gpt2 --image-size 224", 2,
        "--image-size 224 does not apply to 'gpt2', a text model"),
    cli("estimate vit-base-patch16-224 --seq 128", 2,
        "--seq 128 does not apply to 'vit-base-patch16-224', an image model"),
    cli("estimate whisper-tiny --image-size 224", 2, "an audio model"),
    cli("estimate {tmp}/tiny.py:build --seq 128", 2,
        "--seq 128 cannot reach '{tmp}/tiny.py:build': its inputs come from its own make_batch"),
    cli("estimate gpt2 --gpus 2 --offload-optimizer", 2,
        "(--gpus 2), memfit does not model --offload-optimizer"),
    cli("estimate gpt2 --gpus 2 --embedding-on-cpu", 2, "CPUOffloadPolicy"),
    cli("estimate gpt2 --embedding-on-cpu --tie-embeddings", 2,
        "--embedding-on-cpu and --tie-embeddings conflict"),
    cli("estimate {tmp}/tiny.py:build --checkpointing blocks", 2,
        "needs a stack of repeated blocks"),
    cli("estimate {tmp}/tiny.py:build --embedding-on-cpu --optimizer sgd", 2,
        "--embedding-on-cpu needs an input embedding"),
    cli("estimate gpt2 --lora-rank 4 --lora-targets q_proj", 2, "c_attn"),
    # ---------------------------------------------------------- memfit estimate: model sources
    cli("estimate missing/config.json", 2, "does not exist"),
    cli("estimate {tmp}/no_type/config.json", 2, "has no 'model_type' field"),
    cli("estimate {tmp}/broken", 2, "Cannot read HF config"),
    cli("estimate {tmp}/nothing_here.py:build", 2, "does not exist"),
    cli("estimate {tmp}/tiny.py:", 2, "names no function"),
    cli("estimate {tmp}/tiny.py:no_such_fn", 2, "has no function 'no_such_fn'"),
    cli("estimate {tmp}/tiny.py:build:no_such_batch", 2, "has no function 'no_such_batch'"),
    cli("estimate {tmp}/tiny.py:broken", 2, "raised RuntimeError"),
    cli("estimate {tmp}/tiny.py:not_a_module", 2, "returned int, not an nn.Module"),
    cli("estimate no_such_package_xyz:build", 2, "Cannot import module"),
    # ------------------------------------------------------ memfit estimate: pictures, at once
    cli("estimate gpt2 --timeline t.jpg", 2, "must end in .png or .html"),
    cli("estimate gpt2 --timeline {tmp}/no/such/folder/t.png", 2,
        "the folder '{tmp}/no/such/folder' does not exist"),
    cli("estimate gpt2 --snapshot {tmp}/no/such/folder/s.pickle", 2,
        "--snapshot '{tmp}/no/such/folder/s.pickle': the folder"),
    cli("estimate gpt2 --snapshot {tmp}", 2, "is a folder; give a file name"),
    # ------------------------------------------------------------- memfit estimate: and more
    cli("estimate", 2, "Missing argument 'model'"),
    cli("estimate t5-small --image-size 224", 2, "'t5-small', a text model"),
    cli("estimate resnet-50 --seq 12", 2, "'resnet-50', an image model"),
    cli("estimate gpt2 --task image-classification", 2,
        "Task 'image-classification' is not available for 'gpt2'"),
    cli("estimate {tmp}/tiny.py:build --tie-embeddings --optimizer sgd", 2,
        "--tie-embeddings needs a model with input and output embeddings"),
    cli("estimate gpt2 --alloc-conf max_split_size_mb:abc", 2, "expected a whole number of MiB"),
    cli("estimate gpt2 --alloc-conf garbage_collection_threshold:2", 2,
        "must be in (0.0, 1.0), got 2.0"),
    cli("estimate gpt2 --timeline ''", 2, "must end in .png or .html"),
    cli("estimate gpt2 --gpu t4@0GiB", 2, "must be more than 0 bytes"),
    cli("estimate gpt2 --gpu t4@", 2, "Cannot read the size ''"),
    # ---------------------------------------------------------------------------- memfit plan
    cli("plan gpt2", 2, "Missing option '--gpu'"),
    cli("plan gpt2 --gpu rtx-4091", 2, "Did you mean 'rtx-4090'"),
    cli("plan gpt2 --gpu t4 --global-batch 0", 2, f"--global-batch {POSITIVE}"),
    cli("plan gpt2 --gpu t4 --global-batch -4", 2, "got -4. Pass e.g. --global-batch 32."),
    cli("serve llama-3.1-8b --gpu h100-sxm --context-len 0", 2,
        "--context-len 0: a request has at least one token. Give the tokens of one request "
        "(vLLM's max_model_len), e.g. --context-len 131072."),
    cli("plan gpt2 --gpu t4 --precision fp8", 2, "Unknown precision 'fp8'"),
    cli("plan gpt2 --gpu t4 --optimizer adamm", 2, "Unknown optimizer"),
    cli("plan gpt2 --gpu t4 --seq 0", 2, f"--seq {POSITIVE}"),
    cli("plan gpt2 --gpu t4 --allow warp-drive", 2, "warp-drive"),
    cli("plan gpt2 --gpu t4 --forbid checkpoint", 2, "checkpointing"),
    cli("plan gpt2 --gpu t4 --gpus 3", 2, "must split evenly over --gpus 3"),
    cli("plan gpt2 --gpu t4 --image-size 224 --global-batch 1", 2,
        "--image-size 224 does not apply to 'gpt2'"),
    cli("plan vit-base-patch16-224 --gpu t4 --seq 128", 2,
        "--seq 128 does not apply to 'vit-base-patch16-224'"),
    cli("max-batch gpt2 --gpu t4 --mode inference --checkpointing blocks", 2,
        f"--checkpointing blocks: {TRAIN}"),
    # ---------------------------------------------------------- memfit max-batch / max-seq
    cli("max-batch gpt2", 2, "Missing option '--gpu'"),
    cli("max-batch gpt2 --gpu rtx-4091", 2, "Did you mean 'rtx-4090'"),
    cli("max-batch gpt2 --gpu t4 --mode inference --lora-rank 4", 2, f"--lora-rank 4: {TRAIN}"),
    cli("max-batch gpt2 --gpu t4 --grad-accum 0", 2, "--grad-accum"),
    cli("max-batch gpt2 --gpu t4 --image-size 64", 2, "a text model"),
    cli("max-batch gpt2 --gpu t4 --seq 2048", 2, "Use --seq 1024 or less"),
    cli("max-batch gpt2 --gpu t4 --gpus 2 --offload-optimizer", 2, "CPUOffloadPolicy"),
    cli("max-batch gpt2 --gpu t4 --alloc-conf nope:1", 2, "nope"),
    cli("max-batch {tmp}/tiny.py:build:same_batch --gpu t4 --optimizer sgd", 2,
        "does not change with --batch: from --batch 1 to --batch 4096"),
    cli("max-seq {tmp}/tiny.py:build --gpu t4", 2, "makes its own inputs (make_batch)"),
    cli("max-seq vit-base-patch16-224 --gpu t4", 2, "is image, not tokens"),
    cli("max-seq gpt2 --gpu t4 --batch 0", 2, f"--batch {POSITIVE}"),
    cli("max-seq gpt2 --gpu t4 --mode inference --optimizer sgd", 2, f"--optimizer sgd: {TRAIN}"),
    cli("find-batch {tmp}/trial.py --gpu t4", 2, "names no function"),
    cli("find-batch {tmp}/trial.py:trial --gpu t4 --max 0", 2,
        "--max must be a whole number >= 1, got 0"),
    cli("profile {tmp}/train.py --snapshot {tmp}", 2, "is a folder"),
    # ------------------------------------------------------------------------- memfit compare
    cli("compare {tmp}/missing.json {tmp}/report.json", 2, "No such report"),
    cli("compare {tmp}/train.py {tmp}/report.json", 2, "is not JSON"),
    cli("compare {tmp}/empty.json {tmp}/report.json", 2, "has no 'peak_allocated_bytes'"),
    cli("compare {tmp}/strings.json {tmp}/report.json", 2,
        "'peak_allocated_bytes' is 'lots', not a number of bytes"),
    cli("compare {tmp}/report.json {tmp}/report.json --fail-above -1", 2,
        "Invalid value for '--fail-above'"),
    cli("compare {tmp}/report.json {tmp}/report.json --fail-above five", 2,
        "Invalid value for '--fail-above'"),
    cli("compare {tmp}/report.json {tmp}/report.json --fail-above-category activatons=3", 2,
        "Did you mean 'activations'"),
    cli("compare {tmp}/report.json {tmp}/report.json --fail-above-category activations=lots", 2,
        "CATEGORY=PERCENT"),
    cli("compare {tmp}/report.json {tmp}/report.json --fail-above-category activations=-2", 2,
        "must be a percentage >= 0, got -2.0"),
    # ---------------------------------------------------- memfit profile / doctor / find-batch
    cli("profile {tmp}/no_such_script.py", 2, "does not exist"),
    cli("profile {tmp}/train.py --timeline t.svg", 2, "must end in .png or .html"),
    cli("profile {tmp}/train.py --snapshot {tmp}/nowhere/s.pickle", 2,
        "the folder '{tmp}/nowhere' does not exist"),
    cli("doctor {tmp}/no_such_script.py", 2, "does not exist"),
    cli("find-batch {tmp}/no_such.py:trial --gpu t4", 2, "does not exist"),
    cli("find-batch {tmp}/trial.py:nope --gpu t4", 2, "has no function 'nope'"),
    cli("find-batch {tmp}/trial.py:trial --gpu rtx-4091", 2, "rtx-4090"),
    cli("find-batch {tmp}/trial.py:trial --gpu t4 --start 0", 2,
        "--start must be a whole number >= 1, got 0"),
    cli("find-batch {tmp}/trial.py:trial --gpu t4 --start 10 --max 4", 2,
        "start (10) is larger than the largest batch to try (4)"),
    cli("find-batch {tmp}/trial.py:trial --gpu t4 --target-batch 0", 2,
        "--target-batch must be a whole number >= 1"),
    cli("no-such-verb", 2, "No such command 'no-such-verb'"),
    # ------------------------------------------------------------------------ memfit.Workload
    py("Workload(batch_size=0)", BadInputError,
        f"batch_size {POSITIVE}, got 0. Pass e.g. batch_size=1."),
    py("Workload(batch_size=True)", BadInputError, "got True"),
    py('Workload(batch_size="8")', BadInputError, "got '8'"),
    py("Workload(seq_len=-1)", BadInputError, f"seq_len {POSITIVE}"),
    py("Workload(seq_len=1.5)", BadInputError, "got 1.5"),
    py("Workload(image_size=0)", BadInputError, "image_size"),
    py('Workload(mode="eval")', BadInputError, "Unknown mode 'eval'"),
    py('Workload(precision="fp8")', BadInputError, "Choose one of: fp32, fp16-mixed"),
    py("Workload(precision=None)", BadInputError, "Unknown precision None"),
    py('Workload(optimizer="adamw8bit")', BadInputError, "'adamw-8bit'"),
    py('Workload(mode="inference", optimizer="adamw")', BadInputError,
        f"optimizer='adamw': {TRAIN} it, and mode is 'inference'"),
    py('Workload(mode="inference", grad_accum=2)', BadInputError, "grad_accum=2: only"),
    py('Workload(mode="inference", checkpointing="blocks")', BadInputError,
        "checkpointing='blocks': only"),
    py('Workload(mode="inference", lora=LoraConfig(rank=4))', BadInputError,
        "lora=LoraConfig(rank=4): only"),
    py('Workload(mode="inference", offload_optimizer=True)', BadInputError,
        "offload_optimizer=True: only"),
    py('Workload(mode="inference", freeze=("transformer.h.0",))', BadInputError,
        "freeze=('transformer.h.0',): only"),
    py('Workload(optimizer="sgd").with_(mode="inference")', BadInputError,
        "optimizer='sgd': only"),
    py("Workload(grad_accum=0)", BadInputError, "grad_accum=1"),
    py('Workload(checkpointing="all")', BadInputError, "Unknown checkpointing 'all'"),
    py("Workload(checkpoint_first=2)", BadInputError,
        "checkpoint_first needs checkpointing='blocks'"),
    py('Workload(checkpointing="blocks", checkpoint_first=-1)', BadInputError,
        "block count >= 0, got -1"),
    py('Workload(checkpointing="blocks", checkpoint_first="2")', BadInputError, "got '2'"),
    py('Workload(attention="flash")', BadInputError, "Choose one of: sdpa, eager"),
    py('Workload(gpu="rtx-4091")', BadInputError, "Did you mean 'rtx-4090'"),
    py("Workload(gpu=4090)", BadInputError, "gpu must be a GPU name"),
    py('Workload(gpu="rtx-4090@lots")', BadInputError, "Cannot read the size 'lots'"),
    py("Workload(gpus=0)", BadInputError, "gpus=1"),
    py("Workload(gpus=2, offload_optimizer=True)", BadInputError,
        "(gpus=2), memfit does not model offload_optimizer"),
    py("Workload(embedding_on_cpu=True, tie_embeddings=True)", BadInputError,
        "embedding_on_cpu and tie_embeddings conflict"),
    py('Workload(offload_optimizer="yes")', BadInputError,
        "offload_optimizer must be True or False"),
    py('Workload(optimizer="none", offload_optimizer=True)', BadInputError, "optimizer is 'none'"),
    py("Workload(lora=8)", BadInputError, "lora must be a LoraConfig or None, got 8"),
    py("Workload(freeze=3)", BadInputError, "freeze must be a tuple of module names"),
    py('Workload(freeze=("",))', BadInputError, "is not a module name"),
    py("Workload(steps=0)", BadInputError, "steps"),
    py("LoraConfig(rank=0)", BadInputError, "Pass e.g. LoraConfig(rank=8)"),
    py("LoraConfig(rank=2.5)", BadInputError, "got 2.5"),
    py("LoraConfig(rank=4, alpha=0)", BadInputError, "LoRA alpha must be a positive number"),
    py("LoraConfig(rank=4, targets=5)", BadInputError,
        "LoRA targets must be a tuple of module names"),
    py('LoraConfig(rank=4, targets=("q_proj", 3))', BadInputError,
        "3 in ('q_proj', 3) is not a module name"),
    py("Workload(mode=None)", BadInputError, "Unknown mode None. Choose one of: train, inference"),
    py("Workload(bogus=1)", TypeError, "unexpected keyword argument 'bogus'"),
    py("Workload().with_(bogus=1)", TypeError, "unexpected keyword argument 'bogus'"),
    py("Workload(4)", TypeError, "positional argument"),
    # ------------------------------------------------------------------------ memfit.estimate
    py('memfit.estimate("lama-2-7b")', BadInputError, "llama-2-7b"),
    py('memfit.estimate("gpt2", "bad")', BadInputError,
        "workload must be a memfit.Workload, got str"),
    py('memfit.estimate("gpt2", Workload(seq_len=4096))', BadInputError,
        "seq_len=4096 is longer than 'gpt2' supports (1024 positions). Use seq_len=1024"),
    py('memfit.estimate("gpt2", Workload(image_size=224))', BadInputError,
        "image_size=224 does not apply to 'gpt2'"),
    py('memfit.estimate("vit-base-patch16-224", Workload(seq_len=16))', BadInputError,
        "Drop seq_len, or give image_size"),
    py('memfit.estimate("gpt2", gpu="rtx-4091")', BadInputError, "rtx-4090"),
    py('memfit.estimate("gpt2", alloc_conf="expandable_segmentz:True")', BadInputError,
        "expandable_segments"),
    py('memfit.estimate("gpt2", task="nonsense")', BadInputError, "Task 'nonsense'"),
    py("memfit.estimate(12345)", BadInputError, "Cannot use 12345 as a model"),
    py("memfit.estimate(tiny_spec(tmp), Workload(seq_len=16))", BadInputError,
        "seq_len=16 cannot reach"),
    py('memfit.estimate(tiny_module(), Workload(optimizer="sgd"))', BadInputError,
        "Cannot make inputs for 'Sequential'"),
    py('memfit.estimate(tiny_spec(tmp), Workload(checkpointing="blocks"))', BadInputError,
        "needs a stack of repeated blocks"),
    py("memfit.estimate(tiny_spec(tmp), Workload(embedding_on_cpu=True))", BadInputError,
        "embedding_on_cpu=True needs an input embedding"),
    py("memfit.estimate(None)", BadInputError, "Cannot use None as a model"),
    py('memfit.estimate("gpt2", gpu=123)', BadInputError,
        "gpu must be a GPU name such as 'rtx-4090'"),
    py('memfit.estimate("gpt2", alloc_conf=5)', BadInputError,
        "PYTORCH_CUDA_ALLOC_CONF must be a string, got 5"),
    # -------------------------------------------------------------- memfit.max_batch / max_seq
    py('memfit.max_batch("gpt2", Workload(), gpu="rtx-4091")', BadInputError, "rtx-4090"),
    py('memfit.max_batch("gpt2", Workload(image_size=32), gpu="t4")', BadInputError,
        "image_size=32 does not apply"),
    py('memfit.max_batch("gpt2", "w", gpu="t4")', BadInputError,
        "must be a memfit.Workload, got str"),
    py('memfit.max_batch("gpt2", Workload(), gpu="t4", alloc_conf="bad:1")', BadInputError, "bad"),
    py('memfit.max_seq("gpt2", Workload(seq_len=128), gpu="t4")', BadInputError,
        "max_seq searches seq_len itself"),
    py('memfit.max_seq("vit-base-patch16-224", Workload(), gpu="t4")', BadInputError,
        "not tokens"),
    py('memfit.max_seq("gpt2", Workload(), gpu="t4", task="nonsense")', BadInputError,
        "Task 'nonsense'"),
    # ------------------------------------------------------------------------------ memfit.plan
    py("Goal(global_batch=0)", BadInputError, "global_batch must be a positive integer"),
    py('Goal(global_batch="8")', BadInputError, "global_batch"),
    py('Goal(global_batch=8, precision="fp8")', BadInputError, "Unknown precision 'fp8'"),
    py('memfit.plan("gpt2", gpu="rtx-4091", goal=Goal(global_batch=8))', BadInputError,
        "rtx-4090"),
    py('memfit.plan("gpt2", gpu="t4", goal=Goal(global_batch=8), allow=("warp",))', BadInputError,
        "warp"),
    py('memfit.plan("gpt2", gpu="t4", goal=8)', BadInputError, "Goal"),
    py('memfit.plan("gpt2", gpu="t4", goal=Goal(global_batch=8), forbid=("warp",))', BadInputError,
        "Unknown technique 'warp'"),
    py('memfit.plan("vit-base-patch16-224", gpu="t4", goal=Goal(global_batch=8, seq_len=128))',
       BadInputError, "seq_len=128 does not apply to 'vit-base-patch16-224'"),
    py("Goal(global_batch=8, image_size=0)", BadInputError,
        "image_size must be a positive integer"),
    py('memfit.plan("gpt2", gpu="t4", goal=Goal(global_batch=8), n_gpus=0)', BadInputError,
             "n_gpus must be a positive integer"),
    # ---------------------------------------------------------------------------- memfit.apply_
    py('memfit.apply_(tiny_module(), ["checkpointing"])', BadInputError, "not a technique config"),
    py('memfit.apply_("gpt2", Workload())', BadInputError, "apply_ needs an nn.Module, got str"),
    py('memfit.apply_(tiny_module(), Workload(lora=LoraConfig(rank=2, targets="nope")))',
       BadInputError, "nope"),
    py('memfit.apply_(tiny_module(), Workload(checkpointing="blocks"))', BadInputError,
        "no stack of repeated blocks"),
    py("memfit.apply_(tiny_module(), Workload(gpus=2))", BadInputError,
        "FSDP needs an initialised process group"),
    py("memfit.apply_(tiny_module(), None)", BadInputError, "apply_ cannot apply a NoneType"),
    # -------------------------------------------------------- memfit.load_weights / simulate
    py('memfit.load_weights(tiny_module(), str(tmp / "missing.safetensors"))', FileNotFoundError,
        "missing.safetensors"),
    py('memfit.simulate("rtx-4091")', BadInputError, "rtx-4090"),
    py('memfit.simulate("t4", alloc_conf="nope:1")', BadInputError, "nope"),
    py('memfit.simulate("t4", budget_bytes=0)', BadInputError, "budget"),
    py('memfit.load_weights(tiny_module(), str(tmp / "train.py"))', BadInputError,
             "train.py"),
    py('memfit.load_weights("x", str(tmp / "train.py"))', BadInputError, "nn.Module"),
    py("memfit.simulate(budget_bytes=-5)", BadInputError,
        "budget_bytes must be a positive whole number of bytes, got -5"),
    py("memfit.simulate(5)", BadInputError, "got 5"),
    py("memfit.oom_guard(123)", BadInputError, "oom_guard needs a training setup"),
    py('memfit.measure("model").__enter__()', BadInputError, "nn.Module"),
    # ------------------------------------------------------------------------ memfit.explain_oom
    py('memfit.explain_oom(torch.OutOfMemoryError("CUDA out of memory"))', BadInputError,
        "explain_oom explains OOMs raised under memfit.simulate"),
    # --------------------------------------------------------------- memfit.find_batch_size
    py("memfit.find_batch_size(lambda b: None, start=0)", BadInputError,
        "start must be a whole number >= 1, got 0"),
    py("memfit.find_batch_size(lambda b: None, target_batch=0)", BadInputError,
        "target_batch must be a whole number >= 1"),
    py('memfit.find_batch_size("x", progress=False)', TypeError, "not callable"),
    py('memfit.explain_oom("x")', BadInputError, "No memfit state for this error (str)"),
    # ------------------------------------------------------------- memfit.report.compare paths
    py('load_report(tmp / "missing.json")', BadInputError, "No such report"),
    py("check_limits(comparison, total_pct=-1)", BadInputError,
       "total_pct must be a percentage >= 0, got -1"),
    py('check_limits(comparison, total_pct="5")', BadInputError, "got '5'"),
    py('check_limits(comparison, per_category={"activatons": 1.0})', BadInputError,
        "Did you mean 'activations'"),
]
# fmt: on


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bad_input")
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(("kind", "given", "expected", "fragment"), ROWS)
def test_bad_input_is_refused_with_a_message(
    kind: str, given: str, expected: Any, fragment: str, tmp: Path
) -> None:
    fragment = fragment.replace("{tmp}", str(tmp))
    if kind == "cli":
        args = [a.replace("{tmp}", str(tmp)) for a in shlex.split(given)]
        result = CliRunner().invoke(app, args)
        # An exception the CLI let out is a traceback in front of the user.
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            f"{type(result.exception).__name__}: {result.exception}"
        )
        assert result.exit_code == expected, result.output
        assert "Traceback" not in result.output
        assert fragment in " ".join(result.output.split()), result.output
        return
    names = {
        "memfit": memfit, "Workload": Workload, "LoraConfig": LoraConfig, "Goal": Goal,
        "torch": torch, "tmp": tmp, "tiny_module": tiny_module, "tiny_spec": tiny_spec,
        "load_report": load_report, "check_limits": check_limits,
        "comparison": compare(json.loads(FILES["report.json"]), json.loads(FILES["report.json"])),
    }  # fmt: skip
    with pytest.raises(BaseException) as info:
        eval(given, names)
    error = info.value
    assert isinstance(error, expected), f"{type(error).__name__}: {error}"
    assert isinstance(error, (memfit.MemfitError, TypeError, OSError)), type(error)
    assert fragment in str(error), str(error)
