"""Loops memfit did not write (issue 31 item 4), each with memfit's estimate of the same run.

Every runner has the signature of ``run_real_steps``: ``run(cfg, device, on_built=, on_done=)``.
It builds the model, calls ``on_built()`` once the model (and, for QLoRA, its quantized load)
is on the device, so that the step's peak starts there, runs the loop as a user writes it,
calls ``on_done()`` with everything alive, and returns what it saw.

* "trainer": ``transformers.Trainer`` with ``memfit.integrations.transformers.MemfitCallback``
  on a small grouped-query Llama built from a config (random weights), bf16=True, 2 steps. The
  estimate is the callback's own (it reads the Trainer's model, arguments, optimizer and first
  batch at ``on_train_begin``); on the CPU the Trainer is stopped right after it.
* "generate": ``model.generate`` (greedy, or beam search), no end-of-sequence token so that it
  makes exactly ``new_tokens``; estimated with ``Workload(mode="generate")``.
* "peft-lora": peft's ``get_peft_model`` on a bf16 base, a plain AdamW loop; the estimate
  reads the same peft model built on the meta device (memfit traces it as loaded).
* "qlora": a random checkpoint saved with ``save_pretrained``, loaded with bitsandbytes 4-bit
  NF4 (double quantization, bf16 compute) by ``from_pretrained``, then peft LoRA; estimated as
  ``Workload(quantize="nf4-dq", lora=...)`` of the same catalog model.
* "amp-plain": ``torch.autocast`` + ``torch.amp.GradScaler`` written the plain way
  (``loss = model(...).loss``, nothing deleted, ``use_cache`` left as the model has it).
* "full-7b": the README's Llama-2-7B bf16 step, memfit's own loop (no runner here).
"""

from __future__ import annotations

import contextlib
import gc
import tempfile
import time
from typing import Any

from _gpu_validation_configs import Config
from _gpu_validation_steps import init_weights, materialize

#: The Trainer loop's model: a grouped-query Llama (16 query heads share 4 KV heads),
#: 12 layers of 1024, 32,000-token vocabulary, untied: 200,827,904 parameters.
TRAINER_LLAMA = {
    "vocab_size": 32000,
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 12,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}
#: bitsandbytes layout of the QLoRA loop, as memfit's Workload(quantize=...) names it.
QLORA_QUANTIZE = "nf4-dq"
#: Steps of every loop (memfit's Workload.steps default).
STEPS = 2
#: LoRA scaling numerator; does not change memory.
LORA_ALPHA = 32


class _EstimateDone(Exception):
    """Raised by _StopAfterEstimate to leave trainer.train() once the callback estimated."""


def _dtype(cfg: Config) -> Any:
    import torch

    return torch.bfloat16 if cfg.precision.startswith("bf16") else torch.float32


def _built_on_device(cfg: Config, device: Any) -> Any:
    """The catalog model as memfit's loop makes it: meta build, cast, storage, init."""
    import torch

    from memfit.models.sources import resolve_model

    with torch.device("meta"):
        model = resolve_model(cfg.model).build(None, cfg.attention)
    if cfg.precision.endswith("-true"):
        model = model.to(_dtype(cfg))
    materialize(model, device)
    init_weights(model)
    return model


def _catalog_config(name: str) -> Any:
    """The transformers config of memfit's catalog model `name` (no download)."""
    from memfit.models.catalog import get_model, hf_config

    m = get_model(name)
    return hf_config(m.model_type, dict(m.config), m.name)


def _peft_lora(cfg: Config) -> Any:
    import peft

    return peft.LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=LORA_ALPHA,
        lora_dropout=0.0,
        target_modules=list(cfg.lora_targets),
        task_type="CAUSAL_LM",
    )


def _counts(model: Any) -> dict[str, Any]:
    params = list(dict.fromkeys(model.parameters()))
    return {
        "parameter_count": sum(p.numel() for p in params),
        "trainable_parameter_count": sum(p.numel() for p in params if p.requires_grad),
    }


def _free(*objs: Any) -> None:
    del objs
    gc.collect()


# ---------------------------------------------------------------------------- estimates


def estimate_loop(cfg: Config, gpu: str, alloc_conf: str | None) -> Any:
    """memfit's Estimate of `cfg`'s run on `gpu` (on the CPU; no device is touched)."""
    import memfit

    conf = alloc_conf or None
    if cfg.loop == "trainer":
        return _trainer_estimate(cfg, gpu)
    if cfg.loop == "peft-lora":
        import peft
        import torch

        from memfit.models.sources import resolve_model

        with torch.device("meta"):
            base = resolve_model(cfg.model).build(None, cfg.attention).to(_dtype(cfg))
        model = peft.get_peft_model(base, _peft_lora(cfg))
        w = memfit.Workload(
            batch_size=cfg.batch_size, seq_len=cfg.seq_len, precision=cfg.precision,
            optimizer=cfg.optimizer, attention=cfg.attention,
        )  # fmt: skip
        return memfit.estimate(model, w, gpu=gpu, alloc_conf=conf)
    w = cfg.workload()
    if cfg.loop == "qlora":
        w = w.with_(quantize=QLORA_QUANTIZE)
    return memfit.estimate(cfg.model, w, gpu=gpu, alloc_conf=conf)


class _TokenDataset:
    """`n` fixed random rows of `seq` token ids, labels = input_ids (torch Dataset protocol)."""

    def __init__(self, n: int, seq: int, vocab: int) -> None:
        import torch

        g = torch.Generator().manual_seed(0)
        self.rows = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def _trainer(cfg: Config, model: Any, callbacks: list[Any], out_dir: str, cpu: bool) -> Any:
    import transformers

    args = transformers.TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=cfg.batch_size, max_steps=STEPS,
        bf16=cfg.precision == "bf16-mixed", optim="adamw_torch", learning_rate=1e-4,
        save_strategy="no", logging_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0, dataloader_pin_memory=False, use_cpu=cpu,
    )  # fmt: skip
    ds = _TokenDataset(cfg.batch_size * STEPS, cfg.seq_len or 0, TRAINER_LLAMA["vocab_size"])
    return transformers.Trainer(model=model, args=args, train_dataset=ds, callbacks=callbacks)


def _trainer_model(device: Any) -> Any:
    import torch
    import transformers

    config = transformers.LlamaConfig(**TRAINER_LLAMA)
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.LlamaForCausalLM(config)


def _trainer_estimate(cfg: Config, gpu: str) -> Any:
    import transformers

    from memfit.integrations.transformers import MemfitCallback

    class _StopAfterEstimate(transformers.TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            raise _EstimateDone

    cb = MemfitCallback(gpu=gpu, measure_steps=0, stop=False, strict=True, print_fn=lambda s: None)
    with tempfile.TemporaryDirectory(prefix="memfit-gv-trainer-") as out:
        trainer = _trainer(cfg, _trainer_model("cpu"), [cb, _StopAfterEstimate()], out, True)
        with contextlib.suppress(_EstimateDone):
            trainer.train()
    if cb.estimate is None:
        raise RuntimeError(f"MemfitCallback made no estimate: {cb.failed}")
    return cb.estimate


# ---------------------------------------------------------------------------- runners


def run_trainer(cfg: Config, device: Any, *, on_built: Any, on_done: Any) -> dict[str, Any]:
    from memfit.integrations.transformers import MemfitCallback

    t0 = time.perf_counter()
    cb = MemfitCallback(measure_steps=0, stop=False, print_fn=lambda s: None)
    with tempfile.TemporaryDirectory(prefix="memfit-gv-trainer-") as out:
        model = _trainer_model(device)
        trainer = _trainer(cfg, model, [cb], out, False)
        info = {**_counts(model), **on_built()}
        result = trainer.train()
        info.update(on_done())
    est = cb.estimate
    info.update(
        seconds=round(time.perf_counter() - t0, 3),
        losses=[round(float(result.training_loss), 4)],
        callback_estimate_peak_allocated_bytes=est.profile.peak_allocated_bytes if est else None,
        callback_failed=cb.failed,
    )
    _free(trainer, model, cb)
    return info


def run_generate(cfg: Config, device: Any, *, on_built: Any, on_done: Any) -> dict[str, Any]:
    import torch

    t0 = time.perf_counter()
    model = _built_on_device(cfg, device).eval()
    gen = model.generation_config
    gen.eos_token_id = None  # exactly new_tokens, as the estimate makes
    gen.bos_token_id = None
    ids = torch.randint(0, model.config.vocab_size, (cfg.batch_size, cfg.prompt_len or 1),
                        device=device)  # fmt: skip
    info = {**_counts(model), **on_built()}
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=cfg.new_tokens, do_sample=False, num_beams=cfg.num_beams
        )
    info.update(on_done())
    info.update(seconds=round(time.perf_counter() - t0, 3), generated_shape=list(out.shape))
    _free(model, ids, out)
    return info


def _plain_steps(cfg: Config, model: Any, device: Any, scaler: Any = None) -> list[float]:
    """The loop as users write it: a fresh batch, ``loss = model(...).loss``, backward, step."""
    import torch

    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
    vocab = model.config.vocab_size
    losses = []
    for _ in range(STEPS):
        input_ids = torch.randint(0, vocab, (cfg.batch_size, cfg.seq_len or 1), device=device)
        if scaler is not None:
            with torch.autocast(device.type, dtype=torch.float16):
                loss = model(input_ids=input_ids, labels=input_ids).loss
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss = model(input_ids=input_ids, labels=input_ids).loss
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(round(float(loss.detach()), 4))
    return losses


def run_peft_lora(cfg: Config, device: Any, *, on_built: Any, on_done: Any) -> dict[str, Any]:
    import peft
    import torch

    t0 = time.perf_counter()
    device = torch.device(device)
    model = peft.get_peft_model(_built_on_device(cfg, device), _peft_lora(cfg))
    model.train()
    info = {**_counts(model), **on_built()}
    info["losses"] = _plain_steps(cfg, model, device)
    info.update(on_done())
    info["seconds"] = round(time.perf_counter() - t0, 3)
    _free(model)
    return info


def run_qlora(cfg: Config, device: Any, *, on_built: Any, on_done: Any) -> dict[str, Any]:
    import peft
    import torch
    import transformers

    t0 = time.perf_counter()
    device = torch.device(device)
    with tempfile.TemporaryDirectory(prefix="memfit-gv-qlora-") as ckpt:
        config = _catalog_config(cfg.model)
        with torch.device(device):
            random = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        random.save_pretrained(ckpt)
        del random
        gc.collect()
        torch.cuda.empty_cache()
        quant = transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )  # fmt: skip
        base = transformers.AutoModelForCausalLM.from_pretrained(
            ckpt, quantization_config=quant, dtype=torch.bfloat16,
            device_map={"": device.index or 0},
        )  # fmt: skip
    model = peft.get_peft_model(base, _peft_lora(cfg))
    model.train()
    info = {**_counts(model), **on_built()}
    info["losses"] = _plain_steps(cfg, model, device)
    info.update(on_done())
    info["seconds"] = round(time.perf_counter() - t0, 3)
    _free(model, base)
    return info


def run_amp_plain(cfg: Config, device: Any, *, on_built: Any, on_done: Any) -> dict[str, Any]:
    import torch
    import transformers

    t0 = time.perf_counter()
    device = torch.device(device)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(_catalog_config(cfg.model))
    model.train()
    scaler = torch.amp.GradScaler(device.type)
    info = {**_counts(model), **on_built()}
    info["losses"] = _plain_steps(cfg, model, device, scaler)
    info.update(on_done())
    info["seconds"] = round(time.perf_counter() - t0, 3)
    _free(model, scaler)
    return info


#: Runners of the loops memfit did not write ("full-7b" and "memfit" run memfit's own loop).
RUNNERS = {
    "trainer": run_trainer,
    "generate": run_generate,
    "peft-lora": run_peft_lora,
    "qlora": run_qlora,
    "amp-plain": run_amp_plain,
}
