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
from memfit.workload import Workload

_BNB_OTHER = "bitsandbytes' {} has no memfit layout"

#: `optim` name -> (memfit optimizer, or None when not modelled; what transformers builds / why).
OPTIM_LAYOUTS: dict[str, tuple[str | None, str]] = {
    "adamw_torch": ("adamw", "torch.optim.AdamW (foreach on CUDA)"),
    "adamw_torch_fused": ("adamw-fused", "torch.optim.AdamW(fused=True)"),
    "adamw_torch_xla": (None, "torch_xla's syncfree AdamW: XLA devices are not modelled"),
    "adamw_torch_npu_fused": (None, "torch_npu's NpuFusedAdamW: NPUs are not modelled"),
    "adafactor": (
        "adafactor",
        "transformers.optimization.Adafactor: factored second moments of the same sizes as "
        "torch.optim.Adafactor's, which memfit lays out (its update temporaries are torch's)",
    ),
    "adamw_anyprecision": (None, "torchdistx's AnyPrecisionAdamW (state dtypes vary)"),
    "adamw_torch_4bit": (None, "torchao's 4-bit AdamW"),
    "adamw_torch_8bit": (
        None,
        "torchao's 8-bit AdamW (its block layout differs from bitsandbytes')",
    ),
    "ademamix": (None, _BNB_OTHER.format("AdEMAMix (three states)")),
    "sgd": ("sgd", "torch.optim.SGD; with optim_args momentum > 0: 'sgd-momentum'"),
    "adagrad": (None, "torch.optim.Adagrad"),
    "adamw_bnb_8bit": ("adamw-8bit", "bitsandbytes AdamW(optim_bits=8)"),
    "adamw_8bit": ("adamw-8bit", "bitsandbytes AdamW(optim_bits=8), as adamw_bnb_8bit"),
    "ademamix_8bit": (None, _BNB_OTHER.format("8-bit AdEMAMix")),
    "lion_8bit": (None, _BNB_OTHER.format("8-bit Lion")),
    "lion_32bit": ("lion", "bitsandbytes Lion(optim_bits=32): one fp32 momentum"),
    "paged_adamw_32bit": ("paged-adamw", "bitsandbytes AdamW(is_paged=True)"),
    "paged_adamw_8bit": ("paged-adamw-8bit", "bitsandbytes AdamW(optim_bits=8, is_paged=True)"),
    "paged_ademamix_32bit": (None, _BNB_OTHER.format("paged AdEMAMix")),
    "paged_ademamix_8bit": (None, _BNB_OTHER.format("paged 8-bit AdEMAMix")),
    "paged_lion_32bit": (None, _BNB_OTHER.format("paged Lion")),
    "paged_lion_8bit": (None, _BNB_OTHER.format("paged 8-bit Lion")),
    "rmsprop": (None, "torch.optim.RMSprop"),
    "rmsprop_bnb": (None, _BNB_OTHER.format("RMSprop")),
    "rmsprop_bnb_8bit": (None, _BNB_OTHER.format("8-bit RMSprop")),
    "rmsprop_bnb_32bit": (None, _BNB_OTHER.format("32-bit RMSprop")),
    "galore_adamw": (None, "GaLore's low-rank projected AdamW"),
    "galore_adamw_8bit": (None, "GaLore's low-rank projected 8-bit AdamW"),
    "galore_adafactor": (None, "GaLore's low-rank projected Adafactor"),
    "galore_adamw_layerwise": (None, "GaLore, layer-wise (steps in backward)"),
    "galore_adamw_8bit_layerwise": (None, "GaLore 8-bit, layer-wise (steps in backward)"),
    "galore_adafactor_layerwise": (None, "GaLore Adafactor, layer-wise (steps in backward)"),
    "lomo": (None, "LOMO (fused update in backward, its own loop)"),
    "adalomo": (None, "AdaLomo (fused update in backward, its own loop)"),
    "grokadamw": (None, "grokadamw's GrokAdamW"),
    "schedule_free_radam": (None, "schedulefree's RAdam"),
    "schedule_free_adamw": (None, "schedulefree's AdamW (an extra state z)"),
    "schedule_free_sgd": (None, "schedulefree's SGD"),
    "apollo_adamw": (None, "APOLLO's low-rank AdamW"),
    "apollo_adamw_layerwise": (None, "APOLLO, layer-wise"),
    "stable_adamw": (None, "StableAdamW"),
}

#: memfit optimizer -> the `optim` name (and `optim_args`) that builds it.
_OPTIM_OF = {
    "adamw": ("adamw_torch", None),
    "adam": ("adamw_torch", None),  # weight_decay=0.0 (the default) is Adam: the same state
    "adamw-fused": ("adamw_torch_fused", None),
    "sgd": ("sgd", None),
    "sgd-momentum": ("sgd", "momentum=0.9"),
    "adafactor": ("adafactor", None),
    "adamw-8bit": ("adamw_bnb_8bit", None),
    "paged-adamw": ("paged_adamw_32bit", None),
    "paged-adamw-8bit": ("paged_adamw_8bit", None),
    "lion": ("lion_32bit", None),
}


def _checkpointing_field(args: Any) -> str:
    """`activation_checkpointing` from transformers 5.23, earlier `gradient_checkpointing`
    (memfit._compat.checkpointing_training_argument); read from the arguments themselves, so a
    subclass that adds the field is read too."""
    if hasattr(args, "activation_checkpointing"):
        return "activation_checkpointing"
    return "gradient_checkpointing"


def _optim_value(args: Any) -> str:
    optim = getattr(args, "optim", "adamw_torch")
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
    if name != "adamw" and _optim_value(args) == "adamw_torch" and optimizer is not None:
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
    mixed = {"fp32": (False, False), "bf16-mixed": (True, False), "fp16-mixed": (False, True)}
    if w.precision in mixed:
        bf16, fp16 = mixed[w.precision]
        put("bf16", bf16)
        put("fp16", fp16)
    else:
        other.append(
            f"load the model in {w.compute_dtype_name} (precision {w.precision}: weights, "
            "gradients and optimizer state in 16 bits), with bf16=False and fp16=False"
        )
    if w.optimizer in _OPTIM_OF:
        optim, optim_args = _OPTIM_OF[w.optimizer]
        if _optim_value(args) != optim:
            changes["optim"] = optim
        if optim_args is not None:
            put("optim_args", optim_args)
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
    if w.optimizer not in _OPTIM_OF:
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
