"""The script runner and the `memfit doctor` command (run through typer's CliRunner)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from memfit.cli.doctor import doctor_command
from memfit.diagnosis.doctor import GRAPH_KEPT_ALIVE, doctor
from memfit.errors import BadInputError
from memfit.measurement.script_runner import ScriptFailed, run_script

SCRIPTS = Path(__file__).parents[1] / "doctor_scripts"  # see test_doctor.py for their sizes
STEPS = 6
OUT_BYTES = 4 * 8 * 4  # one batch of outputs: B=4 rows of OUT=8 fp32


def marker_line(path: Path) -> int:
    lines = path.read_text().splitlines()
    (line,) = [i + 1 for i, text in enumerate(lines) if text.rstrip().endswith("# LEAK")]
    return line


# -- script runner --------------------------------------------------------------------------


def test_missing_script_is_bad_input(tmp_path):
    missing = tmp_path / "nope.py"
    with pytest.raises(BadInputError) as e:
        run_script(missing, [])
    assert str(missing) in str(e.value)


def test_script_sees_its_argv_and_path_which_are_restored(tmp_path):
    out = tmp_path / "seen.json"
    script = tmp_path / "show.py"
    script.write_text(
        "import json, sys\n"
        "json.dump({'argv': sys.argv, 'path0': sys.path[0], 'name': __name__},"
        " open(sys.argv[1], 'w'))\n"
    )
    argv, path = list(sys.argv), list(sys.path)
    run_script(str(script), [str(out), "--lr", "0.1"])
    seen = json.loads(out.read_text())
    assert seen == {
        "argv": [str(script), str(out), "--lr", "0.1"],
        "path0": str(tmp_path),
        "name": "__main__",
    }
    assert (sys.argv, sys.path) == (argv, path)


def test_exit_zero_is_success_and_nonzero_a_failure(tmp_path):
    script = tmp_path / "bye.py"
    script.write_text("import sys\nsys.exit(int(sys.argv[1]))\n")
    run_script(script, ["0"])
    with pytest.raises(ScriptFailed) as e:
        run_script(script, ["3"])
    assert e.value.exit_code == 3


def test_failing_script_keeps_its_traceback_and_what_was_seen(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(
        (SCRIPTS / "leak_total_loss.py").read_text() + "raise ValueError('bad batch')\n"
    )
    dr = doctor()
    with pytest.raises(ScriptFailed) as e:
        run_script(script, [], wrap=dr)
    assert isinstance(e.value.exception, ValueError)
    last = len(script.read_text().splitlines())
    assert f'File "{script}", line {last}' in e.value.traceback
    assert "runpy" not in e.value.traceback
    assert [f.kind for f in dr.findings] == [GRAPH_KEPT_ALIVE]


# -- the `doctor` command -------------------------------------------------------------------


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("doctor")(doctor_command)
    app.command("other")(lambda: None)  # two commands: `doctor` is a subcommand, as in memfit
    return app


def invoke(*args: str):
    return CliRunner().invoke(_app(), ["doctor", *args])


def test_command_clean_script_exits_0():
    result = invoke(str(SCRIPTS / "clean_basic.py"))
    assert result.exit_code == 0, result.output
    assert "no memory anti-patterns" in result.stdout


def test_command_reports_findings_and_exits_1():
    path = SCRIPTS / "leak_total_loss.py"
    result = invoke(str(path))
    assert result.exit_code == 1, result.output
    assert f"{path.name}:{marker_line(path)}: graph-kept-alive (4 B)" in result.stdout
    assert "fix: Accumulate a number" in result.stdout


def test_command_json_is_pure_json_with_integer_bytes():
    path = SCRIPTS / "leak_outputs_list.py"
    result = invoke(str(path), "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["steps"] == STEPS
    assert report["script_error"] is None
    (f,) = report["findings"]
    assert (f["kind"], f["bytes"], f["lineno"]) == (
        GRAPH_KEPT_ALIVE, (STEPS - 1) * OUT_BYTES, marker_line(path),
    )  # fmt: skip


def test_command_passes_arguments_after_double_dash(tmp_path):
    out = tmp_path / "argv.json"
    script = tmp_path / "args.py"
    script.write_text("import json, sys\njson.dump(sys.argv[1:], open(sys.argv[1], 'w'))\n")
    result = invoke(str(script), "--", str(out), "--epochs", "1")
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text()) == [str(out), "--epochs", "1"]


def test_command_missing_script_exits_2(tmp_path):
    result = invoke(str(tmp_path / "missing.py"))
    assert result.exit_code == 2
    assert "missing.py" in result.stderr


def test_command_failing_script_prints_traceback_and_report(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("raise RuntimeError('data loader died')\n")
    result = invoke(str(script))
    assert result.exit_code == 1
    assert "RuntimeError: data loader died" in result.stderr
    assert "memfit doctor: 0 step boundaries" in result.stdout  # it died before any step


def test_command_without_an_optimizer_step_says_so(tmp_path):
    script = tmp_path / "eval_only.py"
    script.write_text(
        "import torch\nwith torch.no_grad():\n    print(torch.nn.Linear(4, 1)(torch.ones(2, 4)))\n"
    )
    result = invoke(str(script))
    assert result.exit_code == 0
    assert result.stdout.splitlines()[-1] == (
        "memfit doctor: 0 step boundaries: the doctor watches optimizer.step() \u2014 call "
        "dr.step() in loops without one (`with memfit.doctor() as dr:` around the loop). Graphs "
        "kept alive and growth are only found across steps."
    )
    assert "no memory anti-patterns" not in result.stdout


def test_command_interrupted_prints_the_report_and_exits_130(tmp_path):
    path = SCRIPTS / "leak_total_loss.py"
    script = tmp_path / "interrupted.py"
    script.write_text(path.read_text() + "raise KeyboardInterrupt\n")  # Ctrl-C after the loop
    result = invoke(str(script))
    assert result.exit_code == 130
    assert "interrupted (Ctrl-C); the report covers the run up to then." in result.stderr
    assert f"{script.name}:{marker_line(path)}: graph-kept-alive (4 B)" in result.stdout
    with pytest.raises(ScriptFailed) as e:
        run_script(script, [])
    assert isinstance(e.value.exception, KeyboardInterrupt) and e.value.exit_code == 130
