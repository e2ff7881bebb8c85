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
