"""Benchmark `memfit data`: its peak memory stays flat as the data set grows, and its speed.

Workload: JSON Lines files of growing size (default 50, 200 and 800 MB; `--sizes` for more,
e.g. `--sizes 800 3200 12800` for a file larger than this machine's RAM would comfortably hold),
each made of samples of 5 to 400 words with one 100,000-space "word" in the middle. Each file is
read by `memfit data FILE --model gpt2` in a fresh process (the approximate tokenizer unless
`--tokenizer DIR` is given; no `--gpu`, so the figures are the data pass's own).

What it prints, per file: its size and samples, the peak RSS of the process (os.wait4's
ru_maxrss, so the child's own peak, not the largest of all children), the RSS sampled from
/proc halfway through and at the end, the process's wall time, samples/s and MB/s of the pass
itself (the report's own time, without the ~3 s of imports), and the line `memfit
data` names for the longest whitespace run (it must be the planted one). Flat means the peak RSS
of the largest file is within a few MiB of the smallest's; the script says FLAT or GROWS.

Usage:
    python benchmarks/bench_data.py                       # 50, 200, 800 MB (under 2 min, 2 cores)
    python benchmarks/bench_data.py --sizes 10 20         # a quick smoke run
    python benchmarks/bench_data.py --sizes 800 3200 --dir /big/disk --keep
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MB = 1_000_000
WORDS = (
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "from",
)  # fmt: skip
#: Peak RSS growth (MiB) between the smallest and the largest file still called flat: the
#: counts of distinct lengths and the top-k lists may grow a little, never with the samples.
FLAT_MIB = 16


def _block(rng: random.Random) -> bytes:
    """About 4 MB of JSON lines of 5 to 400 words, written again and again."""
    lines = []
    size = 0
    while size < 4 * MB:
        line = json.dumps({"text": " ".join(rng.choices(WORDS, k=rng.randint(5, 400)))}) + "\n"
        lines.append(line)
        size += len(line)
    return "".join(lines).encode()


def make_file(path: Path, megabytes: int) -> tuple[int, int]:
    """Write `megabytes` MB of JSON Lines; return (samples, line of the 100,000-space word)."""
    block = _block(random.Random(0))
    per_block = block.count(b"\n")
    blocks = max(1, round(megabytes * MB / len(block)))
    planted = None
    with path.open("wb") as f:
        for b in range(blocks):
            f.write(block)
            if b == blocks // 2:
                f.write((json.dumps({"text": "x" + " " * 100_000 + "y"}) + "\n").encode())
                planted = (b + 1) * per_block + 1
    assert planted is not None
    return blocks * per_block + 1, planted


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def run_one(path: Path, tokenizer: str | None) -> dict:
    """`memfit data` over `path` in a child process: peak RSS, RSS samples, wall time."""
    cmd = [sys.executable, "-m", "memfit.cli", "data", str(path), "--model", "gpt2", "--json"]
    if tokenizer:
        cmd += ["--tokenizer", tokenizer]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    samples: list[int] = []
    out: list[bytes] = []
    stdout = proc.stdout
    assert stdout is not None
    reader = threading.Thread(target=lambda: out.append(stdout.read()))
    reader.start()
    while True:  # wait4, not poll: it returns the child's own rusage (its peak RSS)
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        samples.append(_rss_kib(proc.pid))
        time.sleep(0.25)
    proc.returncode = os.waitstatus_to_exitcode(status)
    reader.join()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"memfit data exited {proc.returncode}: {' '.join(cmd)}")
    return {
        "wall": wall, "peak_kib": usage.ru_maxrss, "rss": [s for s in samples if s],
        "report": json.loads(out[0]),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[50, 200, 800], help="MB per file")
    ap.add_argument("--dir", default=None, help="where to write the files (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    ap.add_argument("--tokenizer", default=None, help="a tokenizer folder to pass through")
    args = ap.parse_args()
    where = Path(args.dir or tempfile.mkdtemp(prefix="memfit-bench-data-"))
    where.mkdir(parents=True, exist_ok=True)
    print(
        f"memfit data over JSON Lines of {', '.join(map(str, args.sizes))} MB "
        f"({'tokenizer ' + args.tokenizer if args.tokenizer else 'approximate tokenizer'})"
    )
    print(
        f"{'file':>8} {'samples':>11} {'peak RSS':>10} {'RSS mid..end':>16} {'wall':>7} "
        f"{'samples/s':>11} {'MB/s':>6}  longest whitespace run"
    )
    peaks = []
    for mb in args.sizes:
        path = where / f"data_{mb}MB.jsonl"
        n, planted = make_file(path, mb)
        r = run_one(path, args.tokenizer)
        rep = r["report"]
        assert rep["samples"] == n, (rep["samples"], n)
        top = rep["longest_whitespace_run"]["top"][0]
        found = "planted line" if top["line"] == planted else f"WRONG line {top['line']}"
        rss = r["rss"]
        span = f"{rss[len(rss) // 2] // 1024}..{rss[-1] // 1024} MiB" if rss else "-"
        size = path.stat().st_size
        print(
            f"{size / MB:>6.0f}MB {n:>11,} {r['peak_kib'] / 1024:>6.0f} MiB {span:>16} "
            f"{r['wall']:>6.1f}s {n / rep['seconds']:>11,.0f} {size / MB / rep['seconds']:>6.1f}  "
            f"line {top['line']:,} ({top['value']:,} chars, {found})"
        )
        peaks.append(r["peak_kib"] / 1024)
        if not args.keep:
            path.unlink()
    growth = peaks[-1] - peaks[0]
    verdict = "FLAT" if growth <= FLAT_MIB else "GROWS"
    print(
        f"peak RSS from the smallest to the largest file: {growth:+.1f} MiB ({verdict}; "
        f"flat is within {FLAT_MIB} MiB)"
    )


if __name__ == "__main__":
    main()
