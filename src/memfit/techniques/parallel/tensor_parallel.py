"""Tensor parallelism for inference and generation (`Workload.tp`): the model's own plan, applied
by the installed transformers' own code, on fake tensors over memfit's fake process group.

What a user runs: `AutoModelForCausalLM.from_pretrained(..., distributed_config=
DistributedConfig(tp_size=N))` (or the older `tp_plan="auto"`) under `torchrun`, then `generate`.
transformers builds the model untied on the meta device, resolves its plan
(`PreTrainedModel._resolve_parallel_plans`), shards it with
`transformers.distributed.tensor_parallel.apply_tensor_parallelism`, loads each rank's shards and
ties the weights again. `parallelize_for_trace` runs those same two functions on memfit's fake
model, rank 0 of N (the fake backend's collectives allocate their outputs and move no data).

The plan is transformers': the model class's `_tp_plan`, the config's `base_model_tp_plan` and,
added by transformers itself (`init_parallel_plans`), the input embedding. For Llama:

| module | style | rank's share (placement) | forward under no_grad |
|---|---|---|---|
| `embed_tokens` | `embedding_rowwise` | vocabulary rows, Shard(0) | masked lookup, all-reduce |
| q/k/v, gate/up | `colwise` | output features, Shard(0) | local matmul, output sharded |
| o, down | `rowwise` | input features, Shard(1); bias replicated | local matmul, all-reduce |
| `lm_head` | `colwise_gather_output` | vocabulary rows, Shard(0) | local logits, all-gather |
| norms, rotary | not in the plan | replicated | as on one GPU |

Weights and the KV cache are therefore split as torch.distributed.tensor.parallel's
`ColwiseParallel` (weight Shard(0)) and `RowwiseParallel` (weight Shard(1), bias Replicate) split
them, the usual Llama plan (torchtitan's too); an uneven split gives rank 0 the larger part, as
`torch.chunk` does, and rank 0 is the one reported. Each rank caches `num_key_value_heads / N`
heads. memfit does not run torch's `parallelize_module` itself: transformers 5 no longer uses it,
and its styles run every linear as a DTensor op, whose temporaries a transformers user does not
get (transformers' styles run plain local kernels in inference).

Not modelled: quantized weights under tensor parallelism (transformers hands them to the
quantizer's own local path), models whose config has no tensor-parallel plan, a transformers
without `transformers.distributed.tensor_parallel` (each is refused with the fix).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.workload import Workload


def tp_plan_of(model: torch.nn.Module, size: int) -> dict[str, str]:
    """The plan transformers shards `model` with over `size` ranks: one entry per parameter and
    module name (layer numbers written out), as `_resolve_parallel_plans` returns it."""
    _installed_api()
    from transformers.distributed.configuration_utils import DistributedConfig

    resolve = getattr(model, "_resolve_parallel_plans", None)
    name = type(model).__name__
    if resolve is None or not getattr(model, "tp_plan", None):
        raise BadInputError(
            f"tp={size}: {name} has no tensor-parallel plan in transformers (its config's "
            "base_model_tp_plan is empty, or it is not a transformers model), so transformers "
            "cannot shard it. Use tp=1, or a model whose config has a base_model_tp_plan "
            "(Llama, Mistral, Qwen2, Gemma, ...)."
        )
    plan, _, _ = resolve(DistributedConfig(tp_size=size))
    return dict(plan)


def check_heads(config: Any, size: int) -> None:
    """Each rank must hold whole heads: `size` divides the KV heads (and so the query heads,
    a multiple of them), as memfit.estimator.generation.kv_cache.check_tp says for catalog
    models."""
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    for field, what in (("num_key_value_heads", "KV heads"), ("num_attention_heads", "heads")):
        heads = getattr(config, field, None)
        if heads and int(heads) % size:
            divisors = [d for d in range(1, int(heads) + 1) if int(heads) % d == 0]
            raise BadInputError(
                f"tp={size} does not divide the model's {heads} {what} ({field}): tensor "
                f"parallelism gives each GPU whole heads. Use tp in {divisors}."
            )


def parallelize_for_trace(model: torch.nn.Module, w: Workload, mesh: Any, fake_mode: Any) -> str:
    """Shard the fake `model` in place with its transformers plan over `mesh` (rank 0 of
    `w.tp`), as `from_pretrained(distributed_config=DistributedConfig(tp_size=w.tp))` leaves it;
    returns a note for the estimate saying how.

    Tied weights (a tied `lm_head`) are sharded once and tied again afterwards, as
    `from_pretrained` builds untied, shards, and then calls `tie_weights`.
    """
    size = w.tp
    check_tensor_parallel(size, w.quantize)
    config = getattr(model, "config", None)
    if config is not None:
        check_heads(config, size)
    plan = tp_plan_of(model, size)
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism

    first: dict[int, str] = {}  # id(parameter) -> its first name
    ties: list[tuple[str, str]] = []  # (a later name of a tied parameter, the first name)
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            ties.append((name, first[id(p)]))
        else:
            first[id(p)] = name
    tied = {name for name, _ in ties}
    with fake_mode:
        apply_tensor_parallelism(model, mesh, {k: v for k, v in plan.items() if k not in tied})
    for name, source in ties:
        module, _, attr = name.rpartition(".")
        model.get_submodule(module)._parameters[attr] = model.get_parameter(source)
    module_names = {n for n, _ in model.named_modules()}
    by_style: dict[str, list[str]] = {}
    for name in (n for n in plan if n in module_names):  # in the model's order
        short = name.rpartition(".")[2]
        if short not in by_style.setdefault(plan[name], []):
            by_style[plan[name]].append(short)
    said = "; ".join(f"{', '.join(names)} {style}" for style, names in by_style.items())
    return (
        f"tensor parallel over {size} GPUs, one rank (rank 0) reported: transformers' plan "
        f"shards {said}; the rest is replicated."
    )


@contextlib.contextmanager
def real_waits() -> Iterator[None]:
    """During a trace over the fake process group: a functional collective's `wait_tensor`
    returns its input, as the real kernel does once the collective is done (the fake kernel
    makes a new tensor, a copy of every DTensor redistribution's output that no GPU allocates).
    DTensor's collectives (the embedding's all-reduce, the head's all-gather) all wait through
    `torch.distributed._functional_collectives.wait_tensor`."""
    import torch.distributed._functional_collectives as funcol

    original = funcol.wait_tensor
    funcol.wait_tensor = lambda tensor: tensor
    try:
        yield
    finally:
        funcol.wait_tensor = original


def check_tensor_parallel(tp: int, quantize: str | None) -> None:
    """What `tp` ranks cannot be traced with, refused before tracing with the fix."""
    if tp > 1 and quantize is not None:
        raise BadInputError(
            f"quantize={quantize!r} with tp={tp}: memfit does not model quantized weights under "
            "tensor parallelism (transformers hands them to the quantization library's own "
            "local path). Use tp=1 with quantize, or drop quantize."
        )
    if tp > 1:
        _installed_api()


def _installed_api() -> None:
    try:
        from transformers.distributed.tensor_parallel import (  # noqa: F401
            apply_tensor_parallelism,
        )
    except ImportError as e:
        import transformers

        raise BadInputError(
            "tensor parallelism traces transformers' own sharding "
            "(transformers.distributed.tensor_parallel.apply_tensor_parallelism), which the "
            f"installed transformers {transformers.__version__} does not have ({e}). Upgrade "
            "transformers (pip install -U transformers), or use tp=1."
        ) from e
