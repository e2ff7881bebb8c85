"""The README's promises: exactly two set-up commands, the first one's main job runs and fits,
and CI runs the second one's test command."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from memfit.cli.app import app

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block is not None, "README must start with a bash block of set-up commands"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_has_exactly_two_setup_commands():
    cmds = readme_commands()
    assert len(cmds) == 2
    assert "memfit estimate" in cmds[0]
    assert "pytest" in cmds[1]


def test_readme_main_job_runs_and_fits():
    # Run the memfit part of the README's first command (the install part is CI's job).
    main_job = readme_commands()[0].split("&&", 1)[1].strip()
    assert main_job.startswith("memfit ")
    args = main_job.split()[1:]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "FITS on NVIDIA H100" in result.output
    assert "6,738,415,616 parameters" in result.output


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    test_cmd = readme_commands()[1].split("&&")[-1].strip()
    assert test_cmd in ci
