"""An accelerate config file (`accelerate config`'s YAML, or its JSON) read as the Workload fields
the launch decides, so that `memfit estimate --accelerate-config FILE` estimates what
`accelerate launch --config_file FILE` runs.

Read:
- `mixed_precision`: "no" -> fp32, "bf16" -> bf16-mixed, "fp16" -> fp16-mixed;
- `distributed_type` "NO" (one process) or "FSDP" with `fsdp_config.fsdp_version: 2`:
  `num_processes` (all machines' processes) -> `gpus`, `fsdp_offload_params` ->
  `fsdp_cpu_offload`, `fsdp_activation_checkpointing` -> checkpointing="blocks";
  FSDP2 shards each transformer block, then the root, as memfit does
  (`fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP`), and frees the gathered block after its
  forward (`fsdp_reshard_after_forward: true`); with bf16 or fp16 over several processes,
  accelerate's mixed precision (`fsdp_mixed="accelerate"`: `MixedPrecisionPolicy` with the
  16-bit dtype for parameters, reduction and output, and the forward under autocast);
- `distributed_type` "MULTI_GPU": DistributedDataParallel over `num_processes` GPUs -> `gpus`
  and `ddp` (memfit.estimator.ddp: each process the whole step plus the gradient buckets).

Refused, with the reason (BadInputError): fp8, DDP on other devices (MULTI_NPU, MULTI_XPU, ...),
DeepSpeed, FSDP1, FSDP2 without resharding or with another wrap policy, a dynamo backend,
tensor/context parallelism, `use_cpu`. Keys that do not change memory (machine rank, ports,
state-dict type, prefetch, ...) are read and left alone.

Example:
    >>> fields = read_accelerate_config("fsdp.yaml")
    >>> memfit.estimate("llama-2-7b", memfit.Workload(seq_len=2048, **fields))
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from memfit.errors import BadInputError

__all__ = ["read_accelerate_config"]

_PRECISION = {"no": "fp32", "bf16": "bf16-mixed", "fp16": "fp16-mixed"}
#: distributed_type values that mean several devices of one kind without sharding (DDP).
_DATA_PARALLEL = ("MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU",
                  "MULTI_HPU", "MULTI_CPU")  # fmt: skip


def _load(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise BadInputError(f"No accelerate config at {str(path)!r}.")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise BadInputError(
            f"{str(path)!r} cannot be read as text ({e}); give the YAML file "
            "`accelerate config` wrote (~/.cache/huggingface/accelerate/default_config.yaml)."
        ) from None
    yaml: Any = None
    try:
        if path.suffix != ".json":
            yaml = importlib.import_module("yaml")
    except ImportError as e:  # yaml comes with accelerate and transformers
        raise ImportError(
            "Reading a YAML accelerate config needs PyYAML (pip install pyyaml)."
        ) from e
    errors: tuple[type[Exception], ...] = (ValueError,)  # JSONDecodeError is a ValueError
    if yaml is not None:
        errors += (yaml.YAMLError,)
    try:
        data = json.loads(text) if yaml is None else yaml.safe_load(text)
    except errors as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadInputError(
            f"{str(path)!r} is not a readable accelerate config ({first}). Give the YAML "
            "file `accelerate config` wrote, or fix its syntax."
        ) from None
    if not isinstance(data, dict):
        raise BadInputError(
            f"{str(path)!r} holds {type(data).__name__}, not an accelerate config (a mapping "
            "with distributed_type, mixed_precision, num_processes, ...)."
        )
    return data


def _flag(where: str, key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise BadInputError(f"{where}: {key} is {value!r}; write true or false.")


def read_accelerate_config(path: str | Path) -> dict[str, Any]:
    """The Workload fields an accelerate config decides: `precision`, with FSDP `gpus`,
    `fsdp_mixed`, `fsdp_cpu_offload`, `checkpointing`, with DDP (MULTI_GPU) `gpus` and `ddp`.
    What memfit does not model raises BadInputError."""
    p = Path(path)
    cfg = _load(p)
    where = str(p)
    fields: dict[str, Any] = {}
    mp = str(cfg.get("mixed_precision", "no")).lower()
    if mp == "fp8":
        raise BadInputError(f"{where}: mixed_precision fp8 is not modelled. Use bf16 or fp16.")
    if mp not in _PRECISION:
        raise BadInputError(
            f"{where}: mixed_precision {mp!r} is not one of {', '.join(_PRECISION)}."
        )
    fields["precision"] = _PRECISION[mp]
    if _flag(where, "use_cpu", cfg.get("use_cpu", False)):
        raise BadInputError(f"{where}: use_cpu is true: the launch runs on the CPU, no GPU.")
    dynamo = (cfg.get("dynamo_config") or {}).get("dynamo_backend", "NO")
    if str(dynamo).upper() != "NO":
        raise BadInputError(
            f"{where}: dynamo_backend {dynamo!r} compiles the model; memfit estimates the eager "
            "step. Set dynamo_backend: 'NO' (the estimate bounds a compiled step from above)."
        )
    pc = cfg.get("parallelism_config") or {}
    for key in ("parallelism_config_tp_size", "parallelism_config_cp_size"):
        if int(pc.get(key, 1) or 1) > 1:
            raise BadInputError(f"{where}: {key} {pc[key]} (tensor/context parallelism) is "
                                "not modelled in training.")  # fmt: skip
    kind = str(cfg.get("distributed_type", "NO")).upper()
    n = int(cfg.get("num_processes", 1) or 1)
    if kind == "NO":
        if n != 1:
            raise BadInputError(f"{where}: distributed_type NO with num_processes {n}.")
        return fields
    if kind == "DEEPSPEED":
        raise BadInputError(f"{where}: DeepSpeed is not modelled. memfit models FSDP2 "
                            "(distributed_type: FSDP, fsdp_version: 2).")  # fmt: skip
    if kind == "MULTI_GPU":  # DistributedDataParallel over the processes
        if n < 2:
            raise BadInputError(f"{where}: distributed_type MULTI_GPU with num_processes {n}; "
                                "DDP needs 2 or more.")  # fmt: skip
        fields.update(gpus=n, ddp=True)
        return fields
    if kind in _DATA_PARALLEL:
        raise BadInputError(
            f"{where}: distributed_type {kind} (DDP on other devices than CUDA GPUs) is not "
            "modelled: memfit models CUDA's allocator, context and workspaces."
        )
    if kind != "FSDP":
        raise BadInputError(f"{where}: distributed_type {kind} is not modelled.")
    fsdp = cfg.get("fsdp_config") or {}
    version = int(fsdp.get("fsdp_version", 1))
    if version != 2:
        raise BadInputError(
            f"{where}: fsdp_version {version} (FSDP1, flat parameters) is not modelled; memfit "
            "models FSDP2 (fully_shard). Set fsdp_version: 2."
        )
    policy = str(fsdp.get("fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP")).upper()
    if policy != "TRANSFORMER_BASED_WRAP":
        raise BadInputError(
            f"{where}: fsdp_auto_wrap_policy {policy} is not modelled; memfit shards each "
            "repeated block, then the root (TRANSFORMER_BASED_WRAP)."
        )
    if not _flag(where, "fsdp_reshard_after_forward", fsdp.get("fsdp_reshard_after_forward", True)):
        raise BadInputError(
            f"{where}: fsdp_reshard_after_forward false (blocks kept gathered until backward) is "
            "not modelled; memfit models true."
        )
    fields["gpus"] = n
    if n > 1 and fields["precision"] != "fp32":  # accelerate's FSDP2 mixed precision
        fields["fsdp_mixed"] = "accelerate"
    if _flag(where, "fsdp_offload_params", fsdp.get("fsdp_offload_params", False)):
        fields["fsdp_cpu_offload"] = True
    if _flag(where, "fsdp_activation_checkpointing",
             fsdp.get("fsdp_activation_checkpointing", False)):  # fmt: skip
        fields["checkpointing"] = "blocks"
    return fields


#: Workload field -> (CLI flag, the config key that sets it), for conflict messages.
_SOURCES = {
    "precision": ("--precision", "mixed_precision"),
    "gpus": ("--gpus", "num_processes"),
    "ddp": ("--ddp", "distributed_type: MULTI_GPU"),
    "fsdp_cpu_offload": ("--fsdp-cpu-offload", "fsdp_config.fsdp_offload_params"),
    "checkpointing": ("--checkpointing", "fsdp_config.fsdp_activation_checkpointing"),
}


def merge_options(path: str | Path, options: dict[str, Any], given: set[str]) -> dict[str, Any]:
    """`memfit estimate`'s parsed workload options with the config's fields applied. An option
    given on the command line (`given`, by parameter name) that the config sets otherwise is
    an error naming both; one given with the same value is fine."""
    fields = read_accelerate_config(path)
    merged = dict(options)
    for name, value in fields.items():
        if name in given and options.get(name) != value:
            flag, key = _SOURCES[name]
            raise BadInputError(
                f"{flag} {options.get(name)!r} conflicts with {key} in {str(path)!r}, which "
                f"means {name}={value!r}. Drop {flag}, or change the config."
            )
        merged[name] = value
    return merged
