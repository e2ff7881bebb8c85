"""GPU validation: memfit's estimates against what a real CUDA training step uses.

For every configuration below, memfit estimates the step on the CPU (`memfit.estimate`), and,
when a CUDA GPU is present, the same step runs for real and is measured:

* ``torch.cuda.max_memory_allocated()`` / ``max_memory_reserved()``, after
  ``reset_peak_memory_stats()``, with the model and optimizer created inside the measured
  region (memfit counts the parameters from the start);
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

By default every configuration is measured in a fresh worker process (``--worker``), so that
each one pays for its own CUDA context, cuBLAS workspace and kernel images, as memfit's
``device_total_bytes`` assumes. ``--in-process`` measures them all in this process instead
(faster; everything is freed between configurations, cuBLAS workspaces included, but the
context keeps the kernels earlier configurations loaded, so the device figures run high).

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
accelerate), and record an error without it.

Usage:
    python benchmarks/gpu_validation.py                   # all configurations
    python benchmarks/gpu_validation.py --quick           # 6 configurations (CI)
    python benchmarks/gpu_validation.py --only gpt2medium # configurations whose name has it
    python benchmarks/gpu_validation.py --record-traces   # also record allocator traces
    python benchmarks/gpu_validation.py --resume          # finish a run that was cut short
    python benchmarks/gpu_validation.py --list            # print the configurations
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

try:
    import memfit  # noqa: F401
except ImportError:  # not installed: use the checkout's src/ (workers inherit this file's logic)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

MiB = 1 << 20
GiB = 1 << 30
FORMAT = "memfit-gpu-validation/1"
TRACE_FORMAT = "memfit-allocator-trace/1"
DEFAULT_GPU = "h100-sxm"
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
#: Ring-buffer size for _record_memory_history; a trace that fills it is incomplete.
TRACE_MAX_ENTRIES = 2_000_000

#: Accuracy targets (issue "CUDA fidelity"). Relative errors are (estimate - measured) / measured.
TARGETS = {
    "allocated_median": 0.02,
    "allocated_worst": 0.05,
    "reserved_median": 0.03,
    "reserved_worst": 0.08,
    "reserved_max_under": 0.03,  # never under-predict reserved memory by more than this
    "device_total_mib": 300.0,  # |estimate - NVML| in MiB
}


# ---------------------------------------------------------------------------- configurations


@dataclass(frozen=True)
class Config:
    """One training step to estimate and (on a GPU) to measure."""

    name: str
    model: str  # memfit catalog name
    family: str  # "cnn", "bert", "gpt2" or "llama"
    batch_size: int
    seq_len: int | None = None
    image_size: int | None = None
    precision: str = "fp32"
    optimizer: str = "adamw"
    checkpointing: str = "off"
    lora_rank: int | None = None
    lora_targets: tuple[str, ...] = ()  # () = memfit's default (every nn.Linear in the blocks)
    attention: str = "sdpa"
    mode: str = "train"  # or "inference": the forward under no_grad, model.eval(), no labels
    quick: bool = False  # part of --quick
    trace: bool = False  # recorded with --record-traces

    def workload(self) -> Any:
        from memfit import LoraConfig, Workload

        return Workload(
            batch_size=self.batch_size,
            seq_len=self.seq_len,
            image_size=self.image_size,
            precision=self.precision,
            optimizer=self.optimizer,
            checkpointing=self.checkpointing,
            lora=(
                LoraConfig(rank=self.lora_rank, targets=self.lora_targets)
                if self.lora_rank
                else None
            ),
            attention=self.attention,
            mode=self.mode,
        )

    def label(self) -> str:
        shape = f"{self.image_size or 224}px" if self.family == "cnn" else f"s{self.seq_len}"
        parts = [self.model, f"b{self.batch_size}", shape, self.precision, self.optimizer]
        if self.checkpointing != "off":
            parts.append(f"ckpt-{self.checkpointing}")
        if self.lora_rank:
            parts.append(f"lora-r{self.lora_rank}")
        if self.family != "cnn":
            parts.append(self.attention)
        if self.mode != "train":
            parts.append(self.mode)
        return " ".join(parts)


def _c(name: str, model: str, family: str, batch: int, seq: int | None = None, **kw: Any) -> Config:
    return Config(name=name, model=model, family=family, batch_size=batch, seq_len=seq, **kw)


# Sized to run two steps in seconds on an 80 GB H100: memfit's largest estimate among them is
# about 23 GiB reserved (qwen0.5b-bf16mixed-adamw-b4-s1024; its 151,936-token logits dominate).
# fmt: off
CONFIGS: tuple[Config, ...] = (
    # CNN (memfit.models.zoo ResNets, 224 x 224 images)
    _c("resnet18-fp32-sgd-b16", "resnet-18", "cnn", 16, optimizer="sgd", quick=True, trace=True),
    _c("resnet18-bf16true-adamw-b64", "resnet-18", "cnn", 64, precision="bf16-true"),
    _c("resnet50-bf16mixed-adamw-b32", "resnet-50", "cnn", 32, precision="bf16-mixed"),
    _c("resnet50-fp16mixed-sgd-b32", "resnet-50", "cnn", 32, precision="fp16-mixed",
       optimizer="sgd"),
    # BERT-style encoder (masked LM)
    _c("bert-fp32-adamw-b8-s128", "bert-base-uncased", "bert", 8, 128, quick=True, trace=True),
    _c("bert-bf16mixed-adamw-b16-s512", "bert-base-uncased", "bert", 16, 512,
       precision="bf16-mixed"),
    _c("bert-fp16mixed-adamw-b16-s256-eager", "bert-base-uncased", "bert", 16, 256,
       precision="fp16-mixed", attention="eager"),
    _c("bert-bf16mixed-adamw-b16-s512-ckpt", "bert-base-uncased", "bert", 16, 512,
       precision="bf16-mixed", checkpointing="blocks"),
    # GPT-2: a batch sweep (1, 4, 16 at 512 tokens) and a sequence sweep (256, 512, 1024)
    _c("gpt2-fp32-sgd-b1-s128", "gpt2", "gpt2", 1, 128, optimizer="sgd", quick=True, trace=True),
    _c("gpt2-fp32-adamw-b8-s512", "gpt2", "gpt2", 8, 512),
    _c("gpt2-bf16mixed-adamw-b1-s512", "gpt2", "gpt2", 1, 512, precision="bf16-mixed"),
    _c("gpt2-bf16mixed-adamw-b4-s512", "gpt2", "gpt2", 4, 512, precision="bf16-mixed", quick=True),
    _c("gpt2-bf16mixed-adamw-b16-s512", "gpt2", "gpt2", 16, 512, precision="bf16-mixed"),
    _c("gpt2-bf16mixed-adamw-b4-s256", "gpt2", "gpt2", 4, 256, precision="bf16-mixed"),
    _c("gpt2-bf16mixed-adamw-b4-s1024", "gpt2", "gpt2", 4, 1024, precision="bf16-mixed"),
    _c("gpt2-bf16mixed-adamw-b4-s1024-eager", "gpt2", "gpt2", 4, 1024, precision="bf16-mixed",
       attention="eager"),
    _c("gpt2-fp16mixed-adamw-b4-s1024", "gpt2", "gpt2", 4, 1024, precision="fp16-mixed"),
    _c("gpt2-bf16true-adafactor-b8-s1024", "gpt2", "gpt2", 8, 1024, precision="bf16-true",
       optimizer="adafactor"),
    _c("gpt2medium-fp32-adamw-b2-s512", "gpt2-medium", "gpt2", 2, 512),
    _c("gpt2medium-bf16mixed-adamw-b4-s1024-ckpt", "gpt2-medium", "gpt2", 4, 1024,
       precision="bf16-mixed", checkpointing="blocks"),
    # GPT-2's projections are transformers Conv1D modules, not nn.Linear, so memfit's default
    # LoRA targets (the nn.Linear layers of a block) find none: name them.
    _c("gpt2medium-bf16mixed-lora-b4-s1024", "gpt2-medium", "gpt2", 4, 1024,
       precision="bf16-mixed", lora_rank=8, lora_targets=("c_attn",)),
    # Llama-style decoders
    _c("tinyllama-bf16true-adamw-b4-s1024", "tinyllama-1.1b", "llama", 4, 1024,
       precision="bf16-true"),
    _c("tinyllama-bf16mixed-adamw-b2-s1024-ckpt", "tinyllama-1.1b", "llama", 2, 1024,
       precision="bf16-mixed", checkpointing="blocks"),
    _c("tinyllama-bf16true-lora-b4-s2048", "tinyllama-1.1b", "llama", 4, 2048,
       precision="bf16-true", lora_rank=8),
    _c("llama3.2-1b-bf16true-adamw-b2-s1024", "llama-3.2-1b", "llama", 2, 1024,
       precision="bf16-true"),
    _c("llama3.2-1b-bf16true-adafactor-b2-s1024", "llama-3.2-1b", "llama", 2, 1024,
       precision="bf16-true", optimizer="adafactor"),
    _c("llama3.2-1b-bf16true-sgd-b4-s512-eager", "llama-3.2-1b", "llama", 4, 512,
       precision="bf16-true", optimizer="sgd", attention="eager"),
    _c("qwen0.5b-bf16true-adamw-b2-s512", "qwen2.5-0.5b", "llama", 2, 512,
       precision="bf16-true", quick=True),
    _c("qwen0.5b-bf16mixed-adamw-b4-s1024", "qwen2.5-0.5b", "llama", 4, 1024,
       precision="bf16-mixed"),
    _c("qwen0.5b-bf16true-adamw-b4-s2048-ckpt", "qwen2.5-0.5b", "llama", 4, 2048,
       precision="bf16-true", checkpointing="blocks"),
    _c("qwen0.5b-fp32-adamw-b2-s512-eager", "qwen2.5-0.5b", "llama", 2, 512, attention="eager"),
    _c("qwen0.5b-bf16mixed-lora-b4-s1024", "qwen2.5-0.5b", "llama", 4, 1024,
       precision="bf16-mixed", lora_rank=8, quick=True),
    # Inference: the forward under no_grad on the inputs only (no labels, no loss). The first
    # is the run optimum-benchmark published for an A10G (benchmarks/published_measurements.py).
    _c("bert-fp32-inference-b1-s128", "bert-base-uncased", "bert", 1, 128, optimizer="none",
       mode="inference"),
    _c("gpt2-bf16true-inference-b8-s1024", "gpt2", "gpt2", 8, 1024, precision="bf16-true",
       optimizer="none", mode="inference"),
    _c("llama3.2-1b-bf16true-inference-b4-s2048", "llama-3.2-1b", "llama", 4, 2048,
       precision="bf16-true", optimizer="none", mode="inference"),
)
# fmt: on


def select_configs(quick: bool = False, only: str | None = None) -> list[Config]:
    out = [c for c in CONFIGS if c.quick or not quick]
    if only:
        out = [c for c in out if only.lower() in c.name.lower()]
    return out


# ---------------------------------------------------------------------------- estimate


def run_estimate(cfg: Config, gpu: str, alloc_conf: str | None) -> dict[str, Any]:
    """memfit's estimate of `cfg` on `gpu`, as plain JSON-able numbers."""
    import memfit

    t0 = time.perf_counter()
    est = memfit.estimate(cfg.model, cfg.workload(), gpu=gpu, alloc_conf=alloc_conf or None)
    seconds = time.perf_counter() - t0
    p = est.profile
    return {
        "peak_allocated_bytes": p.peak_allocated_bytes,
        "peak_reserved_bytes": p.peak_reserved_bytes,
        "device_total_bytes": p.device_total_bytes,
        "device_total_range_bytes": list(est.device_total_range)
        if est.device_total_range
        else None,
        "breakdown": dict(p.breakdown),
        "device_breakdown": dict(p.device_breakdown),
        "peak_step": p.peak_step,
        "peak_phase": p.peak_phase,
        "peak_op": p.peak_op,
        "peak_module": p.peak_module,
        "parameter_count": est.parameter_count,
        "trainable_parameter_count": est.trainable_parameter_count,
        "num_blocks": est.num_blocks,
        "replayed": est.replayed,
        "attention_backend": est.attention_backend,
        "fits": est.fits,
        "seconds": round(seconds, 3),
    }


# ---------------------------------------------------------------------------- the real step


def materialize(model: Any, device: Any) -> None:
    """Give a meta-device model real, uninitialised storage on `device`, in place.

    Parameters first (in ``model.parameters()`` order), then buffers (``named_buffers()``
    order): the order in which memfit's tracker registers them. A tensor shared by several
    modules (tied embeddings) gets one storage, as in memfit's ``materialize_fake``;
    ``nn.Module.to_empty`` would untie it.
    """
    import torch

    memo: dict[int, Any] = {}

    def make(t: Any, is_param: bool) -> None:
        if id(t) in memo:
            return
        data = torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device=device)
        memo[id(t)] = torch.nn.Parameter(data, requires_grad=t.requires_grad) if is_param else data

    for p in model.parameters():
        make(p, True)
    for _, b in model.named_buffers():
        make(b, False)
    for mod in model.modules():
        for n, p in list(mod._parameters.items()):
            if p is not None:
                make(p, True)
                mod._parameters[n] = memo[id(p)]
        for n, b in list(mod._buffers.items()):
            if b is not None:
                make(b, False)
                mod._buffers[n] = memo[id(b)]


def init_weights(model: Any) -> None:
    """Initialise every parameter and buffer in place (no new storage for them).

    transformers models: their own ``initialize_weights`` (which also refills buffers such as
    BERT's ``position_ids`` and the rotary ``inv_freq``); other modules: ``reset_parameters``
    where they have it (convolutions, batch norms with their running statistics, linears).
    """
    import torch

    hf_cls = None
    if "transformers" in sys.modules:
        hf_cls = getattr(sys.modules["transformers"], "PreTrainedModel", None)
    hf = [m for m in model.modules() if hf_cls is not None and isinstance(m, hf_cls)]
    with torch.no_grad():
        if hf:
            top = hf[0]
            for obj in [*top.modules(), *top.parameters(), *top.buffers()]:
                if "_is_hf_initialized" in getattr(obj, "__dict__", {}):
                    del obj.__dict__["_is_hf_initialized"]
            top.initialize_weights()
        else:
            for m in model.modules():
                reset = getattr(m, "reset_parameters", None)
                if callable(reset):
                    reset()


def run_real_steps(cfg: Config, device: Any, *, on_done: Any = None) -> dict[str, Any]:
    """Run `cfg`'s training step for real on `device`, as memfit's trace runs it.

    ``on_done()`` is called after the last step, with everything still alive (to read the
    device memory); its dict is merged into the result.
    """
    import torch

    from memfit.estimator.step_runner import DTYPES, make_batch_for, step_loss
    from memfit.models.sources import resolve_model
    from memfit.models.structure import find_repeated_blocks
    from memfit.techniques.checkpointing import checkpoint_blocks
    from memfit.techniques.composition import prepare_model
    from memfit.techniques.optimizer import optimizer_for_trace
    from memfit.techniques.train_setup import call_model

    device = torch.device(device)
    w = cfg.workload()
    spec = resolve_model(cfg.model)
    low = DTYPES[w.compute_dtype_name]
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = spec.build(None, w.attention)
    model = prepare_model(model, w, spec)  # LoRA on meta, as memfit does
    if w.pure_low_precision:
        model = model.to(low)  # on meta: free; then storage is made in the low dtype directly
    materialize(model, device)
    init_weights(model)
    blocks = find_repeated_blocks(model)
    if w.checkpointing == "blocks":
        checkpoint_blocks(model, blocks)
    model.train(w.training)
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "use_cache"):
        config.use_cache = False
    params = list(dict.fromkeys(model.parameters()))
    trainable = [p for p in params if p.requires_grad]
    optimizer = optimizer_for_trace(w.optimizer, trainable) if w.training else None
    scaler = torch.amp.GradScaler(device.type) if w.precision == "fp16-mixed" else None
    skipped = 0
    losses: list[float] = []
    for _step in range(w.steps):
        for _micro in range(w.grad_accum):
            with torch.device(device):
                dtype = low if w.pure_low_precision else torch.float32
                batch = make_batch_for(spec, model, w, dtype)
            for t in batch.values() if isinstance(batch, dict) else batch:
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    t.normal_()  # memfit's image batches are torch.empty
            ctx = torch.autocast(device.type, dtype=low) if w.mixed else contextlib.nullcontext()
            if not w.training:
                with ctx, torch.no_grad():
                    out = call_model(model, batch)
                del out, batch
                continue
            with ctx:
                out = call_model(model, batch)
                loss = step_loss(spec, out, batch)
                del out
            if w.grad_accum > 1:
                loss = loss / w.grad_accum
            losses.append(float(loss.detach()))
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            del loss, batch
        if optimizer is not None:
            if scaler is not None:
                before = scaler.get_scale()
                scaler.step(optimizer)
                scaler.update()
                skipped += int(scaler.get_scale() < before)
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:  # optimizer "none": memfit drops the gradients
            for p in model.parameters():
                p.grad = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    info: dict[str, Any] = {
        "seconds": round(time.perf_counter() - t0, 3),
        "parameter_count": sum(p.numel() for p in params),
        "trainable_parameter_count": sum(p.numel() for p in trainable),
        "num_blocks": len(blocks),
        "losses": [round(x, 4) for x in losses],
        "fp16_skipped_steps": skipped if scaler is not None else None,
        "attn_implementation": getattr(config, "_attn_implementation", None),
    }
    if on_done is not None:
        info.update(on_done())
    del model, params, trainable, optimizer, scaler
    gc.collect()
    return info


# ---------------------------------------------------------------------------- NVML


def _norm_uuid(u: Any) -> str:
    s = u.decode() if isinstance(u, bytes) else str(u)
    s = s.strip().lower()
    return s[4:] if s.startswith("gpu-") else s


def nvml_used() -> tuple[dict[str, int], str] | None:
    """Device memory in use per GPU ({uuid: bytes}, source), or None when NVML is unreachable."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            out = {}
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                out[_norm_uuid(pynvml.nvmlDeviceGetUUID(h))] = int(
                    pynvml.nvmlDeviceGetMemoryInfo(h).used
                )
            return out, "pynvml"
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        text = subprocess.run(
            [exe, "--query-gpu=uuid,memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except Exception:
        return None
    out = {}
    for line in text.strip().splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[1].isdigit():
            out[_norm_uuid(parts[0])] = int(parts[1]) * MiB
    return (out, "nvidia-smi") if out else None


def _pick(reading: tuple[dict[str, int], str] | None, uuid: str | None) -> int | None:
    if reading is None:
        return None
    values = reading[0]
    if uuid is not None and _norm_uuid(uuid) in values:
        return values[_norm_uuid(uuid)]
    if len(values) == 1:
        return next(iter(values.values()))
    return None


# ---------------------------------------------------------------------------- snapshots, traces


def summarize_segments(segments: list[dict[str, Any]]) -> dict[str, Any]:
    """Count and bytes of the snapshot's segments per pool, and the large segments' sizes."""
    out: dict[str, Any] = {}
    for seg in segments:
        pool = seg.get("segment_type", "?")
        d = out.setdefault(pool, {"count": 0, "total_size": 0, "allocated_size": 0, "sizes": []})
        d["count"] += 1
        d["total_size"] += int(seg["total_size"])
        d["allocated_size"] += int(seg.get("allocated_size", 0))
        d["sizes"].append(int(seg["total_size"]))
    for d in out.values():
        d["sizes"].sort(reverse=True)
        if len(d["sizes"]) > 64:
            d["sizes"] = d["sizes"][:64]
            d["sizes_truncated"] = True
    return out


def snapshot_segments(segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A snapshot's segments in the trace format: pool, total size, blocks in address order."""
    out = []
    for seg in sorted(segments, key=lambda s: s.get("address", 0)):
        blocks = [
            [int(b["size"]), "free" if b.get("state") == "inactive" else "allocated"]
            for b in sorted(seg.get("blocks", []), key=lambda b: b.get("address", 0))
        ]
        out.append(
            {
                "pool": seg.get("segment_type"),
                "total_size": int(seg["total_size"]),
                "blocks": blocks,
            }
        )
    return out


def trace_from_snapshot(
    snapshot: dict[str, Any], *, device_index: int = 0, name: str = "", meta: Any = None
) -> dict[str, Any]:
    """Turn a ``torch.cuda.memory._snapshot()`` taken with history on into a trace file.

    events: ``["alloc", id, requested_size]`` for each "alloc" entry and ``["free", id, size]``
    for each "free_completed" one (the moment the block returns to the cache); ids number the
    allocations in order. checkpoints: after every event that changed reserved memory
    ("segment_alloc"/"segment_map" entries precede the "alloc" that needed them), the reserved
    bytes; after the last event, the full segment layout of the snapshot and the allocated
    bytes. The trace is marked incomplete when the ring buffer may have dropped entries, when
    the allocator held blocks before the history started, or when an OOM happened.
    """
    traces = snapshot.get("device_traces") or []
    entries = traces[device_index] if device_index < len(traces) else []
    events: list[list[Any]] = []
    checkpoints: list[dict[str, Any]] = []
    ids: dict[int, int] = {}
    next_id = 0
    reserved = 0
    last_reserved = 0
    complete = len(entries) < TRACE_MAX_ENTRIES
    notes: list[str] = []
    for e in entries:
        action = e.get("action")
        if action == "alloc":
            ids[e["addr"]] = next_id
            events.append(["alloc", next_id, int(e["size"])])
            next_id += 1
        elif action == "free_completed":
            if e["addr"] not in ids:
                complete = False
                notes.append("a free of a block allocated before the history started")
                continue
            events.append(["free", ids.pop(e["addr"]), int(e["size"])])
        elif action in ("segment_alloc", "segment_map"):
            reserved += int(e["size"])
            continue
        elif action in ("segment_free", "segment_unmap"):
            reserved -= int(e["size"])
            continue
        elif action == "oom":
            complete = False
            notes.append("an OOM")
            continue
        else:  # free_requested, snapshot
            continue
        if reserved != last_reserved:
            checkpoints.append({"after_event": len(events) - 1, "reserved_bytes": reserved})
            last_reserved = reserved
    segments = snapshot_segments(
        [s for s in snapshot.get("segments", []) if s.get("device", device_index) == device_index]
    )
    final_reserved = sum(s["total_size"] for s in segments)
    if final_reserved != reserved:
        complete = False
        notes.append(f"segments hold {final_reserved} B, the trace's segment entries {reserved} B")
    allocated = sum(b[0] for s in segments for b in s["blocks"] if b[1] == "allocated")
    if events:
        final = {"after_event": len(events) - 1, "reserved_bytes": final_reserved}
        final["allocated_bytes"] = allocated
        final["segments"] = segments
        if checkpoints and checkpoints[-1]["after_event"] == final["after_event"]:
            checkpoints[-1] = final
        else:
            checkpoints.append(final)
    return {
        "format": TRACE_FORMAT,
        "name": name,
        "source": "recorded",
        "description": "Recorded with torch.cuda.memory._record_memory_history on a GPU by "
        "benchmarks/gpu_validation.py --record-traces.",
        "derivation": "Expected reserved bytes from the trace's segment_alloc/segment_free "
        "entries; the final segment layout and allocated bytes from the same "
        "torch.cuda.memory._snapshot().",
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "capacity_bytes": None,
        "complete": complete and not notes,
        "notes": notes,
        "recorded_with": meta or {},
        "events": events,
        "checkpoints": checkpoints,
    }


# ---------------------------------------------------------------------------- measurement


def _clear_cuda() -> None:
    import torch

    gc.collect()
    torch.cuda.synchronize()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()  # the cuBLAS workspace is allocator memory kept per (handle, stream)
    torch.cuda.empty_cache()


def measure(
    cfg: Config,
    *,
    baseline: tuple[dict[str, int], str] | None,
    record_trace: bool = False,
    trace_path: Path | None = None,
    trace_meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run `cfg` on the current CUDA device and read its memory; see the module docstring."""
    import torch

    dev = torch.device("cuda", torch.cuda.current_device())
    _clear_cuda()
    leftover = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    torch.cuda.reset_accumulated_memory_stats(dev)
    props = torch.cuda.get_device_properties(dev)
    uuid = str(getattr(props, "uuid", "")) or None
    if record_trace:
        record = torch.cuda.memory._record_memory_history
        try:
            record(enabled="all", context=None, max_entries=TRACE_MAX_ENTRIES, clear_history=True)
        except TypeError:  # a torch without clear_history
            record(enabled="all", context=None, max_entries=TRACE_MAX_ENTRIES)

    def on_done() -> dict[str, Any]:
        stats = torch.cuda.memory_stats(dev)
        snap = torch.cuda.memory._snapshot()
        reading = nvml_used()
        used = _pick(reading, uuid)
        base = _pick(baseline, uuid)
        out: dict[str, Any] = {
            "max_memory_allocated": torch.cuda.max_memory_allocated(dev),
            "max_memory_reserved": torch.cuda.max_memory_reserved(dev),
            "memory_allocated_end": torch.cuda.memory_allocated(dev),
            "memory_reserved_end": torch.cuda.memory_reserved(dev),
            "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
            "num_ooms": int(stats.get("num_ooms", 0)),
            "nvml_source": reading[1] if reading else None,
            "nvml_used_bytes": used,
            "nvml_baseline_bytes": base,
            "device_total_bytes": used - base if used is not None and base is not None else None,
            "segments": summarize_segments(snap.get("segments", [])),
            "leftover_allocated_bytes": leftover,
        }
        if record_trace and trace_path is not None:
            trace = trace_from_snapshot(
                snap, device_index=dev.index or 0, name=cfg.name, meta=trace_meta
            )
            if leftover:
                trace["complete"] = False
                trace["notes"].append(f"{leftover} B were allocated before the history started")
            trace_path.parent.mkdir(parents=True, exist_ok=True)
            trace_path.write_text(json.dumps(trace, separators=(",", ":")) + "\n")
            out["trace_file"] = str(trace_path)
            out["trace_events"] = len(trace["events"])
            out["trace_complete"] = trace["complete"]
        return out

    try:
        return run_real_steps(cfg, dev, on_done=on_done)
    finally:
        if record_trace:
            torch.cuda.memory._record_memory_history(enabled=None)
        _clear_cuda()


def device_info() -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "name": torch.cuda.get_device_name(),
        "total_memory": int(props.total_memory),
        "capability": [props.major, props.minor],
        "multi_processor_count": props.multi_processor_count,
        "uuid": str(getattr(props, "uuid", "")),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }


def _catalog_gpu(display_name: str | None, fallback: str) -> tuple[str, str | None]:
    """(catalog name, note): the catalog GPU matching torch's device name, else `fallback`."""
    from memfit.cuda.target import get_gpu
    from memfit.errors import BadInputError

    if display_name:
        try:
            return get_gpu(display_name).name, None
        except BadInputError:
            return get_gpu(fallback).name, (
                f"{display_name!r} is not in memfit's GPU catalog; estimates use {fallback!r}"
            )
    return get_gpu(fallback).name, None


# ---------------------------------------------------------------------------- rows, report


def rel_error(est: Any, meas: Any) -> float | None:
    if not isinstance(est, int) or not isinstance(meas, int) or meas <= 0:
        return None
    return (est - meas) / meas


def compare(estimate: dict[str, Any] | None, measured: dict[str, Any] | None) -> dict[str, Any]:
    e = estimate or {}
    m = measured or {}
    dev_e, dev_m = e.get("device_total_bytes"), m.get("device_total_bytes")
    return {
        "allocated_rel": rel_error(e.get("peak_allocated_bytes"), m.get("max_memory_allocated")),
        "reserved_rel": rel_error(e.get("peak_reserved_bytes"), m.get("max_memory_reserved")),
        "device_total_mib": (
            (dev_e - dev_m) / MiB if isinstance(dev_e, int) and isinstance(dev_m, int) else None
        ),
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median / worst errors over the rows that have both sides, against TARGETS."""

    def vals(key: str) -> list[float]:
        return [r["errors"][key] for r in rows if r["errors"].get(key) is not None]

    alloc, res, dev = vals("allocated_rel"), vals("reserved_rel"), vals("device_total_mib")
    out: dict[str, Any] = {"measured_rows": len(alloc)}

    def stat(values: list[float]) -> tuple[float | None, float | None]:
        if not values:
            return None, None
        absolute = [abs(v) for v in values]
        return statistics.median(absolute), max(absolute)

    out["allocated_median_abs"], out["allocated_worst_abs"] = stat(alloc)
    out["reserved_median_abs"], out["reserved_worst_abs"] = stat(res)
    out["reserved_most_under"] = min(res) if res else None
    out["device_total_worst_abs_mib"] = max((abs(v) for v in dev), default=None)
    checks = {
        "allocated_median": (out["allocated_median_abs"], TARGETS["allocated_median"]),
        "allocated_worst": (out["allocated_worst_abs"], TARGETS["allocated_worst"]),
        "reserved_median": (out["reserved_median_abs"], TARGETS["reserved_median"]),
        "reserved_worst": (out["reserved_worst_abs"], TARGETS["reserved_worst"]),
        "reserved_max_under": (
            -out["reserved_most_under"] if out["reserved_most_under"] is not None else None,
            TARGETS["reserved_max_under"],
        ),
        "device_total_mib": (out["device_total_worst_abs_mib"], TARGETS["device_total_mib"]),
    }
    out["pass"] = {
        k: (None if v is None else bool(v <= target)) for k, (v, target) in checks.items()
    }
    return out


def _gib(n: Any) -> str:
    return f"{n / GiB:.3f}" if isinstance(n, int) else "-"


def _pct(x: Any) -> str:
    return f"{100 * x:+.2f} %" if isinstance(x, float) else "-"


def render_markdown(report: dict[str, Any]) -> str:
    meta, rows, summ = report["meta"], report["rows"], report["summary"]
    lines = [f"# memfit GPU validation: {meta['title']}", ""]
    if not meta["gpu_present"]:
        lines += [
            "**estimate only: no GPU.** No configuration was measured; this file is not GPU "
            "evidence. Run `python benchmarks/gpu_validation.py` on a CUDA machine for that.",
            "",
        ]
    lines += [
        f"- date: {meta['date']}; memfit {meta.get('memfit_commit') or '?'}; "
        f"torch {meta['torch']}; transformers {meta['transformers']}; python {meta['python']}",
        f"- estimates for GPU `{meta['gpu']}`"
        + (f"; measured on {meta['device']['name']}" if meta.get("device") else ""),
        f"- mode: {meta['mode']}; PYTORCH_CUDA_ALLOC_CONF={meta['alloc_conf'] or '(unset)'}",
        f"- configurations: {len(rows)}, failed: {sum(1 for r in rows if r['failed'])}",
    ]
    for note in meta.get("notes", []):
        lines.append(f"- note: {note}")
    lines += ["", "## Summary against the targets", ""]
    if summ["measured_rows"] == 0:
        lines += ["estimate only: no GPU, so no errors to summarise.", ""]
    else:

        def mark(key: str) -> str:
            v = summ["pass"].get(key)
            return "n/a" if v is None else ("PASS" if v else "FAIL")

        def p(x: Any) -> str:
            return f"{100 * x:.2f} %" if isinstance(x, (int, float)) else "-"

        worst_dev = summ["device_total_worst_abs_mib"]
        under = summ["reserved_most_under"]
        lines += [
            "| metric | value | target | result |",
            "|---|---|---|---|",
            f"| allocated, median abs error | {p(summ['allocated_median_abs'])} | <= 2 % | "
            f"{mark('allocated_median')} |",
            f"| allocated, worst abs error | {p(summ['allocated_worst_abs'])} | <= 5 % | "
            f"{mark('allocated_worst')} |",
            f"| reserved, median abs error | {p(summ['reserved_median_abs'])} | <= 3 % | "
            f"{mark('reserved_median')} |",
            f"| reserved, worst abs error | {p(summ['reserved_worst_abs'])} | <= 8 % | "
            f"{mark('reserved_worst')} |",
            f"| reserved, most negative error (under-prediction) | {_pct(under)} | >= -3 % | "
            f"{mark('reserved_max_under')} |",
            "| device total, worst abs difference | "
            + (f"{worst_dev:.0f} MiB" if worst_dev is not None else "-")
            + f" | <= 300 MiB | {mark('device_total_mib')} |",
            "",
            f"({summ['measured_rows']} measured configurations.)",
            "",
        ]
    lines += [
        "## Configurations",
        "",
        "GiB = 2^30 bytes. err = (estimate - measured) / measured; device diff in MiB.",
        "",
        "| config | est alloc | meas alloc | err | est reserved | meas reserved | err "
        "| est device | meas device | diff MiB | est s | notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        e, m, err = r["estimate"] or {}, r["measured"] or {}, r["errors"]
        notes = []
        if r.get("estimate_error"):
            notes.append("estimate failed: " + r["estimate_error"].splitlines()[-1][:120])
        if r.get("measure_error"):
            notes.append("run failed: " + r["measure_error"].splitlines()[-1][:120])
        if m.get("num_alloc_retries"):
            notes.append(f"{m['num_alloc_retries']} alloc retries")
        if m.get("parameter_count") not in (None, e.get("parameter_count")):
            notes.append(
                f"parameters: run {m['parameter_count']}, estimate {e.get('parameter_count')}"
            )
        if m.get("fp16_skipped_steps"):
            notes.append(f"GradScaler skipped {m['fp16_skipped_steps']} step(s)")
        if e.get("attention_backend"):
            notes.append(f"attn {e['attention_backend']}")
        dev = err.get("device_total_mib")
        lines.append(
            f"| {r['name']} | {_gib(e.get('peak_allocated_bytes'))} "
            f"| {_gib(m.get('max_memory_allocated'))} | {_pct(err.get('allocated_rel'))} "
            f"| {_gib(e.get('peak_reserved_bytes'))} | {_gib(m.get('max_memory_reserved'))} "
            f"| {_pct(err.get('reserved_rel'))} | {_gib(e.get('device_total_bytes'))} "
            f"| {_gib(m.get('device_total_bytes'))} "
            f"| {f'{dev:+.0f}' if isinstance(dev, float) else '-'} "
            f"| {e.get('seconds', '-')} | {'; '.join(notes)} |"
        )
    lines.append("")
    return "\n".join(lines)


def _version(pkg: str) -> str | None:
    try:
        import importlib.metadata

        return importlib.metadata.version(pkg)
    except Exception:
        return None


def _git_commit() -> str | None:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                cwd=Path(__file__).resolve().parent,
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout.strip()
            or None
        )
    except Exception:
        return None


# ---------------------------------------------------------------------------- driver


def run_config(
    cfg: Config,
    *,
    gpu: str,
    alloc_conf: str,
    measure_it: bool,
    in_process: bool,
    baseline: tuple[dict[str, int], str] | None,
    trace_path: Path | None,
    trace_meta: dict[str, Any],
    workdir: Path,
    timeout: float,
) -> dict[str, Any]:
    """One row: the estimate, and the measurement when `measure_it` (a worker runs it while
    this process estimates, unless `in_process`)."""
    row: dict[str, Any] = {
        "name": cfg.name,
        "label": cfg.label(),
        "config": asdict(cfg),
        "estimate": None,
        "measured": None,
        "estimate_error": None,
        "measure_error": None,
    }
    t0 = time.perf_counter()
    proc = None
    result_path = workdir / f"{cfg.name}.json"
    if measure_it and not in_process:
        proc = _start_worker(cfg.name, result_path, trace_path, trace_meta)
    try:
        row["estimate"] = run_estimate(cfg, gpu, alloc_conf)
    except Exception as e:
        row["estimate_error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    if measure_it:
        if proc is not None:
            res = _finish_worker(proc, result_path, timeout)
        else:
            try:
                res = {
                    "measured": measure(
                        cfg,
                        baseline=baseline,
                        record_trace=trace_path is not None,
                        trace_path=trace_path,
                        trace_meta=trace_meta,
                    )
                }
            except Exception as e:
                res = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
                with contextlib.suppress(Exception):
                    _clear_cuda()
        row["measured"] = res.get("measured")
        row["measure_error"] = res.get("error")
    row["errors"] = compare(row["estimate"], row["measured"])
    row["failed"] = bool(row["estimate_error"] or (measure_it and row["measure_error"]))
    row["wall_seconds"] = round(time.perf_counter() - t0, 2)
    return row


def _worker_main(args: argparse.Namespace) -> int:
    """One configuration in this (fresh) process; writes the measured dict to --worker-result."""
    baseline = nvml_used()  # before CUDA is initialised in this process
    result: dict[str, Any] = {}
    try:
        if args.worker == "__probe__":
            result = {"device": device_info()}
        else:
            cfg = next(c for c in CONFIGS if c.name == args.worker)
            trace_path = Path(args.trace_path) if args.trace_path else None
            meta = json.loads(args.trace_meta) if args.trace_meta else None
            result = {
                "measured": measure(
                    cfg,
                    baseline=baseline,
                    record_trace=trace_path is not None,
                    trace_path=trace_path,
                    trace_meta=meta,
                )
            }
    except BaseException as e:  # report everything, including OOM and KeyboardInterrupt
        result = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
    Path(args.worker_result).write_text(json.dumps(result))
    return 0


def _start_worker(
    name: str, result_path: Path, trace_path: Path | None, trace_meta: dict[str, Any] | None
) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name]
    cmd += ["--worker-result", str(result_path)]
    if trace_path is not None:
        cmd += ["--trace-path", str(trace_path), "--trace-meta", json.dumps(trace_meta or {})]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish_worker(
    proc: subprocess.Popen[str], result_path: Path, timeout: float
) -> dict[str, Any]:
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        return {"error": f"worker timed out after {timeout:.0f} s\n{output[-3000:]}"}
    if result_path.is_file():
        try:
            return json.loads(result_path.read_text())
        except json.JSONDecodeError:
            pass
    return {"error": f"worker exited with status {proc.returncode}\n{output[-3000:]}"}


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Compare memfit's estimates with real CUDA training steps.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--quick", action="store_true", help="only the ~6 configurations for CI")
    ap.add_argument("--only", metavar="SUBSTRING", help="configurations whose name contains it")
    ap.add_argument(
        "--gpu",
        default=DEFAULT_GPU,
        help="catalog GPU for the estimates when no GPU is present or it is not in the catalog "
        f"(default {DEFAULT_GPU}); on a GPU the device's own name is used",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    ap.add_argument(
        "--record-traces", action="store_true", help="record allocator traces (trace=True configs)"
    )
    ap.add_argument(
        "--in-process", action="store_true", help="measure in this process, not one per config"
    )
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per measured config")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep the rows of today's report that did not fail and run only the others",
    )
    ap.add_argument("--list", action="store_true", help="print the configurations and exit")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-result", help=argparse.SUPPRESS)
    ap.add_argument("--trace-path", help=argparse.SUPPRESS)
    ap.add_argument("--trace-meta", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return _worker_main(args)
    configs = select_configs(args.quick, args.only)
    if args.list:
        for c in configs:
            print(f"{c.name:45s} {c.label()}")
        return 0
    if not configs:
        print(f"no configuration matches --only {args.only!r}", file=sys.stderr)
        return 2

    baseline = nvml_used()  # before this process initialises CUDA (used by --in-process)
    gpu_present = _cuda_available()
    alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    date = datetime.date.today().isoformat()
    notes: list[str] = []
    device: dict[str, Any] | None = None
    mode = "estimate only"
    if gpu_present:
        mode = "in-process" if args.in_process else "one worker process per configuration"
        if args.in_process:
            device = device_info()
        else:
            probe = Path(tempfile.mkdtemp(prefix="memfit-gv-")) / "probe.json"
            device = _finish_worker(_start_worker("__probe__", probe, None, None), probe, 300)
            if "device" not in device:
                notes.append("device probe failed: " + str(device.get("error", ""))[-300:])
                device = None
            else:
                device = device["device"]
        gpu, note = _catalog_gpu(device["name"] if device else None, args.gpu)
        if note:
            notes.append(note)
        stem = gpu
    else:
        gpu, _ = _catalog_gpu(None, args.gpu)
        stem = "cpu-estimate-only"
    suffix = "-quick" if args.quick else ""
    if args.only:
        suffix += "-only"
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{stem}-{date}{suffix}.json"
    md_path = json_path.with_suffix(".md")
    import torch

    meta = {
        "format": FORMAT,
        "title": f"{stem}-{date}{suffix}",
        "date": date,
        "gpu": gpu,
        "gpu_present": gpu_present,
        "device": device,
        "mode": mode,
        "alloc_conf": alloc_conf,
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "peft": _version("peft"),
        "python": platform.python_version(),
        "memfit_commit": _git_commit(),
        "argv": sys.argv[1:] if argv is None else argv,
        "targets": TARGETS,
        "notes": notes,
    }
    trace_meta = {"device": device, "torch": torch.__version__, "alloc_conf": alloc_conf}
    done: dict[str, dict[str, Any]] = {}
    if args.resume and json_path.is_file():
        with contextlib.suppress(Exception):
            previous = json.loads(json_path.read_text())
            done = {r["name"]: r for r in previous["rows"] if not r.get("failed")}
    print(f"memfit GPU validation: {len(configs)} configurations; {mode}; estimates for {gpu}")
    workdir = Path(tempfile.mkdtemp(prefix="memfit-gv-"))
    t_all = time.perf_counter()
    rows: list[dict[str, Any]] = []

    def write() -> None:
        # after every configuration, so that a run cut short keeps what it measured
        names = {r["name"] for r in rows}
        kept = [done[c.name] for c in configs if c.name in done and c.name not in names]
        all_rows = sorted([*kept, *rows], key=lambda r: [c.name for c in configs].index(r["name"]))
        report = {"meta": meta, "summary": summarize(all_rows), "rows": all_rows}
        report["meta"]["seconds"] = round(time.perf_counter() - t_all, 1)
        json_path.write_text(json.dumps(report, indent=1) + "\n")
        md_path.write_text(render_markdown(report))

    for i, cfg in enumerate(configs):
        if cfg.name in done:
            print(f"[{i + 1:2d}/{len(configs)}] {cfg.name:45s} kept from {json_path.name}")
            continue
        trace_path = None
        if gpu_present and args.record_traces and cfg.trace:
            trace_path = out_dir / "traces" / f"{cfg.name}-{gpu}-{date}.json"
        row = run_config(
            cfg,
            gpu=gpu,
            alloc_conf=alloc_conf,
            measure_it=gpu_present,
            in_process=args.in_process,
            baseline=baseline,
            trace_path=trace_path,
            trace_meta={**trace_meta, "config": asdict(cfg)},
            workdir=workdir,
            timeout=args.timeout,
        )
        rows.append(row)
        write()
        err = row["errors"]
        est = row["estimate"] or {}
        print(
            f"[{i + 1:2d}/{len(configs)}] {cfg.name:45s} {'FAILED' if row['failed'] else 'ok':6s} "
            f"est alloc {_gib(est.get('peak_allocated_bytes'))} GiB "
            f"reserved {_gib(est.get('peak_reserved_bytes'))} GiB "
            f"(estimate {est.get('seconds', '-')} s)"
            + (
                f" | alloc err {_pct(err['allocated_rel'])}, reserved err "
                f"{_pct(err['reserved_rel'])}"
                if gpu_present
                else ""
            ),
            flush=True,
        )
    shutil.rmtree(workdir, ignore_errors=True)
    write()
    print(f"wrote {json_path} and {md_path}")
    if not gpu_present:
        print("estimate only: no GPU")
    final = json.loads(json_path.read_text())["rows"]
    return 1 if all(r["failed"] for r in final) else 0


if __name__ == "__main__":
    sys.exit(main())
