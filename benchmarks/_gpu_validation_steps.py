"""The loop memfit traces, run for real (benchmarks/gpu_validation.py's "memfit" loop).

The catalog model is built on the meta device with ``build_model(..., num_layers=None)`` (LoRA
and checkpointing applied as memfit applies them), its parameters and then its buffers are
allocated on the device in the order memfit's tracker registers them (ties kept), and
initialised in place; then memfit's step (src/memfit/estimator/step_runner.py) runs twice.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
from typing import Any

from _gpu_validation_configs import Config


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


def run_real_steps(
    cfg: Config, device: Any, *, on_built: Any = None, on_done: Any = None
) -> dict[str, Any]:
    """Run `cfg`'s training step for real on `device`, as memfit's trace runs it.

    ``on_built()`` is called once the model is on the device and initialised, before the
    first step (to start the step's peak there); ``on_done()`` after the last step, with
    everything still alive (to read the device memory). Their dicts are merged into the result.
    """
    import torch

    from memfit.estimator.trace.step_runner import DTYPES, make_batch_for, step_loss
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
    built = on_built() if on_built is not None else {}
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
    info.update(built)
    if on_done is not None:
        info.update(on_done())
    del model, params, trainable, optimizer, scaler
    gc.collect()
    return info
