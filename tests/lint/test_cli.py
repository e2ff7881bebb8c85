"""`memfit lint`: exit codes, output formats (text, JSON, SARIF 2.1.0), --fix, pyproject."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memfit.cli.app import app

ROOT = Path(__file__).parents[2]
LEAK = "total = 0.0\nfor x in data:\n    loss = model(x).sum()\n    loss.backward()\n"
BAD = LEAK + "    total += loss\nopt.zero_grad(set_to_none=False)\n"


@pytest.fixture
def bad(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no pyproject.toml above: defaults
    (tmp_path / "train.py").write_text(BAD)
    return tmp_path / "train.py"


def run(*args):
    return CliRunner().invoke(app, ["lint", *map(str, args)])


def test_findings_exit_1_as_ruff_prints_them(bad):
    r = run("train.py")
    assert r.exit_code == 1
    lines = r.output.splitlines()
    assert lines[0] == (
        "train.py:5:5 MF001 `total += loss` keeps every step's autograd graph alive in `total` "
        "(fix: `total += loss.item()`)"
    )
    assert lines[1].startswith("train.py:6:1 MF007 ")
    assert lines[-1] == "Found 2 findings in 1 file (MF001 x1, MF007 x1); 1 fixable with --fix."


def test_the_projects_examples_exit_0():
    r = run(ROOT / "examples")
    assert r.exit_code == 0, r.output
    assert r.output.strip().startswith("No findings in ")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--select", "MF001,MF010"], "--select got an unknown rule code 'MF010'"),
        (["--ignore", "XX1"], "--ignore got an unknown rule code 'XX1'"),
        (["--json", "--sarif"], "--json and --sarif both given"),
    ],
)
def test_bad_input_exits_2_naming_the_value(bad, args, needle):
    r = run("train.py", *args)
    assert r.exit_code == 2
    assert needle in r.output and "Traceback" not in r.output


def test_missing_path_exits_2(bad):
    r = run("nope.py")
    assert r.exit_code == 2 and "No such file or folder: 'nope.py'" in r.output


def test_select_ignore_and_pyproject(bad, tmp_path):
    assert run("train.py", "--select", "MF007").exit_code == 1
    assert run("train.py", "--ignore", "MF001,MF007").exit_code == 0
    (tmp_path / "pyproject.toml").write_text('[tool.memfit.lint]\nignore = ["MF001", "MF007"]\n')
    assert run("train.py").exit_code == 0
    # the command line replaces the file's ignore
    assert run("train.py", "--ignore", "MF001").exit_code == 1
    (tmp_path / "pyproject.toml").write_text('[tool.memfit.lint]\nselect = ["MF999"]\n')
    r = run("train.py")
    assert r.exit_code == 2 and "select in [tool.memfit.lint] got an unknown rule" in r.output


def test_json(bad):
    r = run("train.py", "--json")
    doc = json.loads(r.output)
    assert r.exit_code == 1 and doc["version"] == 1 and doc["files"] == 1
    first = doc["findings"][0]
    assert {k: first[k] for k in ("path", "line", "column", "code", "rule", "fixable")} == {
        "path": "train.py", "line": 5, "column": 5, "code": "MF001",
        "rule": "graph-kept-alive", "fixable": True,
    }  # fmt: skip


def test_sarif_2_1_0_structure(bad):
    r = run("train.py", "--sarif")
    log = json.loads(r.output)
    assert log["version"] == "2.1.0" and log["$schema"].endswith("sarif-2.1.0.json")
    (run_,) = log["runs"]
    driver = run_["tool"]["driver"]
    assert driver["name"] == "memfit-lint"
    ids = [rule["id"] for rule in driver["rules"]]
    assert ids[:9] == [f"MF00{i}" for i in range(1, 10)]
    for res in run_["results"]:
        assert ids[res["ruleIndex"]] == res["ruleId"]
        assert res["level"] == "warning" and res["message"]["text"]
        (loc,) = res["locations"]
        phys = loc["physicalLocation"]
        assert phys["artifactLocation"] == {"uri": "train.py", "uriBaseId": "%SRCROOT%"}
        region = phys["region"]
        assert region["startLine"] >= 1 and region["startColumn"] >= 1
        assert (region["endLine"], region["endColumn"]) >= (region["startLine"], 1)
    assert [res["ruleId"] for res in run_["results"]] == ["MF001", "MF007"]


def test_fix_rewrites_then_reports_what_is_left(bad):
    r = run("train.py", "--fix")
    assert r.exit_code == 1  # MF007 has no safe mechanical fix
    assert "    total += loss.item()\n" in bad.read_text()
    assert "MF001" not in r.stdout and "MF007" in r.stdout
    assert run("train.py", "--fix", "--ignore", "MF007").exit_code == 0


def test_pre_commit_hook_definition_runs_this_command():
    text = (ROOT / ".pre-commit-hooks.yaml").read_text()
    for line in ("- id: memfit-lint", "entry: memfit lint", "language: python", "types: [python]"):
        assert line in text.splitlines() or f"  {line.lstrip('- ')}" in text.splitlines()
