"""How the `memfit` process ends (memfit.cli.app.main): commands that run no user code skip the
interpreter's teardown once their output is flushed, with the same exit codes and output; the
commands that run a user's script exit normally, so the script's files and exit handlers are
finished as Python finishes them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from memfit.cli.app import FAST_EXIT, app


def _memfit(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memfit.cli", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)  # fmt: skip


def test_fast_exit_keeps_output_and_exit_codes():
    done = _memfit("models", "--json")
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)) > 50  # the whole catalog, flushed before the exit
    bad = _memfit("estimate", "no-such-model")
    assert bad.returncode == 2
    assert "unknown model 'no-such-model'" in bad.stderr


def test_commands_that_run_user_code_exit_normally(tmp_path):
    names = {c.name for c in app.registered_commands}
    assert names >= FAST_EXIT
    assert names - FAST_EXIT == {"doctor", "profile", "find-batch"}
    # A script's exit handler runs when Python exits; os._exit would skip it.
    script = tmp_path / "train.py"
    script.write_text(
        "import atexit, pathlib\n"
        "atexit.register(pathlib.Path('log.txt').write_text, 'written at exit')\n"
    )
    done = _memfit("doctor", str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "log.txt").read_text() == "written at exit"
