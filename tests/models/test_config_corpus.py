"""Every config transformers writes (benchmarks/config_corpus.py, docs/models.md).

The default config of a model type, written by `save_pretrained` as a user's config.json is, is
estimated by memfit (a training step at batch 1 and 64 tokens; a generation of 4 tokens after
a prompt of 64 for a causal LM) with the parameter count of transformers' own class built on
the meta device, or refused by name (a BadInputError or TraceError) for the reason `REFUSED`
gives. A new failure, or a refusal not in the table, fails the test.

`FAST` runs by default; `CORPUS` (about 6 minutes on 2 cores) with MEMFIT_SLOW_TESTS=1.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
from pathlib import Path

import pytest

import memfit
from memfit._compat import torch_at_least
from memfit.errors import BadInputError
from memfit.models.sources import resolve_model

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "config_corpus.py"


def _load():
    spec = importlib.util.spec_from_file_location("config_corpus", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


corpus = _load()

#: Model types run by default: decoders with per-layer fields (qwen2, qwen3 and qwen2_moe write
#: layer_types), an encoder-decoder (t5), a token-by-token scan (mamba, at 16 tokens: its trace
#: grows with them, memfit.models.scans), and the classics.
FAST = ("gpt2", "llama", "qwen2", "qwen3", "qwen2_moe", "bert", "t5", "mamba")
SEQ_LEN = {"mamba": 16}

#: Model types run with MEMFIT_SLOW_TESTS=1 (besides FAST): those of docs/models.md's table
#: that take the least time, and representatives of what memfit does with layers that differ
#: (modernbert, gemma2: replayed by runs of layers).
CORPUS = (
    # decoders (causal-lm; a training step and a generation)
    "arcee", "bert-generation", "biogpt", "bloom", "cohere", "codegen", "ctrl", "falcon",
    "gemma", "gemma2", "gpt-sw3", "gpt_bigcode", "granite", "hyperclovax", "ministral3",
    "nanochat", "olmo", "olmo2", "olmoe", "opt", "persimmon", "phi", "phi3", "phimoe",
    "qwen3_moe", "seed_oss", "stablelm", "starcoder2", "xglm",
    # encoders (masked-lm)
    "albert", "camembert", "convbert", "data2vec-text", "deberta", "deberta-v2", "distilbert",
    "electra", "ernie", "eurobert", "layoutlm", "megatron-bert", "mobilebert", "modernbert",
    "mra", "nomic_bert", "roberta", "roberta-prelayernorm", "roc_bert", "roformer",
    "squeezebert", "xlm-roberta",
    # refused
    "dbrx", "deepseek_v2", "esm", "hunyuan_v1_dense", "ibert", "lfm2_moe", "ministral",
    "nemotron", "reformer",
)  # fmt: skip

#: model type -> (exception class, words of its message): why memfit refuses its default config
#: (transformers 5.24). Each would fail a real run too, but ibert's, whose quantized layers
#: read values (.item()) that fake tensors do not have.
REFUSED = {
    "dbrx": ("BadInputError", "'DbrxAttentionConfig' object has no attribute 'rope_theta'"),
    "deepseek_v2": ("TraceError", "topk(): argument 'k' must be int, not NoneType"),
    "esm": ("BadInputError", "empty(): argument 'size' (position 1) must be tuple of ints"),
    "hunyuan_v1_dense": ("BadInputError", "unsupported operand type(s) for ** or pow()"),
    "ibert": ("TraceError", "DataDependentOutputException"),
    "lfm2_moe": ("BadInputError", "'NoneType' object is not subscriptable"),
    "ministral": ("BadInputError", "unsupported operand type(s) for ** or pow()"),
    "nemotron": ("BadInputError", "unsupported operand type(s) for //: 'int' and 'NoneType'"),
    "reformer": ("TraceError", "axial_pos_shape factors: (64, 64) multiply to sequence length"),
}


#: Models whose experts run through transformers' grouped_mm (integrations/moe.py). On torch
#: 2.8 transformers has no CPU grouped_mm and takes its fallback custom op on memfit's fake CPU
#: tensors; its backward reads the token counts per expert (offs.tolist()), which a fake tensor
#: has not: training them is refused on that torch (docs/compat.md, known limits).
GROUPED_EXPERTS = frozenset({"qwen2_moe"})


def _refusal(model_type: str) -> tuple[str, str] | None:
    if model_type in GROUPED_EXPERTS and not torch_at_least("2.9"):
        return ("TraceError", "DataDependentOutputException")
    return REFUSED.get(model_type)


def _check(model_type: str) -> None:
    if model_type not in corpus.model_types():
        pytest.skip(f"this transformers has no model type {model_type!r}")
    row = corpus.run_one(model_type, seq_len=SEQ_LEN.get(model_type, corpus.SEQ_LEN))
    refusal = _refusal(model_type)
    if refusal is not None:
        error, words = refusal
        assert (row.status, row.error) == ("refused", error), row
        assert words in row.reason, row
        return
    assert row.status == "pass", row
    assert row.parameter_count == row.transformers_parameter_count, row


@pytest.mark.parametrize("model_type", FAST)
def test_default_configs(model_type: str) -> None:
    _check(model_type)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("MEMFIT_SLOW_TESTS"), reason="MEMFIT_SLOW_TESTS=1")
@pytest.mark.parametrize("model_type", CORPUS)
def test_corpus(model_type: str) -> None:
    _check(model_type)


def test_the_corpus_covers_sixty_model_types() -> None:
    covered = set(FAST) | set(CORPUS)
    assert len(covered) == len(FAST) + len(CORPUS) >= 60
    assert set(REFUSED) <= covered


# ----------------------------------------------------------------------------- details


def _saved(tmp_path: Path, model_type: str, **fields: object) -> Path:
    import transformers

    transformers.AutoConfig.for_model(model_type, **fields).save_pretrained(tmp_path)
    return tmp_path


T5 = {"d_model": 32, "d_ff": 64, "num_layers": 2, "num_heads": 2, "d_kv": 16, "vocab_size": 128}


def test_t5_without_decoder_start_token_id_is_traced_as_its_checkpoints_set_it(tmp_path):
    folder = _saved(tmp_path, "t5", **T5)
    if json.loads((folder / "config.json").read_text()).get("decoder_start_token_id") is not None:
        pytest.skip("this transformers writes T5's decoder_start_token_id")
    spec = resolve_model(folder)
    assert spec.notes and "traced it as pad_token_id (0)" in spec.notes[0]
    est = memfit.estimate(folder, memfit.Workload(batch_size=1, seq_len=8))
    # The same model with the field its checkpoints carry: the same estimate.
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "decoder_start_token_id": 0}))
    given = memfit.estimate(folder, memfit.Workload(batch_size=1, seq_len=8))
    assert est.profile.peak_allocated_bytes == given.profile.peak_allocated_bytes
    assert any("decoder_start_token_id" in n for n in est.notes)
    assert not any("decoder_start_token_id" in n for n in given.notes)


def test_floats_transformers_tags_are_read_back(tmp_path):
    # Mamba2 writes its time_step_limit (0.0, inf) as [0.0, {"__float__": "Infinity"}].
    folder = _saved(
        tmp_path, "mamba2", hidden_size=64, num_heads=8, head_dim=16, n_groups=1,
        num_hidden_layers=2, vocab_size=128,
    )  # fmt: skip
    if '"__float__"' not in (folder / "config.json").read_text():
        pytest.skip("this transformers writes no tagged floats")
    config = resolve_model(folder).build(None, "sdpa").config
    assert config.time_step_limit[1] == float("inf")


MAMBA = {"hidden_size": 32, "intermediate_size": 64, "state_size": 4, "num_hidden_layers": 6,
         "vocab_size": 128}  # fmt: skip


def test_a_token_by_token_scan_says_how_long_it_takes(tmp_path, caplog):
    folder = _saved(tmp_path, "mamba", **MAMBA)
    with caplog.at_level(logging.WARNING, logger="memfit"):
        memfit.estimate(folder, memfit.Workload(batch_size=1, seq_len=8))
    # 8 tokens x 3 traced layers x 2 steps (and 4 layers for the replay's check).
    assert "tracing 3 MambaMixer layers' token-by-token scan" in caplog.text
    assert "over 8 tokens x 2 steps, about 1 s" in caplog.text
    # 4096 tokens x 4 layers x 2 steps, 12 ms a token step: 393 s, over the 25 s limit.
    with pytest.raises(BadInputError, match=r"about 393 s, over memfit's limit of 25 s a trace. "
                       r"Estimate 260 tokens or fewer"):  # fmt: skip
        memfit.estimate(folder, memfit.Workload(batch_size=1, seq_len=4096))
