"""`memfit profile` and `memfit compare` through the CLI, on CPU."""

from __future__ import annotations

import json
import textwrap

from typer.testing import CliRunner

from memfit.cli.app import app

runner = CliRunner()

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    layers = [torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)]
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(int(sys.argv[1])):
        x = torch.randn(64, 256)
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if len(sys.argv) > 2:
        raise ValueError("boom")
    """
)
# Parameters, in 512-byte blocks: 512x256 fp32 weight (524288 B), bias 512 floats (2048 B),
# 10x512 weight (20480 B), bias 10 floats (40 B -> 512 B).
PARAM_BYTES = 524288 + 2048 + 20480 + 512


def test_profile_json_counts_the_script_model(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    res = runner.invoke(app, ["profile", str(script), "--json", "--", "3"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["source"] == "measured" and data["device"] == "cpu" and data["steps"] == 3
    assert data["breakdown"]["parameters"] == PARAM_BYTES
    # The peak is in backward or at the update; gradients equal the parameters then.
    assert data["breakdown"]["gradients"] in (0, PARAM_BYTES)
    # Input x: 64 x 256 fp32.
    assert data["breakdown"]["inputs"] == 64 * 256 * 4


def test_profile_pictures_and_bad_suffix(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    png, html, snap = tmp_path / "t.png", tmp_path / "t.html", tmp_path / "s.pickle"
    res = runner.invoke(app, ["profile", str(script), "--timeline", str(png),
                              "--snapshot", str(snap), "--", "2"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and snap.stat().st_size > 0
    res = runner.invoke(app, ["profile", str(script), "--timeline", str(html), "--", "1"])
    assert res.exit_code == 0 and "<svg" in html.read_text()
    res = runner.invoke(app, ["profile", str(script), "--timeline", str(tmp_path / "t.jpg")])
    assert res.exit_code == 2 and "must end in .png or .html" in res.output


def test_profile_of_a_failing_script_keeps_the_report(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    res = runner.invoke(app, ["profile", str(script), "--", "1", "fail"])
    assert res.exit_code == 1
    assert "ValueError: boom" in res.output
    assert "measured on cpu, 1 optimizer step(s)" in res.output


def test_profile_missing_script():
    res = runner.invoke(app, ["profile", "no_such_script.py"])
    assert res.exit_code == 2 and "does not exist" in res.output


def test_compare_estimate_with_measured(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    measured = runner.invoke(app, ["profile", str(script), "--json", "--", "2"]).stdout
    (tmp_path / "measured.json").write_text(measured)
    data = json.loads(measured)
    est = dict(data, peak_allocated_bytes=data["peak_allocated_bytes"] * 2, source="estimate")
    (tmp_path / "est.json").write_text(json.dumps(est))
    res = runner.invoke(app, ["compare", str(tmp_path / "est.json"),
                              str(tmp_path / "measured.json"), "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert rows["peak_allocated_bytes"]["relative"] == -0.5
    assert rows["parameters"]["diff"] == 0
    res = runner.invoke(app, ["compare", str(tmp_path / "est.json"), str(script)])
    assert res.exit_code == 2 and "is not JSON" in res.output


def test_compare_a_cuda_estimate_with_a_cpu_measurement_like_with_like(tmp_path):
    # Issue: a CPU profile compared with an estimate showed -14.3 % because the estimate's
    # cuBLAS workspace does not exist on a CPU.
    est = {
        "source": "estimate", "peak_allocated_bytes": 1000 * 1024,
        "peak_reserved_bytes": 2000 * 1024, "device_total_bytes": 3000 * 1024,
        "breakdown": {"parameters": 400 * 1024, "activations": 456 * 1024,
                      "workspaces": 144 * 1024, "allocator_cache": 1000 * 1024,
                      "cuda_context": 1000 * 1024},
    }  # fmt: skip
    cpu = {
        "source": "measured", "device": "cpu", "peak_allocated_bytes": 856 * 1024,
        "peak_reserved_bytes": None, "device_total_bytes": None,
        "breakdown": {"parameters": 400 * 1024, "activations": 456 * 1024},
    }  # fmt: skip
    (tmp_path / "est.json").write_text(json.dumps(est))
    (tmp_path / "cpu.json").write_text(json.dumps(cpu))
    res = runner.invoke(app, ["compare", str(tmp_path / "est.json"), str(tmp_path / "cpu.json"),
                              "--json", "--fail-above", "1"])  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["rows"]["peak_allocated_bytes"] == {
        "a": 856 * 1024,
        "b": 856 * 1024,
        "diff": 0,
        "relative": 0.0,
    }
    assert "workspaces" not in out["rows"] and "cuda_context" not in out["rows"]
    assert out["rows"]["peak_reserved_bytes"]["a"] is None
    assert out["notes"] == [
        "one report was measured on a CPU: est's CUDA-only memory is left out (its cuBLAS "
        "workspaces, 144.00 KiB, from the allocated peak); reserved memory and the device "
        "total exist only on a GPU and are not compared"
    ]
    text = runner.invoke(app, ["compare", str(tmp_path / "cpu.json"), str(tmp_path / "est.json")])
    assert "note: one report was measured on a CPU: est's CUDA-only memory" in text.output


def _reports(tmp_path, **changes):
    """Two reports: a hand-made baseline and a copy with `changes` (bytes)."""
    base = {
        "peak_allocated_bytes": 1000 * 1024,
        "peak_reserved_bytes": 2000 * 1024,
        "device_total_bytes": 3000 * 1024,
        "breakdown": {"parameters": 400 * 1024, "activations": 600 * 1024},
    }
    new = json.loads(json.dumps(base))
    for key, value in changes.items():
        (new["breakdown"] if key in base["breakdown"] else new)[key] = value
    (tmp_path / "base.json").write_text(json.dumps(base))
    (tmp_path / "new.json").write_text(json.dumps(new))
    return str(tmp_path / "base.json"), str(tmp_path / "new.json")


def test_compare_fail_above_is_a_ci_gate(tmp_path):
    # The README's gate: peak allocated +3 % of the baseline passes 5 % and fails 2 %.
    a, b = _reports(tmp_path, peak_allocated_bytes=1030 * 1024, activations=630 * 1024)
    res = runner.invoke(app, ["compare", a, b, "--fail-above", "5"])
    assert res.exit_code == 0, res.output
    assert "PASS: 0 difference(s) over the limit" in res.output
    res = runner.invoke(app, ["compare", a, b, "--fail-above", "2"])
    assert res.exit_code == 1
    assert "over the limit: peak_allocated_bytes +3.00 % (1000.00 KiB -> 1.01 MiB; limit 2 %)" in (
        res.output
    )
    # Categories are gated only when asked: activations moved +5 %.
    args = ["compare", a, b, "--fail-above", "5", "--fail-above-category", "2"]
    res = runner.invoke(app, args)
    assert res.exit_code == 1 and "activations +5.00 %" in res.output
    res = runner.invoke(app, [*args, "--fail-above-category", "activations=6", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["passed"] is True


def test_compare_gate_lists_what_it_cannot_check(tmp_path):
    # A value missing from a report (a CPU measurement has no device total) is not passed
    # silently; a value that was 0 and is not any more is over every limit.
    a, b = _reports(tmp_path, device_total_bytes=None)
    res = runner.invoke(app, ["compare", a, b, "--fail-above", "1"])
    assert res.exit_code == 0 and "not checked: device_total_bytes (no value in new)" in res.output
    a, b = _reports(tmp_path, parameters=0)
    res = runner.invoke(app, ["compare", b, a, "--fail-above-category", "50"])
    assert res.exit_code == 1 and "parameters from 0 B" in res.output


def test_compare_gate_bad_limits(tmp_path):
    a, b = _reports(tmp_path)
    res = runner.invoke(app, ["compare", a, b, "--fail-above-category", "activatons=3"])
    assert res.exit_code == 2 and "Did you mean 'activations'?" in res.output
    res = runner.invoke(app, ["compare", a, b, "--fail-above-category", "activations=lots"])
    assert res.exit_code == 2 and "CATEGORY=PERCENT" in res.output
    res = runner.invoke(app, ["compare", a, b, "--fail-above", "-1"])
    assert res.exit_code == 2
