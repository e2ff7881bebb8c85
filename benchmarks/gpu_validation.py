"""GPU validation: memfit's estimates against what a real CUDA training step uses.

One command runs it all on a GPU machine (within four GPU minutes; bitsandbytes travels as a
wheel, see benchmarks/gpu_device_prep.sh):

    bash benchmarks/gpu_device_prep.sh install && python benchmarks/gpu_validation.py --budget 240

For every configuration (benchmarks/_gpu_validation_configs.py; ``--list``), memfit estimates
the step on the CPU (`memfit.estimate`), and, when a CUDA GPU is present, the same step runs for
real and is measured. Estimates are made beforehand on a CPU with the GPU image's versions
(``--estimate-only``) and stored in ``benchmarks/gpu_validation_estimates-torch<X.Y>-tf<X.Y>
.json`` with memfit's commit; a GPU run uses the stored estimate of a configuration when the
file for its torch and transformers versions has one for that GPU and the configuration is
unchanged, and estimates the others itself, in parallel processes while the GPU measures.

Measured (benchmarks/_gpu_validation_device.py):

* ``torch.cuda.max_memory_allocated()`` / ``max_memory_reserved()``: the step's peak, reset
  after the model is built and on the device (``step_max_*``, compared with memfit's peak,
  which counts the weights from its start), and the peak over build and steps as the first run
  measured it (``max_*``);
* the device memory in use from NVML (pynvml when importable, else ``nvidia-smi``), minus the
  same figure read before CUDA was initialised: the CUDA context, the kernel images and the
  allocator's reserved memory of this process. It is read after the steps, before anything
  is freed; the caching allocator returns no memory during the steps (unless an allocation
  had to retry, which the row records), so that is the peak;
* a summary of ``torch.cuda.memory._snapshot()`` segments (count and bytes per pool).

The real step is the loop memfit traces (src/memfit/estimator/step_runner.py, ``run_trace`` /
``_one_step``):
the catalog model is built on the meta device with ``build_model(..., num_layers=None)``
(LoRA and checkpointing applied as memfit applies them), its parameters and then its buffers
are allocated on the GPU in the order memfit's tracker registers them (ties kept), and
initialised in place (transformers' ``initialize_weights``, ``reset_parameters`` for the
ResNets). ``-true`` precisions cast the model first; ``-mixed`` ones run the forward and the
loss under ``torch.autocast("cuda", dtype)``, and fp16-mixed uses ``torch.amp.GradScaler``.
The optimizer is ``memfit.techniques.optimizer.optimizer_for_trace`` (foreach, as CUDA picks).
Inputs come from memfit's own ``make_batch_for`` (``input_ids`` and ``labels`` from
``torch.randint``, no attention mask; ``pixel_values`` for images), made on the GPU. Each step:
forward, loss (``out.loss``, or cross-entropy for the ResNets), ``del out``, backward,
``del loss, batch``, ``optimizer.step()``, ``zero_grad(set_to_none=True)``; two steps.

Loops memfit did not write (``loop`` != "memfit": a Trainer with MemfitCallback, generate,
peft LoRA, bitsandbytes QLoRA, autocast + GradScaler written plainly, and the README's 7B step)
are described in benchmarks/_gpu_validation_loops.py.

Workers: configurations run several to a worker process (one CUDA context; everything freed,
cuBLAS workspaces and ``empty_cache()`` included, between them), in the order of value
(``_gpu_validation_configs.by_value``: new loops, then the clusters that missed before), a
worker taking configurations until it plans 60 s. The device figure (NVML, per process) is
compared only for a worker's first configuration: later ones share kernels loaded before.
``--parallel N`` runs up to N workers at once while their estimated device totals fit in 90 % of
the device. ``--fresh`` gives every configuration its own worker (the first run's mode);
``--in-process`` measures them all in this process. ``--budget SECONDS`` stops before the
budget (a configuration whose planned time would pass it is not started) and writes what it
measured; ``--estimate-only`` writes the stored estimates and prints the planned GPU seconds
(time model: benchmarks/_gpu_validation_plan.py).

Output: ``<out>/<gpu>-<YYYY-MM-DD>.json`` (every row) and ``.md`` (per-configuration errors
and the median / worst summary against the targets below). Without a GPU, rows hold only the
estimate and the files are called ``cpu-estimate-only-<YYYY-MM-DD>`` so that they cannot be
mistaken for GPU evidence. ``--quick`` and ``--only`` runs add ``-quick`` / ``-only`` to the
name, so that a partial run never overwrites a full one.

``--record-traces`` also records the allocator's own history
(``torch.cuda.memory._record_memory_history``) for the few small configurations marked
``trace=True``, and writes each as ``<out>/traces/<config>-<gpu>-<date>.json`` in the format of
``tests/data/allocator_traces/`` (see ``trace_from_snapshot``): drop such a file in that folder
and ``tests/cuda/test_allocator_traces.py`` replays it through memfit's allocator simulator.

A failing configuration never stops the run: its error goes into its row. The report is
rewritten after every configuration, so a run cut short keeps what it measured, and
``--resume`` runs only the configurations that today's report lacks or that failed. The exit
status is 0 unless every configuration failed. ``PYTORCH_CUDA_ALLOC_CONF``, when set, applies
to the real runs and is passed to the estimates (``alloc_conf``) as well.

This script needs only torch, transformers and memfit (``pip install --no-deps -e .``; without
an install it uses the checkout's src/); LoRA configurations also need peft (and its
accelerate), QLoRA bitsandbytes, and record an error without them.

Usage:
    python benchmarks/gpu_validation.py --budget 240      # all configurations, 4 GPU minutes
    python benchmarks/gpu_validation.py --estimate-only   # store estimates, print the plan (CPU)
    python benchmarks/gpu_validation.py --plan            # the plan from the stored estimates
    python benchmarks/gpu_validation.py --quick           # 6 configurations (CI)
    python benchmarks/gpu_validation.py --only gpt2medium # configurations whose name has it
    python benchmarks/gpu_validation.py --record-traces   # also record allocator traces
    python benchmarks/gpu_validation.py --resume          # finish a run that was cut short
    python benchmarks/gpu_validation.py --list            # print the configurations
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the _gpu_validation_* modules beside this file
    sys.path.insert(0, str(HERE))
try:
    import memfit  # noqa: F401
except ImportError:  # not installed: use the checkout's src/ (workers inherit this file's logic)
    sys.path.insert(0, str(HERE.parent / "src"))

from _gpu_validation_configs import CONFIGS, LOOPS, Config, by_value, select_configs, value_rank  # noqa: E402
from _gpu_validation_device import (  # noqa: E402
    measure,
    nvml_process_used,
    nvml_used,
    summarize_segments,
    trace_from_snapshot,
)
from _gpu_validation_estimates import estimate_only, print_plan, run_estimate, versions  # noqa: E402
from _gpu_validation_plan import SUITE_BUDGET_S, estimates_path, load_estimates, plan, stack_key  # noqa: E402
from _gpu_validation_report import TARGETS, compare, render_markdown, summarize  # noqa: E402
from _gpu_validation_run import _worker_main, run  # noqa: E402
from _gpu_validation_steps import init_weights, materialize, run_real_steps  # noqa: E402

__all__ = [
    "CONFIGS",
    "LOOPS",
    "TARGETS",
    "Config",
    "by_value",
    "compare",
    "init_weights",
    "load_estimates",
    "materialize",
    "measure",
    "nvml_process_used",
    "nvml_used",
    "plan",
    "render_markdown",
    "run_estimate",
    "run_real_steps",
    "select_configs",
    "summarize",
    "summarize_segments",
    "trace_from_snapshot",
    "value_rank",
]

DEFAULT_GPU = "h100-sxm"
#: The GPUs --estimate-only stores estimates for: the kinds the GPU machines lend.
STORED_GPUS = ("h100-sxm", "h200")
DEFAULT_OUT = HERE / "results"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Compare memfit's estimates with real CUDA training steps.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--quick", action="store_true", help="only the ~6 configurations for CI")
    ap.add_argument("--only", metavar="SUBSTRING", help="configurations whose name contains it")
    ap.add_argument(
        "--gpu",
        help="catalog GPU(s) for the estimates when no GPU is present or it "
        f"is not in the catalog (default {DEFAULT_GPU}; --estimate-only: "
        f"{','.join(STORED_GPUS)}); on a GPU the device's own name is used",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    ap.add_argument(
        "--record-traces", action="store_true", help="record allocator traces (trace=True configs)"
    )
    ap.add_argument(
        "--in-process", action="store_true", help="measure in this process, not in workers"
    )
    ap.add_argument("--fresh", action="store_true", help="one worker process per configuration")
    ap.add_argument("--parallel", type=int, default=1, help="workers at once (memory allowing)")
    ap.add_argument("--budget", type=float, help="GPU seconds: stop cleanly before them")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per measured config")
    ap.add_argument(
        "--estimate-only",
        action="store_true",
        help="store the estimates (CPU) and print the planned GPU time",
    )
    ap.add_argument("--plan", action="store_true", help="print the plan from stored estimates")
    ap.add_argument("--estimates", type=Path, help="stored estimates file (default: by versions)")
    ap.add_argument("--fresh-estimates", action="store_true", help="ignore stored estimates")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep the rows of today's report that did not fail and run only the others",
    )
    ap.add_argument("--list", action="store_true", help="print the configurations and exit")
    ap.add_argument("--worker-batch", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker_batch:
        return _worker_main(args.worker_batch)
    configs = select_configs(args.quick, args.only)
    if args.list:
        for c in configs:
            print(f"{c.name:48s} {c.label()}")
        print(
            f"{len(configs)} configurations, "
            f"{sum(c.loop != 'memfit' for c in configs)} of them loops memfit did not write "
            "(or its 7B step)"
        )
        return 0
    if not configs:
        print(f"no configuration matches --only {args.only!r}", file=sys.stderr)
        return 2

    vers = versions()
    key = stack_key(vers["torch"], vers["transformers"] or "?")
    store: Path = args.estimates or estimates_path(key)
    alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if args.estimate_only:
        gpus = args.gpu.split(",") if args.gpu else list(STORED_GPUS)
        data = estimate_only(configs, gpus, store, alloc_conf)
        total = print_plan(configs, data, gpus[0])
        bad = [f"{g}/{n}" for g in gpus for n, e in data["gpus"][g].items() if e["error"]]
        print(f"wrote {store}" + (f"; not estimated: {', '.join(bad)}" if bad else ""))
        return 0 if total <= SUITE_BUDGET_S else 1
    if args.plan:
        total = print_plan(configs, load_estimates(store), args.gpu or DEFAULT_GPU)
        return 0 if total <= SUITE_BUDGET_S else 1
    return run(args, configs, store, alloc_conf, vers)


if __name__ == "__main__":
    sys.exit(main())
