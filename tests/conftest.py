"""Builders shared by the test suite: tiny models, model specs, measured GPT-2 runs, the
replay of recorded allocator traces, and a record of the instances a class makes.

Test modules import them (`from tests.conftest import tiny_gpt2`): `tests` is a package, so
this module is the one pytest loads as the suite's conftest.
"""

from __future__ import annotations

import dataclasses
import json
import os
import weakref
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import memfit
from memfit.cuda.allocator import CachingAllocator
from memfit.cuda.allocator_config import AllocatorConfig
from memfit.models.sources import ModelSpec, resolve_model

# The suite traces what it checks: memfit's trace and plan cache stays off (its own tests,
# tests/estimator/test_trace_cache.py, turn it on in a folder of their own).
os.environ["MEMFIT_NO_CACHE"] = "1"


def record_instances(monkeypatch: Any, cls: type, *, weak: bool = False) -> list[Any]:
    """The instances of `cls` made from now on, in order (weak references with `weak`, to
    check that they are freed), by wrapping its `__init__` for the test."""
    made: list[Any] = []
    init = cls.__init__

    def recorded(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(weakref.ref(self) if weak else self)

    monkeypatch.setattr(cls, "__init__", recorded)
    return made


def tiny_gpt2(
    n_layer: int = 2,
    *,
    n_embd: int = 32,
    n_head: int = 2,
    vocab: int = 100,
    n_positions: int = 32,
    dropout: float = 0.0,
) -> torch.nn.Module:
    """A seeded GPT-2 LM with eager attention (the kernel CPU and emulated CUDA share)."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab,
        n_positions=n_positions, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation="eager")


#: A tiny BART config (2 + 2 layers, d_model 32): an encoder-decoder for the model-source tests
#: (tests/models/test_sources.py, tests/estimator/test_sources_agree.py).
TINY_BART = {
    "vocab_size": 128, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
    "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64, "max_position_embeddings": 64,
}  # fmt: skip


#: A tiny llama config.json (2 layers, 4 heads over 2 KV heads, 64 positions), no special
#: tokens: a catalog-like model (memfit shortens and caches it) for generation and planner tests.
TINY_LLAMA_CONFIG = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
    "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
}  # fmt: skip


def tiny_llama_config(folder: Path, **over: object) -> str:
    """TINY_LLAMA_CONFIG with `over` written to a new config file in `folder`; its path."""
    path = folder / f"config-{len(list(folder.iterdir()))}.json"
    path.write_text(json.dumps({**TINY_LLAMA_CONFIG, **over}))
    return str(path)


def module_spec(model: torch.nn.Module, make_batch: Callable[[int], Any]) -> ModelSpec:
    """The spec memfit resolves for an nn.Module, with a batch factory `make_batch(batch)`."""
    return dataclasses.replace(resolve_model(model), make_batch=make_batch)


# A 4-layer GPT-2 shape measured on real tensors under `apply_` and `memfit.measure`
# (tests/techniques/test_apply_memory.py, tests/measurement/test_measure.py).
MEASURED_VOCAB, MEASURED_SEQ, MEASURED_BATCH = 128, 64, 8
MEASURED_BASE = memfit.Workload(
    batch_size=MEASURED_BATCH, seq_len=MEASURED_SEQ, attention="eager", optimizer="adamw"
)


def measured_gpt2() -> torch.nn.Module:
    return tiny_gpt2(4, n_embd=64, n_head=4, vocab=MEASURED_VOCAB, n_positions=MEASURED_SEQ)


def run_measured(w: memfit.Workload) -> tuple[Any, torch.nn.Module]:
    """Two steps of `w` applied to `measured_gpt2()` by apply_, under memfit.measure."""
    model = measured_gpt2()
    setup = memfit.apply_(model, w)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, MEASURED_VOCAB, (w.batch_size * w.grad_accum, MEASURED_SEQ), generator=g)
    with memfit.measure(model, setup.optimizer) as m:
        for _ in range(2):
            setup.step({"input_ids": ids, "labels": ids.clone()})
    return m, model


# Allocator traces (tests/data/allocator_traces, the format benchmarks/gpu_validation.py records):
# read and replayed by tests/cuda/test_allocator_traces.py and tests/test_gpu_validation.py.
TRACE_DIR = Path(__file__).parent / "data" / "allocator_traces"


TRACE_FORMAT = "memfit-allocator-trace/1"


ACTIONS = ("alloc", "free", "empty_cache")


def trace_layout(segments: list[dict[str, Any]]) -> Counter:
    """Segments as a multiset of (total_size, ((block_size, allocated), ...))."""
    return Counter(
        (int(s["total_size"]), tuple((int(b[0]), b[1] == "allocated") for b in s["blocks"]))
        for s in segments
    )


def _simulated_layout(alloc: CachingAllocator) -> Counter:
    return Counter((size, tuple(blocks)) for size, blocks in alloc.segments())


def replay_trace(trace: dict[str, Any]) -> list[tuple[int, int, int, Counter]]:
    """Run the trace; returns (event index, reserved, allocated, layout) at every checkpoint."""
    conf = trace.get("alloc_conf") or ""
    cfg = AllocatorConfig.from_string(conf) if conf else AllocatorConfig()
    alloc = CachingAllocator(cfg, capacity_bytes=trace.get("capacity_bytes"))
    wanted = {int(c["after_event"]) for c in trace["checkpoints"]}
    held: dict[int, int | None] = {}
    out = []
    for i, (action, key, size) in enumerate(trace["events"]):
        if action == "alloc":
            # A 0-byte request takes no memory (NativeCachingAllocator::allocate).
            held[key] = alloc.malloc(int(size)) if size > 0 else None
        elif action == "free":
            block = held.pop(key)
            if block is not None:
                alloc.free(block)
        elif action == "empty_cache":
            alloc.empty_cache()
        else:
            raise AssertionError(f"event {i}: unknown action {action!r}")
        if i in wanted:
            out.append((i, alloc.reserved, alloc.allocated, _simulated_layout(alloc)))
    return out
