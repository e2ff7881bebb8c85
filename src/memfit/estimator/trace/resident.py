"""What a training step certainly holds on its GPU, read from the model without a trace.

The weights (parameters and buffers) are alive from the first to the last event of a step,
and when the optimizer steps after the backward, every gradient is alive beside them: the
device memory of the step is at least their sum, whatever the micro-batch, the checkpointing
or the optimizer (its state, the activations and the allocator's rounding only add to it).
The planner (memfit.planner.search) rules out a configuration whose floor alone exceeds the
GPU without tracing it: a 7B model with fp32 master weights on a 24 GB card.

The model is the one the trace would run (`step_runner._traced_model`: precision, LoRA, tied
embeddings), built with `TRACED_BLOCKS` blocks on fake tensors (about 10 ms), its middle
block counted as often as the replay copies it (memfit.estimator.trace.block_replay). Which
parameters
receive a gradient is not read from the model (one a forward never reaches gets none); it is
taken from a real trace of the same model whose parameters train alike (`got_gradient`), and
without one the floor is the weights alone. No floor (None) where the step does not keep
whole weights and gradients on the device: FSDP2 shards them, a quantized base or a teacher
is not counted, the step in backward frees each gradient as it lands.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch._subclasses.fake_tensor import FakeTensorMode

from memfit.estimator.estimation import replayable_blocks
from memfit.estimator.trace.block_replay import TRACED_BLOCKS
from memfit.estimator.trace.step_runner import DTYPES, Trace, _traced_model
from memfit.estimator.trace.tracker import parameter_modules
from memfit.models.sources import ModelSpec
from memfit.models.structure import input_embedding_path
from memfit.workload import Workload


def got_gradient(tr: Trace) -> list[bool] | None:
    """Per trainable parameter of a `TRACED_BLOCKS`-block trace (in the model's order),
    whether it received a gradient in every step; None for a trace without them."""
    if not tr.grad_sids or len(tr.block_paths) != TRACED_BLOCKS:
        return None
    steps = list(tr.grad_sids.values())
    return [all(s[i] is not None for s in steps) for i in range(len(steps[0]))]


def resident_floor_bytes(
    spec: ModelSpec,
    w: Workload,
    got: Sequence[bool] | None,
    *,
    embedding_movable: bool,
    every_gradient: bool = False,
) -> int | None:
    """The bytes `w`'s step holds on the GPU at once, at least (see the module docstring):
    the weights, and the gradients of the parameters `got` says receive one (with
    `every_gradient`, of every trainable parameter: the highest floor any `got` gives). With
    `embedding_movable`, the input embedding's weights and gradients are left out (the
    embedding may be placed on the CPU; a tied one too, though its weight stays: a floor may
    be low, never high). None where no floor is known."""
    n = replayable_blocks(spec, w)
    if n is None or not w.training or w.fsdp or w.quantize or w.optimizer_in_backward:
        return None
    if w.teacher is not None:
        return None
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    low = DTYPES[w.compute_dtype_name]
    model, blocks, _ = _traced_model(spec, w, TRACED_BLOCKS, fake_mode, low, None)
    if len(blocks) != TRACED_BLOCKS:
        return None
    module_of = parameter_modules(model)
    embedding = input_embedding_path(model) if embedding_movable else None
    # On the CPU with the embedding, whichever module a tied one is filed under.
    moved = {id(p) for p in model.get_submodule(embedding).parameters()} if embedding else set()

    def copies(path: str) -> int:
        """How often the replay holds what `path` holds: blocks 1 .. n-2 are block 1's copies."""
        middle = blocks[1]
        return n - 2 if path == middle or path.startswith(middle + ".") else 1

    # Each storage once, at its size, as the tracker registers weights (a view shares one).
    params = list(dict.fromkeys(model.parameters()))
    weights = [(p, module_of.get(id(p), "")) for p in params if id(p) not in moved] + [
        (b, name.rsplit(".", 1)[0] if "." in name else "") for name, b in model.named_buffers()
    ]
    held: dict[int, int] = {}
    for t, where in weights:
        storage = t.untyped_storage()
        held.setdefault(storage._cdata, copies(where) * storage.nbytes())
    total = sum(held.values())
    trainable = [p for p in params if p.requires_grad]
    if every_gradient:
        got = [True] * len(trainable)
    if got is not None and len(got) == len(trainable):
        # A gradient is a tensor of its parameter's shape and dtype, a storage of its own.
        total += sum(
            copies(module_of.get(id(p), "")) * p.numel() * p.element_size()
            for p, g in zip(trainable, got, strict=True)
            if g and id(p) not in moved
        )
    return total
