"""Time `memfit plan` on the issue's reference workload and print PASS/FAIL against the target.

    python benchmarks/bench_plan.py

Target (2-core CPU machine): `memfit plan llama-2-7b --gpu rtx-4090 --global-batch 32
--seq 2048` completes in <= 20 s. The import of memfit and transformers is timed separately.
"""

from __future__ import annotations

import argparse
import json
import time

TARGET_SECONDS = 20.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="llama-2-7b")
    parser.add_argument("--gpu", default="rtx-4090")
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--allow", action="append", default=[])
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()

    t0 = time.perf_counter()
    import transformers  # noqa: F401  (imported by the first trace anyway)

    import memfit
    from memfit.techniques import labels as technique_labels

    t_import = time.perf_counter() - t0
    t1 = time.perf_counter()
    result = memfit.plan(
        args.model,
        gpu=args.gpu,
        goal=memfit.Goal(global_batch=args.global_batch, seq_len=args.seq),
        allow=tuple(args.allow),
    )
    seconds = time.perf_counter() - t1
    best = result.best
    print(f"import memfit + transformers: {t_import:.2f} s")
    print(
        f"memfit plan {args.model} --gpu {args.gpu} --global-batch {args.global_batch} "
        f"--seq {args.seq}{''.join(' --allow ' + a for a in args.allow)}: {seconds:.2f} s, "
        f"{result.evaluated} configurations from {result.traces} traces"
    )
    if best is None:
        miss = result.closest_miss
        need = miss.device_total_bytes / 2**30 if miss else float("nan")
        print(f"  nothing fits; closest needs {need:.2f} GiB")
    else:
        print(
            f"  best: micro-batch {best.workload.batch_size} x {best.workload.grad_accum}, "
            f"{best.workload.precision}, {best.workload.optimizer}, "
            f"{', '.join(technique_labels(best.workload))}; "
            f"{best.device_total_bytes / 2**30:.2f} GiB, {best.cost.seconds:.2f} s/step"
        )
    verdict = "PASS" if seconds <= TARGET_SECONDS else "FAIL"
    print(f"  {verdict}  plan <= {TARGET_SECONDS:.0f} s: {seconds:.2f} s")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"seconds": seconds, "import_seconds": t_import,
                       "evaluated": result.evaluated, "traces": result.traces}, f)  # fmt: skip


if __name__ == "__main__":
    main()
