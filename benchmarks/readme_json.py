"""The README's `$ memfit` commands, run with `--json` on two source trees, and the differences
between their outputs (timing fields aside): how a refactor shows that it changed no estimate.

Usage:
    git worktree add /tmp/before <rev>
    python benchmarks/readme_json.py --before /tmp/before/src --after src [--out DIR]

Each command runs in a fresh process with the trace cache off (MEMFIT_NO_CACHE=1), once per
tree; a plan takes minutes on a laptop. The outputs are kept in `--out` (default
/tmp/memfit-readme-json) as `<tree>/<n>.json`. Prints each command's differences and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: Keys whose values are timings (they differ run to run).
TIMING = ("seconds", "elapsed", "wall", "time")
#: Commands that read a user's file (their outputs are not the estimator's).
SKIP = ("lint", "data")


def commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    found = re.findall(r"^\$ memfit (.+)$", text, re.M)
    return [c for c in found if c.split()[0] not in SKIP]


def run(src: str, command: str) -> Any:
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve()), "MEMFIT_NO_CACHE": "1"}
    argv = [sys.executable, "-m", "memfit.cli", *command.split(), "--json"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd="/tmp", check=False)
    if not done.stdout.strip():
        return {"error": done.stderr.strip()[-500:]}
    return json.loads(done.stdout)


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if any(t in k for t in TIMING):
                continue
            if k not in a:
                out.append(f"{path}.{k}: added {str(b[k])[:80]}")
            elif k not in b:
                out.append(f"{path}.{k}: removed")
            else:
                out += differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        out = [f"{path}: {len(a)} items -> {len(b)}"] if len(a) != len(b) else []
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            out += differences(x, y, f"{path}[{i}]")
        return out
    return [] if a == b else [f"{path}: {str(a)[:100]} -> {str(b)[:100]}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the src/ folder of the old tree")
    ap.add_argument("--after", required=True, help="the src/ folder of the new tree")
    ap.add_argument("--out", type=Path, default=Path("/tmp/memfit-readme-json"))
    args = ap.parse_args(argv)
    for n, command in enumerate(commands(), 1):
        outs = []
        for name, src in (("before", args.before), ("after", args.after)):
            out = run(src, command)
            (args.out / name).mkdir(parents=True, exist_ok=True)
            (args.out / name / f"{n}.json").write_text(json.dumps(out, indent=1))
            outs.append(out)
        found = differences(*outs)
        print(f"== memfit {command}: {len(found)} differences")
        print("\n".join(found[:40]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
