"""LoRA adapters through peft on the linear layers of the repeated blocks (or named targets);
the base model is frozen. `LoraConfig` itself lives in `memfit.workload` (a Workload field).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.models.structure import default_lora_targets
from memfit.techniques.registry import Build, handler
from memfit.workload import LoraConfig


def add_lora_for_trace(model: torch.nn.Module, lora: LoraConfig, name: str) -> Any:
    """The peft model with adapters (get_peft_model), as the estimate traces it."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        raise ImportError(
            "LoRA estimates use peft: install it with `pip install memfit[lora]`."
        ) from e
    targets = list(lora.targets) or default_lora_targets(model)
    present = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [t for t in targets if t not in present and not any(
        n.endswith("." + t) for n, _ in model.named_modules())]  # fmt: skip
    if missing:
        linear = sorted(
            {
                n.rsplit(".", 1)[-1]
                for n, m in model.named_modules()
                if n and not any(True for _ in m.children()) and hasattr(m, "weight")
            }
        )
        raise BadInputError(
            f"LoRA target(s) {', '.join(repr(m) for m in missing)} match no module of "
            f"{name!r}. Its layers with weights are named: {', '.join(linear)}."
        )
    cfg = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,  # type: ignore[arg-type]  # peft annotates int; floats work
        target_modules=targets,
        lora_dropout=0.0,
    )
    with warnings.catch_warnings():
        # peft 0.21 reads `model.is_gradient_checkpointing`, which transformers 5.23 deprecated
        # (FutureWarning); the estimate's own call should not print it to the user.
        warnings.filterwarnings(
            "ignore", message=".*is_gradient_checkpointing", category=FutureWarning
        )
        return get_peft_model(model, cfg)


def add_lora_in_place(model: torch.nn.Module, lora: LoraConfig) -> None:
    """LoRA adapters through peft, in place; the base model is frozen. A second call with the
    same rank is a no-op; another rank is an error (adapters would stack)."""
    try:
        from peft import LoraConfig as PeftLoraConfig
        from peft import inject_adapter_in_model
        from peft.tuners.lora import LoraLayer
    except ImportError as e:
        raise ImportError("LoRA uses peft: install it with `pip install memfit[lora]`.") from e
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


@handler
def _lora(config: LoraConfig, build: Build) -> None:
    add_lora_in_place(build.model, config)
    build.applied.append(config.label)
