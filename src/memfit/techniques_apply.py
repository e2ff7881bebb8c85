"""How each technique changes a real model (the handlers of `memfit.apply_` call these).

The estimator's trace uses the same functions where the technique changes the model
(memfit.techniques_trace: checkpoint_blocks, tie_embeddings, default_lora_targets), so what is
estimated is what is applied.
"""

from __future__ import annotations

from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.techniques import (
    CheckpointConfig,
    EmbeddingOnCpuConfig,
    FSDPConfig,
    OptimizerConfig,
)
from memfit.workload import LoraConfig

_ON_CPU_MARK = "_memfit_embedding_on_cpu"


def tie_all_embeddings(model: torch.nn.Module) -> None:
    """Tie the output projection to the input embedding; for an encoder-decoder model, also
    make the decoder use the encoder's embedding. Marks the HF config as tied."""
    from memfit.techniques_trace import tie_embeddings

    tie_embeddings(model, type(model).__name__)
    get_enc = getattr(model, "get_encoder", None)
    get_dec = getattr(model, "get_decoder", None)
    if callable(get_enc) and callable(get_dec):
        enc, dec = get_enc(), get_dec()
        e = getattr(enc, "embed_tokens", None)
        d = getattr(dec, "embed_tokens", None)
        if isinstance(e, torch.nn.Embedding) and isinstance(d, torch.nn.Embedding):
            if e.weight.shape != d.weight.shape:
                raise BadInputError(
                    f"Cannot share the encoder and decoder embeddings of "
                    f"{type(model).__name__}: shapes {tuple(e.weight.shape)} and "
                    f"{tuple(d.weight.shape)} differ."
                )
            d.weight = e.weight
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "tie_word_embeddings"):
        config.tie_word_embeddings = True


def add_lora_in_place(model: torch.nn.Module, lora: LoraConfig) -> None:
    """LoRA adapters through peft, in place; the base model is frozen. A second call with the
    same rank is a no-op; another rank is an error (adapters would stack)."""
    try:
        from peft import LoraConfig as PeftLoraConfig
        from peft import inject_adapter_in_model
        from peft.tuners.lora import LoraLayer
    except ImportError as e:
        raise ImportError("LoRA uses peft: install it with `pip install memfit[lora]`.") from e
    from memfit.techniques_trace import default_lora_targets

    existing = [m for m in model.modules() if isinstance(m, LoraLayer)]
    if existing:
        ranks = {r for m in existing for r in m.r.values()}
        if ranks == {lora.rank}:
            return
        raise BadInputError(
            f"The model already has LoRA adapters of rank {sorted(ranks)}; adding rank "
            f"{lora.rank} would stack a second set. Start from the unadapted model."
        )
    targets = list(lora.targets) or default_lora_targets(model)
    names = [n for n, _ in model.named_modules()]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        raise BadInputError(
            f"LoRA target(s) {missing!r} match no module of {type(model).__name__}. "
            "Name modules from model.named_modules(), e.g. ('q_proj', 'v_proj')."
        )
    cfg = PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,  # type: ignore[arg-type]  # peft annotates int; floats work
        target_modules=targets,
        lora_dropout=0.0,
    )
    inject_adapter_in_model(cfg, model)


def checkpoint_model(model: torch.nn.Module, config: CheckpointConfig) -> int:
    """Wrap the chosen blocks in non-reentrant checkpointing; returns how many are wrapped
    (including ones wrapped by an earlier call)."""
    from memfit.techniques_trace import checkpoint_blocks
    from memfit.trace import find_repeated_blocks

    detected = find_repeated_blocks(model)
    if config.blocks is not None:
        blocks = list(config.blocks)
        names = dict(model.named_modules())
        unknown = [b for b in blocks if b not in names]
        if unknown:
            hint = (
                f"Its repeated blocks are {detected[0]} ... {detected[-1]}."
                if detected
                else "It has no stack of repeated blocks; name modules from model.named_modules()."
            )
            raise BadInputError(
                f"Checkpoint block(s) {unknown[:3]!r} do not exist in "
                f"{type(model).__name__} (a plan made for another architecture?). {hint}"
            )
    else:
        if not detected:
            raise BadInputError(
                f"{type(model).__name__} has no stack of repeated blocks (an nn.ModuleList or "
                "nn.Sequential of identical modules) to checkpoint. Name the modules: "
                "CheckpointConfig(blocks=('encoder.0', 'encoder.1'))."
            )
        blocks = detected
    if config.first is not None:
        if config.first > len(blocks):
            raise BadInputError(
                f"CheckpointConfig(first={config.first}) but the model has {len(blocks)} blocks."
            )
        blocks = blocks[: config.first]
    save_ops = config.save_ops if config.policy == "selective" else None
    checkpoint_blocks(model, blocks, save_ops=save_ops)
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "use_cache"):
        cfg.use_cache = False  # a KV cache is useless in training and defeats checkpointing
    return len(blocks)


def shard_model(model: torch.nn.Module, config: FSDPConfig, *, mesh: Any = None) -> None:
    """FSDP2 `fully_shard` on each repeated block, then on the root (once).

    `mesh` is the device mesh (default: FSDP2's, over the default process group); the
    estimator passes a CPU mesh over a fake process group.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise BadInputError(
            "FSDP needs an initialised process group: launch with `torchrun --nproc-per-node N "
            "train.py` and call torch.distributed.init_process_group() before apply_."
        )
    from torch.distributed.fsdp import FSDPModule, fully_shard

    from memfit.trace import find_repeated_blocks

    if isinstance(model, FSDPModule):
        return
    for path in find_repeated_blocks(model):
        block = model.get_submodule(path)
        if not isinstance(block, FSDPModule):
            fully_shard(block, mesh=mesh, reshard_after_forward=config.reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=config.reshard_after_forward)


def make_optimizer(model: torch.nn.Module, config: OptimizerConfig) -> torch.optim.Optimizer:
    """The optimizer over the trainable parameters (each once, tied ones included once)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise BadInputError(
            "No parameter of the model requires grad, so there is nothing to optimize. "
            "Unfreeze some parameters or add LoRA."
        )
    if config.offload:
        from memfit.offload import CpuOffloadOptimizer

        return CpuOffloadOptimizer(params, lambda ps: _optimizer(ps, config))
    return _optimizer(params, config)


def _optimizer(params: list[Any], config: OptimizerConfig) -> torch.optim.Optimizer:
    name, lr, wd = config.name, config.lr, config.weight_decay
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=wd)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=wd)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=wd)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=wd)
    if name == "adamw-fused":
        return torch.optim.AdamW(params, lr=lr, weight_decay=wd, fused=True)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=lr, weight_decay=wd)
    if name == "lion":
        from memfit.optimizers import Lion

        return Lion(params, lr=lr, weight_decay=wd)
    if name == "adamw-8bit":
        try:
            import bitsandbytes as bnb
        except ImportError as e:
            raise ImportError(
                "OptimizerConfig(name='adamw-8bit') uses bitsandbytes' AdamW8bit: install it "
                "with `pip install memfit[bnb]`, or choose 'adafactor' (also light on memory)."
            ) from e
        return bnb.optim.AdamW8bit(params, lr=lr, weight_decay=wd)
    raise BadInputError(f"Unknown optimizer {name!r}.")


def move_model(
    model: torch.nn.Module, device: torch.device, *, embedding: EmbeddingOnCpuConfig | None
) -> None:
    """Move the model to `device`, keeping the input embedding on the CPU if asked.

    Parameters keep their identity (tied weights stay tied): `.data` is moved.
    """
    emb = _embedding_module(model, embedding) if embedding is not None else None
    on_cpu = set(map(id, emb.modules())) if emb is not None else set()
    if emb is not None:
        from memfit.techniques_trace import shared_outside

        shared = shared_outside(model, emb)
        if shared is not None:
            raise BadInputError(tied_embedding_message(shared))
    for mod in model.modules():
        here = torch.device("cpu") if id(mod) in on_cpu else device
        for p in mod._parameters.values():
            if p is not None and p.device != here:
                p.data = p.data.to(here)
        for n, b in mod._buffers.items():
            if b is not None and b.device != here:
                mod._buffers[n] = b.to(here)
    if emb is not None and not getattr(emb, _ON_CPU_MARK, False):
        emb.register_forward_pre_hook(_inputs_to_cpu)
        emb.register_forward_hook(_output_to(device))
        setattr(emb, _ON_CPU_MARK, True)


def tied_embedding_message(shared: str) -> str:
    return (
        f"The input embedding's weight is also {shared} (tied embeddings): it cannot stay on "
        "the CPU while the output projection runs on the GPU. Untie them, or keep the "
        "embedding on the GPU."
    )


def _embedding_module(model: torch.nn.Module, cfg: EmbeddingOnCpuConfig) -> torch.nn.Module:
    if cfg.module is not None:
        try:
            return model.get_submodule(cfg.module)
        except AttributeError as e:
            raise BadInputError(
                f"EmbeddingOnCpuConfig(module={cfg.module!r}) is not a module of "
                f"{type(model).__name__}; name one from model.named_modules()."
            ) from e
    get_in = getattr(model, "get_input_embeddings", None)
    emb = get_in() if callable(get_in) else None
    if emb is None:
        raise BadInputError(
            f"{type(model).__name__} has no get_input_embeddings(); name the embedding: "
            "EmbeddingOnCpuConfig(module='embed')."
        )
    return emb


def _inputs_to_cpu(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.to("cpu") if isinstance(a, torch.Tensor) else a for a in args)


def _output_to(device: torch.device) -> Any:
    """A forward hook that moves the embedding's output to `device` (autograd moves the
    gradient back to the CPU table in backward)."""

    def hook(module: torch.nn.Module, args: Any, output: Any) -> Any:
        if isinstance(output, torch.Tensor):
            return output.to(device)
        return output

    return hook
