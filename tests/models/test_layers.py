"""Per-layer config fields (memfit.models.layers): a shortened model gets the first layers' entries,
and a model whose layers differ is traced whole, never replayed from a layer unlike the others.

Tiny Qwen2 / Qwen2-MoE configs written by transformers' own `save_pretrained`, as a user's
config.json is (transformers 5 writes `layer_types`, one entry per layer).
"""

from __future__ import annotations

from pathlib import Path

import torch

import memfit
from memfit.models.layers import config_differences, module_differences, shortened_fields
from memfit.models.sources import resolve_model

QWEN2 = {
    "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 6,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
}  # fmt: skip
# By hand (h = 32, ff = 64, V = 128, head_dim 8, 2 KV heads): embed V*h; per layer q h*h + h,
# k and v h*16 + 16 each, o h*h, MLP 3*h*ff, 2 norms 2h; final norm h; lm_head V*h (untied).
_LAYER = (32 * 32 + 32) + 2 * (32 * 16 + 16) + 32 * 32 + 3 * 32 * 64 + 2 * 32
QWEN2_PARAMS = 128 * 32 + 6 * _LAYER + 32 + 128 * 32
assert QWEN2_PARAMS == 64_288
WORKLOAD = memfit.Workload(batch_size=1, seq_len=16)


def _saved(tmp_path: Path, model_type: str, **fields: object) -> Path:
    import transformers

    folder = tmp_path / model_type
    transformers.AutoConfig.for_model(model_type, **fields).save_pretrained(folder)
    return folder


def _whole(folder: Path) -> torch.nn.Module:
    """The model of `folder`'s config, built whole by transformers (traced whole by memfit)."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def test_layer_types_written_by_transformers_are_shortened_with_the_layers(tmp_path):
    folder = _saved(tmp_path, "qwen2", **QWEN2)
    spec = resolve_model(folder)
    assert spec.can_shorten and spec.num_layers == 6 and not spec.notes
    with torch.device("meta"):
        short = spec.build(3, "sdpa")
    assert short.config.layer_types == ["full_attention"] * 3
    est = memfit.estimate(folder, WORKLOAD)
    assert (est.replayed, est.num_blocks, est.parameter_count) == (True, 6, QWEN2_PARAMS)
    # The replay of the 3 traced layers is the trace of all 6, to the byte.
    whole = memfit.estimate(_whole(folder), WORKLOAD)
    assert not whole.replayed and whole.parameter_count == QWEN2_PARAMS
    assert est.profile.peak_allocated_bytes == whole.profile.peak_allocated_bytes
    assert est.profile.breakdown == whole.profile.breakdown


def test_sliding_and_full_attention_layers_are_traced_whole(tmp_path):
    # Qwen2 derives its layer_types: layers from max_window_layers on slide.
    folder = _saved(
        tmp_path, "qwen2", **QWEN2, use_sliding_window=True, sliding_window=8, max_window_layers=4
    )
    spec = resolve_model(folder)
    assert not spec.can_shorten
    assert "layer_types: 4 x 'full_attention', 2 x 'sliding_attention'" in spec.notes[0], spec.notes
    est = memfit.estimate(folder, WORKLOAD)
    assert (est.replayed, est.num_blocks, est.parameter_count) == (False, 6, QWEN2_PARAMS)
    assert any("every layer is traced" in n for n in est.notes)


def test_moe_and_dense_layers_are_traced_whole(tmp_path):
    moe = {**QWEN2, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
           "shared_expert_intermediate_size": 16}  # fmt: skip
    # A list of layer indices (mlp_only_layers: these layers are dense).
    listed = resolve_model(_saved(tmp_path / "a", "qwen2_moe", **moe, mlp_only_layers=[2]))
    assert not listed.can_shorten
    assert "mlp_only_layers names 1 of the 6 layers ([2])" in listed.notes[0]
    # A period (decoder_sparse_step: every second layer is MoE): the modules differ.
    folder = _saved(tmp_path / "b", "qwen2_moe", **moe, decoder_sparse_step=2)
    spec = resolve_model(folder)
    assert not spec.can_shorten
    assert (
        "layer 1 differs from layer 0 (mlp is Qwen2MoeMLP, mlp is Qwen2MoeSparseMoeBlock)"
        in (spec.notes[0])
    )
    est = memfit.estimate(folder, WORKLOAD)
    with torch.device("meta"):
        expected = sum(p.numel() for p in _whole(folder).parameters())
    assert est.parameter_count == expected and not est.replayed and est.num_blocks == 0
    # Every layer MoE (the default): alike, replayed.
    assert resolve_model(_saved(tmp_path / "c", "qwen2_moe", **moe)).can_shorten


def test_shortened_fields_keep_the_first_layers_entries():
    full = {
        "num_hidden_layers": 6,
        "layer_types": ["full_attention", "sliding_attention"] * 3,
        "no_rope_layers": [1, 1, 1, 0, 1, 1],
        "mlp_only_layers": [0, 4],
        "eos_token_id": [1, 2, 3, 4, 5, 6],  # token ids are never per layer
        "per_layer_config": {"0": {"intermediate_size": 8}, "5": {"intermediate_size": 4}},
        "decoder_sparse_step": 2,
    }
    given = {"num_hidden_layers": 6, "decoder_sparse_step": 2}
    assert shortened_fields(given, "num_hidden_layers", full, 6, 3) == {
        "num_hidden_layers": 3,
        "decoder_sparse_step": 2,
        "layer_types": ["full_attention", "sliding_attention", "full_attention"],
        "no_rope_layers": [1, 1, 1],
        "mlp_only_layers": [0],
        "per_layer_config": {"0": {"intermediate_size": 8}},
    }


def test_config_differences():
    n = 4
    assert config_differences({"layer_types": ["full_attention"] * n}, n) is None
    # Each layer its own cache (Mistral Large 4's kv_source_layers): alike.
    assert config_differences({"kv_source_layers": [0, 1, 2, 3]}, n) is None
    assert config_differences({"kv_source_layers": [0, 0, 2, 2]}, n) == (
        "kv_source_layers: 2 x 0, 2 x 2"
    )
    assert config_differences({"moe_layers": [0, 1, 2, 3], "mlp_only_layers": []}, n) is None
    assert config_differences({"per_layer_config": {"1": {"head_dim": 8}}}, n) == (
        "per_layer_config overrides layers ['1']"
    )


class _Layer(torch.nn.Module):
    def __init__(self, layer_idx: int, window: int | None, width: int = 4) -> None:
        super().__init__()
        self.layer_idx = layer_idx  # an index: not a difference
        self.scale = 1.0 / (layer_idx + 1)  # a float constant: not a difference
        self.sliding_window = window
        self.proj = torch.nn.Linear(width, width)


def test_module_differences():
    def stack(*layers: torch.nn.Module) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.ModuleList(layers))

    assert module_differences(stack(*(_Layer(i, None) for i in range(3))), 3) is None
    assert module_differences(stack(_Layer(0, None), _Layer(1, 8), _Layer(2, None)), 3) == (
        "layer 1 differs from layer 0 (the layer's sliding_window)"
    )
    assert module_differences(stack(_Layer(0, None), _Layer(1, None, 8), _Layer(2, None)), 3) == (
        "layer 1 differs from layer 0 (proj has other parameters)"
    )
    # No stack of that many layers: nothing to compare.
    assert module_differences(stack(_Layer(0, None), _Layer(1, 8)), 3) is None


def test_layers_that_repeat_in_runs_are_replayed_by_runs(tmp_path):
    # Full and sliding attention alternate: runs of 2 layers after the first 2 are alike.
    types = ["full_attention", "sliding_attention"] * 8
    folder = _saved(
        tmp_path, "qwen2", **{**QWEN2, "num_hidden_layers": 16}, layer_types=types,
        use_sliding_window=True, sliding_window=8,
    )  # fmt: skip
    spec = resolve_model(folder)
    assert spec.can_shorten and spec.num_layers == 8  # units: the first 2 layers, 7 runs of 2
    assert (spec.layer_units.head, spec.layer_units.period) == (2, 2)
    assert "they repeat every 2 layers after the first 2" in spec.notes[0]
    with torch.device("meta"):
        assert spec.build(3, "sdpa").config.layer_types == types[:6]
    est = memfit.estimate(folder, WORKLOAD)
    whole = memfit.estimate(_whole(folder), WORKLOAD)
    assert est.replayed and not whole.replayed
    params = 128 * 32 + 16 * _LAYER + 32 + 128 * 32
    assert est.parameter_count == whole.parameter_count == params
    assert est.profile.peak_allocated_bytes == whole.profile.peak_allocated_bytes
    assert est.profile.breakdown == whole.profile.breakdown
    assert est.profile.by_module == whole.profile.by_module  # layers named as in the model


def test_the_catalogs_layers_are_alike_after_the_first():
    # memfit compares the layers of a config.json's model before replaying them, not those of
    # the built-in catalog's entries: this is why.
    from memfit.models.catalog import build_model, hf_config, list_models
    from memfit.models.layers import replay_units

    for entry in list_models():
        key = entry.repeated_layers_key
        if key is None:
            continue
        n = entry.config[key]
        full = hf_config(entry.model_type, dict(entry.config), entry.name).to_dict()
        units, reason = replay_units(f"catalog {entry.name}", full, n,
                                     lambda e=entry: build_model(e))  # fmt: skip
        # Alike, or all but the first (BEiT's first layer has no drop path): 3 traced, the
        # middle one replayed.
        assert units is not None and units.alike, (entry.name, reason)
