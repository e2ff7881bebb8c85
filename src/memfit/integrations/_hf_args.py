"""transformers' `TrainingArguments` read as a memfit `Workload`, and a memfit plan written back as
`TrainingArguments` changes.

`OPTIM_LAYOUTS` maps every `optim` name of transformers' `OptimizerNames` (5.x) to the memfit
optimizer layout that holds the same state, or to None with the reason memfit does not model it;
docs/integrations.md prints the table, and a test checks that it covers the installed
transformers. The callback reads the optimizer *instance* the Trainer built
(`memfit.integrations._reading.optimizer_layout`), so a user's own optimizer is read as well;
the table is what `training_arguments_for` writes, and documents the mapping.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.integrations._reading import (
    BatchTemplate,
    checkpointing_of,
    ddp_setting_note,
    meta_copy,
    model_notes,
    optimizer_layout,
    precision_of,
    spec_of_run,
    strip_hf_checkpointing,
)
from memfit.integrations._session import RunReading
from memfit.models.structure import find_repeated_blocks
from memfit.optimizers import (
    DEFAULT_OPTIMIZER,
    NO_OPTIMIZER,
    SPECS,
    hf_optim_of,
    spec_of,
    spec_of_hf_optim,
)
from memfit.workload import Workload

_BNB_OTHER = "bitsandbytes' {} has no memfit layout"

#: `optim` names memfit does not model, with the reason.
_NOT_MODELLED: dict[str, str] = {
    "adamw_torch_xla": "torch_xla's syncfree AdamW: XLA devices are not modelled",
    "adamw_torch_npu_fused": "torch_npu's NpuFusedAdamW: NPUs are not modelled",
    "adamw_anyprecision": "torchdistx's AnyPrecisionAdamW (state dtypes vary)",
    "rmsprop_bnb": _BNB_OTHER.format("RMSprop"),
    "rmsprop_bnb_8bit": _BNB_OTHER.format("8-bit RMSprop"),
    "rmsprop_bnb_32bit": _BNB_OTHER.format("32-bit RMSprop"),
    "galore_adamw": "GaLore's low-rank projected AdamW (its projection matrices' ranks and "
    "update intervals are per-layer settings memfit does not read)",
    "galore_adamw_8bit": "GaLore's low-rank projected 8-bit AdamW",
    "galore_adafactor": "GaLore's low-rank projected Adafactor",
    "galore_adamw_layerwise": "GaLore, layer-wise (steps in backward)",
    "galore_adamw_8bit_layerwise": "GaLore 8-bit, layer-wise (steps in backward)",
    "galore_adafactor_layerwise": "GaLore Adafactor, layer-wise (steps in backward)",
    "lomo": "LOMO (fused update in backward, its own loop)",
    "adalomo": "AdaLomo (fused update in backward, its own loop)",
    "grokadamw": "grokadamw's GrokAdamW",
    "schedule_free_radam": "schedulefree's RAdam",
    "schedule_free_sgd": "schedulefree's SGD",
    "apollo_adamw": "APOLLO's low-rank AdamW",
    "apollo_adamw_layerwise": "APOLLO, layer-wise",
    "stable_adamw": "StableAdamW",
}


def _optim_layouts() -> dict[str, tuple[str | None, str]]:
    """`optim` name -> (memfit optimizer, or None; what transformers builds / why not): the
    optimizer table's `hf_optim` names, then the ones memfit does not model."""
    out: dict[str, tuple[str | None, str]] = {}
    for spec in SPECS.values():
        for optim in spec.hf_optim:
            built = spec_of_hf_optim(optim)
            if built is None or optim in out:
                continue
            others = [
                f"with optim_args {s.hf_optim_args}: {s.name!r}"
                for s in SPECS.values()
                if optim in s.hf_optim and s.hf_optim_args is not None
            ]
            out[optim] = (built.name, "; ".join([built.hf_builds or built.title, *others]))
    return {**out, **{k: (None, why) for k, why in _NOT_MODELLED.items()}}


#: `optim` name -> (memfit optimizer, or None when not modelled; what transformers builds / why).
OPTIM_LAYOUTS: dict[str, tuple[str | None, str]] = _optim_layouts()


def _checkpointing_field(args: Any) -> str:
    """`activation_checkpointing` from transformers 5.23, earlier `gradient_checkpointing`
    (memfit._compat.checkpointing_training_argument); read from the arguments themselves, so a
    subclass that adds the field is read too."""
    if hasattr(args, "activation_checkpointing"):
        return "activation_checkpointing"
    return "gradient_checkpointing"


def _optim_value(args: Any) -> str:
    optim = getattr(args, "optim", hf_optim_of(DEFAULT_OPTIMIZER)[0])
    return str(getattr(optim, "value", optim))


def _fsdp_fields(args: Any, world: int) -> dict[str, Any]:
    """The Workload fields of the Trainer's FSDP settings (`fsdp`, `fsdp_config`, normalized by
    TrainingArguments: keys without their `fsdp_` prefix, legacy strings turned into keys) for
    FSDP2 over `world` processes: accelerate's mixed precision with bf16/fp16, `cpu_offload`
    and FSDP's `activation_checkpointing`. What memfit does not model raises BadInputError."""
    cfg = dict(getattr(args, "fsdp_config", None) or {})
    why = ""
    if cfg.get("xla"):
        why = "runs XLA's FSDP (fsdp_config xla=True); memfit models CUDA GPUs"
    elif int(cfg.get("version", 2)) != 2:
        why = (f"runs FSDP1 (fsdp_config version {cfg.get('version')}, flat parameters); "
               "memfit models FSDP2 (fully_shard). Set fsdp_config={'version': 2}")  # fmt: skip
    elif str(cfg.get("auto_wrap_policy", "TRANSFORMER_BASED_WRAP")) != "TRANSFORMER_BASED_WRAP":
        why = (f"wraps with {cfg['auto_wrap_policy']}; memfit shards each repeated block, then "
               "the root (TRANSFORMER_BASED_WRAP)")  # fmt: skip
    elif str(cfg.get("reshard_after_forward", True)).lower() != "true":
        why = ("keeps the gathered blocks until backward (reshard_after_forward False, "
               "shard_grad_op); memfit models full_shard")  # fmt: skip
    elif world < 2:
        why = (
            "runs FSDP in one process; memfit models FSDP2 over several GPUs. Estimate "
            "the launch's process count with memfit.estimate(model, Workload(gpus=N))"
        )
    if why:
        raise BadInputError(f"The Trainer {why}.")
    fields: dict[str, Any] = {}
    if args.bf16 or args.fp16:  # accelerate: MixedPrecisionPolicy in 16 bits, and autocast
        fields["fsdp_mixed"] = "accelerate"
    if str(cfg.get("cpu_offload", False)).lower() == "true":
        fields["fsdp_cpu_offload"] = True
    if str(cfg.get("activation_checkpointing", False)).lower() == "true":
        fields["checkpointing"] = "blocks"
    return fields


def read_run(args: Any, model: torch.nn.Module, optimizer: Any, batch: Any,
             unsharded: torch.nn.Module | None = None) -> RunReading:  # fmt: skip
    """The Workload and ModelSpec of a Trainer run: `model` as the Trainer prepared it, `args`,
    the optimizer it built and its first batch. Raises BadInputError for what memfit does not
    model (DeepSpeed, FSDP1, an optimizer without a layout, ...). Several processes are DDP
    (`Workload(gpus=world_size, ddp=True)`), or FSDP2 with `args.fsdp`: the Trainer shards the
    model before training begins, so `unsharded` is the callback's meta copy of it from
    `on_init_end`, which the estimate reads instead."""
    if getattr(args, "deepspeed", None):
        raise BadInputError(
            "The Trainer runs DeepSpeed, which memfit does not model. Estimate the sharded run "
            "with FSDP2: memfit.estimate(model, Workload(gpus=N)) or `memfit estimate MODEL "
            "--accelerate-config FILE`."
        )
    world = int(getattr(args, "world_size", 1) or 1)
    notes: list[str] = []
    sharded = bool(getattr(args, "fsdp", None))
    fsdp = _fsdp_fields(args, world) if sharded else {}
    source = unsharded if sharded and unsharded is not None else model
    if world > 1 and not sharded:  # the Trainer wraps the model in DistributedDataParallel
        for key, default in (("ddp_bucket_cap_mb", None), ("ddp_find_unused_parameters", None)):
            if getattr(args, key, default) not in (default, False):
                notes.append(ddp_setting_note(f"{key}={getattr(args, key)!r}"))
    wrapped = (getattr(args, "fsdp_config", None) or {}).get("transformer_layer_cls_to_wrap")
    if sharded and wrapped:
        blocks = {type(source.get_submodule(b)).__name__ for b in find_repeated_blocks(source)}
        if set(wrapped) != blocks:
            raise BadInputError(
                f"fsdp_config transformer_layer_cls_to_wrap={list(wrapped)!r}: memfit shards "
                f"the model's repeated blocks ({', '.join(sorted(blocks)) or 'none found'}), "
                "then the root. Name those, or leave it out (accelerate then wraps them)."
            )
    template = BatchTemplate.of(batch)
    autocast = "bfloat16" if args.bf16 else "float16" if args.fp16 else None
    who = "TrainingArguments(bf16=True)" if args.bf16 else "TrainingArguments(fp16=True)"
    precision = precision_of(source, autocast, who=who)
    checkpointing, first, ckpt_notes = checkpointing_of(model)  # flags set as training begins
    notes += ckpt_notes + model_notes(source)
    if getattr(args, "torch_compile", False):
        notes.append("torch_compile=True: memfit estimates the eager step (compiled kernels "
                     "fuse temporaries; the estimate is an upper bound for them).")  # fmt: skip
    name = optimizer_layout(optimizer)
    default_optim = hf_optim_of(DEFAULT_OPTIMIZER)[0]
    if name != DEFAULT_OPTIMIZER and _optim_value(args) == default_optim and optimizer is not None:
        notes.append(f"optimizer read from the Trainer's instance: {name}")
    if fsdp.pop("checkpointing", None):  # FSDP's own activation checkpointing: every block
        if checkpointing == "blocks":
            notes.append("activation checkpointing is on both in fsdp_config and in "
                         "TrainingArguments: memfit checkpoints each block once.")  # fmt: skip
        checkpointing, first = "blocks", None
    workload = Workload(
        batch_size=template.batch_size,
        seq_len=template.seq_len,
        precision=precision,
        optimizer=name,
        grad_accum=int(args.gradient_accumulation_steps),
        checkpointing=checkpointing,
        checkpoint_first=first,
        gpus=world,
        ddp=world > 1 and not sharded,
        **fsdp,
    )
    spec = spec_of_run(source, template, build=lambda: strip_hf_checkpointing(meta_copy(source)))
    return RunReading(spec=spec, workload=workload, notes=tuple(notes))


def argument_changes(w: Workload, args: Any) -> tuple[dict[str, Any], list[str], list[str]]:
    """(changes, notes, missing): the `TrainingArguments` changes that make `args` run workload
    `w`, what to know about them (said in words), and the parts of `w` that no
    TrainingArguments field expresses (said in words)."""
    changes: dict[str, Any] = {}
    notes: list[str] = []
    other: list[str] = []

    def put(key: str, value: Any) -> None:
        if getattr(args, key, None) != value:
            changes[key] = value

    put("per_device_train_batch_size", w.batch_size)
    put("gradient_accumulation_steps", w.grad_accum)
    recipe = w.recipe
    if not recipe.pure:  # fp32 or autocast: TrainingArguments' bf16 / fp16 flags say which
        put("bf16", recipe.mixed and recipe.bf16)
        put("fp16", recipe.mixed and recipe.fp16)
    else:
        other.append(
            f"load the model in {w.compute_dtype_name} (precision {w.precision}: weights, "
            "gradients and optimizer state in 16 bits), with bf16=False and fp16=False"
        )
    if w.optimizer != NO_OPTIMIZER and spec_of(w.optimizer).hf_optim:
        optim, optim_args = hf_optim_of(w.optimizer)
        if _optim_value(args) != optim:
            changes["optim"] = optim
        if optim_args is not None:
            put("optim_args", optim_args)
    elif w.optimizer != NO_OPTIMIZER:
        other.append(f"the optimizer {w.optimizer} (no TrainingArguments optim builds it)")
    ckpt = _checkpointing_field(args)
    put(ckpt, w.checkpointing == "blocks")
    if w.checkpoint_first is not None:
        notes.append(
            f"memfit's plan checkpoints the first {w.checkpoint_first} blocks; {ckpt}=True "
            "checkpoints every block (less memory, more recomputation)"
        )
    if not w.fsdp and getattr(args, "fsdp", None):  # DDP (or one GPU) instead of FSDP
        changes["fsdp"] = False
    if w.fsdp:
        put("fsdp", True)
        config = {"version": 2, "cpu_offload": w.fsdp_cpu_offload}
        now = {k: (getattr(args, "fsdp_config", None) or {}).get(k) for k in config}
        if not getattr(args, "fsdp", None) or now != config:
            changes["fsdp_config"] = {**(getattr(args, "fsdp_config", None) or {}), **config}
    if w.gpus > 1:
        notes.append(f"launch {w.gpus} processes (accelerate launch --num_processes {w.gpus})")
    if w.lora is not None:
        other.append(f"train LoRA adapters of rank {w.lora.rank} (peft.get_peft_model)")
    for flag, words in (
        ("quantize", "a quantized base ({})"),
        ("offload_optimizer", "the optimizer state on the CPU"),
        ("embedding_on_cpu", "the input embedding on the CPU"),
        ("tie_embeddings", "tied input and output embeddings"),
        ("optimizer_in_backward", "the optimizer step in backward"),
        ("offload_activations", "saved activations offloaded to the CPU ({})"),
        ("chunked_loss", "a cross-entropy over {} chunks"),
    ):
        value = getattr(w, flag)
        if value:
            other.append(words.format(value) + " (memfit.apply_ sets it up)")
    return changes, notes, other


def training_arguments_for(plan: Any, args: Any) -> Any:
    """A copy of `args` with `plan`'s recommended configuration applied (`memfit.plan`'s Plan,
    or a Workload); `args` itself is not changed.

    A configuration that TrainingArguments cannot express (a pure 16-bit model, LoRA, the
    optimizer on the CPU, ...) raises BadInputError naming it.

    Example:
        >>> p = memfit.plan(model, gpu="rtx-4090", goal=memfit.Goal(global_batch=32, seq_len=1024))
        >>> args = training_arguments_for(p, args)
    """
    best = getattr(plan, "best", None)
    w = plan if isinstance(plan, Workload) else getattr(best, "workload", None)
    if w is None:
        why = " with no configuration that fits" if hasattr(plan, "best") else ""
        raise BadInputError(
            "training_arguments_for needs a memfit Plan with a recommendation (or a Workload), "
            f"got {type(plan).__name__}{why}."
        )
    if w.optimizer == NO_OPTIMIZER or not spec_of(w.optimizer).hf_optim:
        raise BadInputError(f"optimizer {w.optimizer!r} has no TrainingArguments optim name.")
    changes, _notes, other = argument_changes(w, args)
    if other:
        raise BadInputError(
            "TrainingArguments cannot express: " + "; ".join(other) + ". Apply the plan with "
            "memfit.apply_, or plan with memfit.plan(..., forbid=...) to leave them out."
        )
    return dataclasses.replace(args, **changes)


def current_arguments(args: Any) -> dict[str, Any]:
    """The TrainingArguments fields `argument_changes` may change, as they are now."""
    keys = ("per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16",
            "optim_args", _checkpointing_field(args), "fsdp", "fsdp_config")  # fmt: skip
    now = {k: getattr(args, k, None) for k in keys}
    now["optim"] = _optim_value(args)
    return now
