"""`memfit estimate` on the command line: the JSON contract, exit codes, bad input, model
sources and options."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from memfit.cli.app import app

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def test_json_contract_llama_7b_bf16_true():
    result = run(
        "estimate", "llama-2-7b", "--batch", "1", "--seq", "2048",
        "--precision", "bf16-true", "--optimizer", "adamw", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    for key in (
        "peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes", "fits",
        "breakdown", "peak_phase", "peak_op", "peak_module", "by_module", "workload",
    ):  # fmt: skip
        assert key in out
    n = 6_738_415_616
    w = out["workload"]
    assert w["parameter_count"] == n
    assert w["trainable_parameter_count"] == n
    assert w["precision"] == "bf16-true" and w["optimizer"] == "adamw"
    b = out["breakdown"]
    expected_keys = (
        "parameters", "buffers", "gradients", "optimizer_state", "inputs", "activations",
        "temporaries", "allocator_cache", "cuda_context", "workspaces",
    )  # fmt: skip
    for key in expected_keys:
        assert key in b
    # Every Llama-2-7B tensor is a multiple of 512 B in bf16 (the smallest, a 4096-wide norm
    # weight, is 8192 B), so rounding adds nothing: exactly 2 B/param for weights and grads.
    assert b["parameters"] == 2 * n
    assert b["gradients"] == 2 * n
    # The peak is in the warm-up optimizer step, when both bf16 moments exist: 4 B/param.
    # foreach AdamW keeps its step counters on the host, so nothing else is optimizer state.
    assert out["peak_phase"] == "optimizer"
    assert b["optimizer_state"] == 4 * n
    assert out["peak_allocated_bytes"] > 8 * n
    assert out["peak_reserved_bytes"] >= out["peak_allocated_bytes"]
    assert out["device_total_bytes"] > out["peak_reserved_bytes"]
    assert out["fits"] is None  # no GPU named


def test_does_not_fit_exit_1():
    result = run("estimate", "llama-2-7b", "--seq", "2048", "--precision", "bf16-true",
                 "--gpu", "rtx-4090")  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "DOES NOT FIT" in result.output
    assert "CUDA out of memory. Tried to allocate" in result.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["estimate", "lama-2-7b"], "llama-2-7b"),
        (["estimate", "gpt2", "--batch", "0"], "--batch"),
        (["estimate", "gpt2", "--batch", "-3"], "-3"),
        (["estimate", "gpt2", "--precision", "bf17"], "bf16"),
        (["estimate", "gpt2", "--optimizer", "adamm"], "adam"),
        (["estimate", "gpt2", "--gpu", "rtx-4091"], "rtx-4090"),
        (["estimate", "gpt2", "--seq", "4096"], "1024"),
        (["estimate", "gpt2", "--lora-rank", "4", "--lora-targets", "q_proj"], "c_attn"),
        (["estimate", "gpt2", "--alloc-conf", "expandable_segmentz:True"], "expandable_segments"),
        (["estimate", "missing/config.json"], "does not exist"),
        (["estimate", "nofile.py:build"], "does not exist"),
    ],
)
def test_bad_input_exit_2_names_value(args, needle):
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert "Traceback" not in result.output


def test_factory_that_raises_shows_its_traceback(tmp_path):
    f = tmp_path / "bad_model.py"
    f.write_text("def build():\n    raise RuntimeError('boom in user code')\n")
    result = run("estimate", f"{f}:build")
    assert result.exit_code == 2
    assert "boom in user code" in result.output
    assert "raised RuntimeError" in result.output


def test_factory_with_make_batch(tmp_path):
    f = tmp_path / "mlp.py"
    f.write_text(
        "import torch\n"
        "def build():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(),\n"
        "                               torch.nn.Linear(256, 10))\n"
        "def make_batch(batch_size):\n"
        "    return torch.randn(batch_size, 128)\n"
    )
    result = run("estimate", f"{f}:build", "--batch", "4", "--optimizer", "sgd", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    # Linear(128,256): 128*256 + 256 = 33,024 params; Linear(256,10): 2,570.
    assert out["workload"]["parameter_count"] == 128 * 256 + 256 + 256 * 10 + 10


def test_console_script_entry_point():
    # The installed `memfit` script (subprocess: what a user types).
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "memfit.cli.app",
            "estimate",
            "gpt2",
            "--batch",
            "2",
            "--seq",
            "64",
            "--gpu",
            "t4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "FITS on" in proc.stdout


def test_hf_module_passed_in_infers_its_task():
    # An HF model object passed from Python gets the task of its class (labels, HF loss), so
    # its estimate equals the catalog's for the same config.
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    import memfit
    from memfit.models.sources import resolve_model

    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128)
    with torch.device("meta"):
        model = GPT2LMHeadModel(cfg)
    spec = resolve_model(model)
    assert spec.task == "causal-lm" and spec.loss == "hf" and spec.max_positions == 128
    est = memfit.estimate(model, memfit.Workload(batch_size=2, seq_len=16, optimizer="sgd"))
    assert est.parameter_count == sum(p.numel() for p in model.parameters())
    # The user's model is not modified: its parameters stay on the meta device.
    assert all(p.device.type == "meta" for p in model.parameters())


def test_estimate_over_gpus_shards_parameters():
    """--gpus 4: the per-rank parameters are a quarter of the model's (FSDP2 shards, padded)."""
    import json as _json

    one = _json.loads(run("estimate", "gpt2", "--seq", "64", "--json").stdout)
    four = _json.loads(run("estimate", "gpt2", "--seq", "64", "--gpus", "4", "--json").stdout)
    ratio = four["breakdown"]["parameters"] / one["breakdown"]["parameters"]
    assert 0.249 < ratio < 0.252
    assert "FSDP over 4 GPUs" in four["workload"]["techniques"]
    assert four["workload"]["gpus"] == 4 and one["workload"]["gpus"] == 1


def test_inference_takes_no_training_options():
    # Without --optimizer, inference has none (the report must not show the training default);
    # a training-only option given with --mode inference is an error, not ignored.
    out = json.loads(run("estimate", "gpt2", "--seq", "32", "--mode", "inference", "--json").stdout)
    assert out["workload"]["optimizer"] == "none"
    result = run("estimate", "gpt2", "--mode", "inference", "--optimizer", "adamw")
    assert result.exit_code == 2
    assert "--optimizer adamw: only a training step uses it" in result.output


def test_pictures_are_checked_before_the_estimate(tmp_path, monkeypatch):
    import memfit.estimator.estimation as estimator

    def never(*args, **kwargs):
        raise AssertionError("the estimate ran before the picture path was checked")

    monkeypatch.setattr(estimator, "estimate", never)
    result = run("estimate", "gpt2", "--snapshot", str(tmp_path / "no" / "s.pickle"))
    assert result.exit_code == 2
    assert f"the folder {str(tmp_path / 'no')!r} does not exist" in result.output


def test_the_paths_written_are_said_on_stderr(tmp_path):
    # Issue 29: the paths written by --timeline and --snapshot were not printed.
    timeline, snapshot = tmp_path / "t.html", tmp_path / "s.pickle"
    done = subprocess.run(
        [sys.executable, "-m", "memfit.cli", "estimate", "gpt2", "--seq", "16", "--json",
         "--timeline", str(timeline), "--snapshot", str(snapshot)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout)  # stdout stays the JSON report
    assert done.stderr.splitlines() == [
        f"wrote the memory timeline to {timeline} (open it in a browser)",
        f"wrote the memory snapshot to {snapshot} (drag it onto pytorch.org/memory_viz)",
    ]
    assert timeline.stat().st_size > 0 and snapshot.stat().st_size > 0


def test_python_results_print_their_headline():
    # The Python faces: an Estimate shows its numbers, not a dataclass dump of its events; an
    # OomReport prints as the CLI renders it.
    import torch

    import memfit
    from memfit.simulation.oom import render_oom
    from memfit.units import format_bytes

    est = memfit.estimate("gpt2", memfit.Workload(seq_len=32, mode="inference"), gpu="t4")
    p = est.profile
    assert repr(est) == (
        f"Estimate('gpt2': peak allocated {format_bytes(p.peak_allocated_bytes)}, reserved "
        f"{format_bytes(p.peak_reserved_bytes)}, device total "
        f"{format_bytes(p.device_total_bytes)}, fits t4)"
    )
    with (
        memfit.simulate(budget_bytes=4 << 20, workspaces=False),
        pytest.raises(torch.OutOfMemoryError) as info,
    ):
        torch.empty(8 << 20, dtype=torch.uint8)
    report = memfit.explain_oom(info.value)
    assert str(report) == render_oom(report)
