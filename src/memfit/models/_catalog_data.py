"""Raw data of the built-in model catalog (see ``memfit.models.catalog``).

Every ``config`` holds the fields of the model's official ``config.json`` on the Hugging Face
hub that shape the model (sizes, vocabulary, tying, biases, norms, dropout, positions). Fields
that only matter to tokenizers or generation are left out. The helpers below fill the fields a
family shares; each entry passes the per-size values.

``parameter_count`` is the number of parameters of the default-task model built from that
config, tied weights counted once. Each entry says where the number comes from:

* ``card``: the model card or the paper of the model;
* ``hub``: the parameter count the hub derives from the checkpoint's safetensors metadata;
* ``cited``: a figure widely reported by people who loaded the official checkpoint;
* ``formula``: computed by hand from the architecture (the formula is written next to it).

``torch_dtype`` is the dtype the checkpoint is stored in, as its config.json names it (what
``precision="auto"`` reads, see ``memfit.estimator.auto_precision``). It is given only where a
copy of the official config.json was found (the comment ``dtype:`` next to the entry says
where); configs that name no dtype (GPT-2, BERT, T5, ...) and entries not yet checked leave it
out, which "auto" reads as float32.

Every figure taken from a source was also checked against the formula in the comment. None of
them was taken from what memfit's own build prints. Abbreviations in the formulas: V vocab,
P positions, h hidden size, L layers, ff MLP width, kv key/value width, E embedding size.
"""

from __future__ import annotations

from typing import Any

# ----------------------------------------------------------------------------- family helpers


def _gpt2(n_embd: int, n_head: int, n_layer: int) -> dict[str, Any]:
    return {
        "activation_function": "gelu_new",
        "attn_pdrop": 0.1,
        "bos_token_id": 50256,
        "embd_pdrop": 0.1,
        "eos_token_id": 50256,
        "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05,
        "n_embd": n_embd,
        "n_head": n_head,
        "n_layer": n_layer,
        "n_positions": 1024,
        "resid_pdrop": 0.1,
        "vocab_size": 50257,
    }


def _bert(hidden: int, heads: int, layers: int, vocab: int) -> dict[str, Any]:
    return {
        "attention_probs_dropout_prob": 0.1,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": 4 * hidden,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": 512,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "type_vocab_size": 2,
        "vocab_size": vocab,
    }


def _roberta(hidden: int, heads: int, layers: int) -> dict[str, Any]:
    return {
        "attention_probs_dropout_prob": 0.1,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": 4 * hidden,
        "layer_norm_eps": 1e-05,
        "max_position_embeddings": 514,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "pad_token_id": 1,
        "type_vocab_size": 1,
        "vocab_size": 50265,
    }


def _t5(d_model: int, d_ff: int, heads: int, layers: int) -> dict[str, Any]:
    return {
        "d_ff": d_ff,
        "d_kv": 64,
        "d_model": d_model,
        "decoder_start_token_id": 0,
        "dropout_rate": 0.1,
        "eos_token_id": 1,
        "feed_forward_proj": "relu",
        "initializer_factor": 1.0,
        "is_encoder_decoder": True,
        "layer_norm_epsilon": 1e-06,
        "n_positions": 512,
        "num_heads": heads,
        "num_layers": layers,
        "pad_token_id": 0,
        "relative_attention_num_buckets": 32,
        "vocab_size": 32128,
    }


def _opt(hidden: int, ffn: int, heads: int, layers: int, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "_remove_final_layer_norm": False,
        "activation_dropout": 0.0,
        "activation_function": "relu",
        "attention_dropout": 0.0,
        "bos_token_id": 2,
        "do_layer_norm_before": True,
        "dropout": 0.1,
        "enable_bias": True,
        "eos_token_id": 2,
        "ffn_dim": ffn,
        "hidden_size": hidden,
        "init_std": 0.02,
        "layer_norm_elementwise_affine": True,
        "layerdrop": 0.0,
        "max_position_embeddings": 2048,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "pad_token_id": 1,
        "vocab_size": 50272,
        "word_embed_proj_dim": hidden,
    }
    cfg.update(extra)
    return cfg


def _pythia(hidden: int, heads: int, layers: int, vocab: int = 50304) -> dict[str, Any]:
    return {
        "attention_bias": True,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "classifier_dropout": 0.1,
        "eos_token_id": 0,
        "hidden_act": "gelu",
        "hidden_dropout": 0.0,
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": 4 * hidden,
        "layer_norm_eps": 1e-05,
        "max_position_embeddings": 2048,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "rotary_emb_base": 10000,
        "rotary_pct": 0.25,
        "tie_word_embeddings": False,
        "use_parallel_residual": True,
        "vocab_size": vocab,
    }


def _bloom(hidden: int, heads: int, layers: int) -> dict[str, Any]:
    return {
        "apply_residual_connection_post_layernorm": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_dropout": 0.0,
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05,
        "n_head": heads,
        "n_layer": layers,
        "pad_token_id": 3,
        "pretraining_tp": 1,
        "slow_but_exact": False,
        "vocab_size": 250880,
    }


def _llama(
    hidden: int,
    ff: int,
    layers: int,
    heads: int,
    kv_heads: int,
    *,
    vocab: int,
    max_pos: int,
    eps: float = 1e-05,
    **extra: Any,
) -> dict[str, Any]:
    """Llama-style decoder (also Mistral, Mixtral, Qwen2, Qwen3, Gemma, Phi-3)."""
    cfg: dict[str, Any] = {
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": ff,
        "max_position_embeddings": max_pos,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": eps,
        "tie_word_embeddings": False,
        "vocab_size": vocab,
    }
    cfg.update(extra)
    return cfg


_LLAMA2: dict[str, Any] = {"bos_token_id": 1, "eos_token_id": 2, "pretraining_tp": 1}
_LLAMA3: dict[str, Any] = {
    "attention_bias": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "mlp_bias": False,
    "rope_theta": 500000.0,
}


def _llama3_rope(factor: float) -> dict[str, Any]:
    return {
        "factor": factor,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    }


_QWEN: dict[str, Any] = {"bos_token_id": 151643, "eos_token_id": 151643, "rope_theta": 1000000.0}


def _qwen25(
    hidden: int, ff: int, layers: int, heads: int, kv: int, *, vocab: int, max_pos: int, **x: Any
) -> dict[str, Any]:
    return _llama(
        hidden,
        ff,
        layers,
        heads,
        kv,
        vocab=vocab,
        max_pos=max_pos,
        eps=x.pop("eps", 1e-06),
        sliding_window=max_pos,
        use_sliding_window=False,
        **_QWEN,
        **x,
    )


def _phi(hidden: int, layers: int, partial_rotary: float, resid_pdrop: float) -> dict[str, Any]:
    return {
        "attention_dropout": 0.0,
        "bos_token_id": 50256,
        "embd_pdrop": 0.0,
        "eos_token_id": 50256,
        "hidden_act": "gelu_new",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": 4 * hidden,
        "layer_norm_eps": 1e-05,
        "max_position_embeddings": 2048,
        "num_attention_heads": 32,
        "num_hidden_layers": layers,
        "num_key_value_heads": 32,
        "partial_rotary_factor": partial_rotary,
        "qk_layernorm": False,
        "resid_pdrop": resid_pdrop,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "vocab_size": 51200,
    }


def _vit(hidden: int, heads: int, layers: int) -> dict[str, Any]:
    return {
        "attention_probs_dropout_prob": 0.0,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "hidden_size": hidden,
        "image_size": 224,
        "initializer_range": 0.02,
        "intermediate_size": 4 * hidden,
        "layer_norm_eps": 1e-12,
        "num_attention_heads": heads,
        "num_channels": 3,
        "num_hidden_layers": layers,
        "num_labels": 1000,  # id2label of the checkpoint: the 1000 ImageNet-1k classes
        "patch_size": 16,
        "qkv_bias": True,
    }


def _whisper(
    d_model: int, layers: int, heads: int, *, mel: int = 80, vocab: int = 51865
) -> dict[str, Any]:
    return {
        "activation_dropout": 0.0,
        "activation_function": "gelu",
        "attention_dropout": 0.0,
        "bos_token_id": 50257,
        "d_model": d_model,
        "decoder_attention_heads": heads,
        "decoder_ffn_dim": 4 * d_model,
        "decoder_layers": layers,
        "decoder_start_token_id": 50258,
        "dropout": 0.0,
        "encoder_attention_heads": heads,
        "encoder_ffn_dim": 4 * d_model,
        "encoder_layers": layers,
        "eos_token_id": 50257,
        "max_source_positions": 1500,
        "max_target_positions": 448,
        "num_mel_bins": mel,
        "pad_token_id": 50257 if vocab == 51865 else 50256,
        "scale_embedding": False,
        "vocab_size": vocab,
    }


def _e(
    name: str,
    hf_id: str | None,
    model_type: str | None,
    task: str,
    config: dict[str, Any],
    parameter_count: int,
    *,
    input_kind: str,
    max_positions: int | None,
    repeated_layers_key: str | None,
    aliases: tuple[str, ...] = (),
    image_size: int | None = None,
) -> dict[str, Any]:
    return {
        "name": name,
        "hf_id": hf_id,
        "model_type": model_type,
        "task": task,
        "config": config,
        "parameter_count": parameter_count,
        "aliases": aliases,
        "input_kind": input_kind,
        "max_positions": max_positions,
        "image_size": image_size,
        "repeated_layers_key": repeated_layers_key,
    }


def _dec(
    name: str, hf_id: str, model_type: str, config: dict[str, Any], count: int, **kw: Any
) -> dict[str, Any]:
    """A decoder-only causal LM whose repeated blocks are counted by ``num_hidden_layers``."""
    kw.setdefault("repeated_layers_key", "num_hidden_layers")
    kw.setdefault("max_positions", config.get("max_position_embeddings"))
    return _e(name, hf_id, model_type, "causal-lm", config, count, input_kind="tokens", **kw)


# ----------------------------------------------------------------------------- entries

_GPT2: dict[str, Any] = {
    "input_kind": "tokens",
    "max_positions": 1024,
    "repeated_layers_key": "n_layer",
}
_BERT: dict[str, Any] = {
    "input_kind": "tokens",
    "max_positions": 512,
    "repeated_layers_key": "num_hidden_layers",
}
_T5: dict[str, Any] = {
    "input_kind": "seq2seq-tokens",
    "max_positions": None,
    "repeated_layers_key": None,
}
_IMG: dict[str, Any] = {"input_kind": "image", "max_positions": None, "image_size": 224}
_AUDIO: dict[str, Any] = {"input_kind": "audio", "max_positions": 448, "repeated_layers_key": None}

# fmt: off
ENTRIES: list[dict[str, Any]] = [
    # --- GPT-2 (GPT2LMHeadModel, lm_head tied): V*h + P*h + L*(12h^2 + 13h) + 2h
    # cited: 124,439,808 / 354,823,168 / 774,030,080 / 1,557,611,200; formula agrees.
    _e("gpt2", "openai-community/gpt2", "gpt2", "causal-lm", _gpt2(768, 12, 12),
       124_439_808, aliases=("gpt2-small",), **_GPT2),
    _e("gpt2-medium", "openai-community/gpt2-medium", "gpt2", "causal-lm", _gpt2(1024, 16, 24),
       354_823_168, **_GPT2),
    _e("gpt2-large", "openai-community/gpt2-large", "gpt2", "causal-lm", _gpt2(1280, 20, 36),
       774_030_080, **_GPT2),
    _e("gpt2-xl", "openai-community/gpt2-xl", "gpt2", "causal-lm", _gpt2(1600, 25, 48),
       1_557_611_200, **_GPT2),
    # cited: 81,912,576 (same formula, L=6)
    _e("distilgpt2", "distilbert/distilgpt2", "gpt2", "causal-lm", _gpt2(768, 12, 6),
       81_912_576, aliases=("distil-gpt2",), **_GPT2),
    # --- BERT (BertForMaskedLM: no pooler; decoder tied, its bias V kept):
    # V*h + P*h + 2h + 2h + L*(4h^2 + 2h*ff + 9h + ff) + (h^2 + h + 2h + V)
    # bert-base-uncased 109,514,298 cited; bert-base-cased 108,340,804 cited;
    # bert-large-uncased 335,174,458 (MLPerf training BERT-Large table); formula agrees.
    _e("bert-base-uncased", "google-bert/bert-base-uncased", "bert", "masked-lm",
       _bert(768, 12, 12, 30522), 109_514_298, aliases=("bert-base",), **_BERT),
    _e("bert-base-cased", "google-bert/bert-base-cased", "bert", "masked-lm",
       _bert(768, 12, 12, 28996), 108_340_804, **_BERT),
    _e("bert-large-uncased", "google-bert/bert-large-uncased", "bert", "masked-lm",
       _bert(1024, 16, 24, 30522), 335_174_458, aliases=("bert-large",), **_BERT),
    # formula: 28996*1024 + 512*1024 + 2*1024 + 2*1024 + 24*12,596,224
    #          + (1024^2 + 1024 + 2048 + 28996) = 333,610,308
    _e("bert-large-cased", "google-bert/bert-large-cased", "bert", "masked-lm",
       _bert(1024, 16, 24, 28996), 333_610_308, **_BERT),
    # cited: 66,985,530 (DistilBertForMaskedLM); formula: 30522*768 + 512*768 + 2*768
    #        + 6*7,087,872 + (768^2 + 768 + 2*768 + 30522)
    _e("distilbert-base-uncased", "distilbert/distilbert-base-uncased", "distilbert",
       "masked-lm",
       {"activation": "gelu", "attention_dropout": 0.1, "dim": 768, "dropout": 0.1,
        "hidden_dim": 3072, "initializer_range": 0.02, "max_position_embeddings": 512,
        "n_heads": 12, "n_layers": 6, "pad_token_id": 0, "qa_dropout": 0.1,
        "seq_classif_dropout": 0.2, "sinusoidal_pos_embds": False, "tie_weights_": True,
        "vocab_size": 30522},
       66_985_530, aliases=("distilbert",), input_kind="tokens", max_positions=512,
       repeated_layers_key="n_layers"),
    # --- RoBERTa (RobertaForMaskedLM): BERT formula with V=50265, P=514, one token type.
    # cited: 124,697,433 and 355,412,057. max_positions is 512: positions start after pad (1).
    _e("roberta-base", "FacebookAI/roberta-base", "roberta", "masked-lm", _roberta(768, 12, 12),
       124_697_433, **_BERT),
    _e("roberta-large", "FacebookAI/roberta-large", "roberta", "masked-lm",
       _roberta(1024, 16, 24), 355_412_057, **_BERT),
    # --- ALBERT base v2 (AlbertForMaskedLM, no pooler; the 12 layers share one set of weights)
    # formula: E*(V+P+2) + 2E + (E*h + h) + [4(h^2+h) + 2h + 2*h*ff + ff + h + 2h]
    #          + (h*E + E + 2E + V) = 3,906,048 + 99,072 + 7,087,872 + 128,688 = 11,221,680
    # (AlbertModel with its pooler is the widely cited 11,683,584 = 11,221,680 - 128,688 + 590,592)
    _e("albert-base-v2", "albert/albert-base-v2", "albert", "masked-lm",
       {"attention_probs_dropout_prob": 0.0, "bos_token_id": 2, "classifier_dropout_prob": 0.1,
        "embedding_size": 128, "eos_token_id": 3, "hidden_act": "gelu_new",
        "hidden_dropout_prob": 0.0, "hidden_size": 768, "initializer_range": 0.02,
        "inner_group_num": 1, "intermediate_size": 3072, "layer_norm_eps": 1e-12,
        "max_position_embeddings": 512, "num_attention_heads": 12, "num_hidden_groups": 1,
        "num_hidden_layers": 12, "pad_token_id": 0, "type_vocab_size": 2, "vocab_size": 30000},
       11_221_680, aliases=("albert-base",), **_BERT),
    # --- T5 v1.0 (T5ForConditionalGeneration, lm_head tied to the shared embedding):
    # V*d + enc L*(4*d*inner + 2*d*ff + 2d) + 32*H + d + dec L*(8*d*inner + 2*d*ff + 3d) + 32*H + d
    # cited (HF/DeepSpeed docs tables): 60,506,624 / 222,903,552 / 737,668,096; formula agrees.
    _e("t5-small", "google-t5/t5-small", "t5", "seq2seq-lm", _t5(512, 2048, 8, 6),
       60_506_624, **_T5),
    _e("t5-base", "google-t5/t5-base", "t5", "seq2seq-lm", _t5(768, 3072, 12, 12),
       222_903_552, **_T5),
    _e("t5-large", "google-t5/t5-large", "t5", "seq2seq-lm", _t5(1024, 4096, 16, 24),
       737_668_096, **_T5),
    # --- OPT (OPTForCausalLM, lm_head tied): V*wepd + (P+2)*h + L*(4h^2 + 2h*ff + 9h + ff)
    #     + 2h (final LN, absent when do_layer_norm_before=False) + 2*h*wepd (when wepd != h)
    # cited: 125m 125,239,296; 350m 331,196,416; 1.3b 1,315,758,080; 2.7b 2,651,596,800.
    # dtype: float16, huggingface.co/autoevaluate/zero-shot-classification config.json, a copy
    # committed as "Commit files over from facebook/opt-125m repo".
    _dec("opt-125m", "facebook/opt-125m", "opt", _opt(768, 3072, 12, 12, torch_dtype="float16"),
         125_239_296),
    _dec("opt-350m", "facebook/opt-350m", "opt",
         _opt(1024, 4096, 16, 24, do_layer_norm_before=False, word_embed_proj_dim=512),
         331_196_416),
    _dec("opt-1.3b", "facebook/opt-1.3b", "opt", _opt(2048, 8192, 32, 24), 1_315_758_080),
    _dec("opt-2.7b", "facebook/opt-2.7b", "opt", _opt(2560, 10240, 32, 32), 2_651_596_800),
    # formula: 50272*4096 + 2050*4096 + 32*(4*4096^2 + 2*4096*16384 + 9*4096 + 16384) + 8192
    _dec("opt-6.7b", "facebook/opt-6.7b", "opt", _opt(4096, 16384, 32, 32), 6_658_473_984),
    # formula: 50272*5120 + 2050*5120 + 40*(4*5120^2 + 2*5120*20480 + 9*5120 + 20480) + 10240
    _dec("opt-13b", "facebook/opt-13b", "opt", _opt(5120, 20480, 40, 40), 12_853_473_280),
    # --- Pythia (GPTNeoXForCausalLM, untied): 2*V*h + L*(4h^2 + 2h*ff + 9h + ff) + 2h
    # card: the Pythia model cards' table of exact total parameter counts.
    _dec("pythia-70m", "EleutherAI/pythia-70m", "gpt_neox", _pythia(512, 8, 6), 70_426_624),
    # dtype: float16, huggingface.co/EleutherAI/pythia-160m/blob/main/config.json
    _dec("pythia-160m", "EleutherAI/pythia-160m", "gpt_neox",
         {**_pythia(768, 12, 12), "torch_dtype": "float16"},
         162_322_944),
    _dec("pythia-410m", "EleutherAI/pythia-410m", "gpt_neox", _pythia(1024, 16, 24),
         405_334_016),
    _dec("pythia-1b", "EleutherAI/pythia-1b", "gpt_neox", _pythia(2048, 8, 16), 1_011_781_632),
    _dec("pythia-1.4b", "EleutherAI/pythia-1.4b", "gpt_neox", _pythia(2048, 16, 24),
         1_414_647_808),
    _dec("pythia-2.8b", "EleutherAI/pythia-2.8b", "gpt_neox", _pythia(2560, 32, 32),
         2_775_208_960),
    _dec("pythia-6.9b", "EleutherAI/pythia-6.9b", "gpt_neox", _pythia(4096, 32, 32, 50432),
         6_857_302_016),
    # dtype: float16, huggingface.co/EleutherAI/pythia-12b/blob/step6000/config.json (600 bytes,
    # the size of the main branch's config.json)
    _dec("pythia-12b", "EleutherAI/pythia-12b", "gpt_neox",
         {**_pythia(5120, 40, 36, 50688), "torch_dtype": "float16"},
         11_846_072_320),
    # --- BLOOM (BloomForCausalLM, tied, ALiBi so no position limit):
    # V*h + 2h + L*(12h^2 + 13h) + 2h
    # card (BLOOM model cards): 1b1 1,065,314,304; 3b 3,002,557,440. cited: 560m 559,214,592;
    # 7b1 7,069,016,064. 1b7 by formula: 250880*2048 + 4096 + 24*(12*2048^2 + 13*2048) + 4096
    _dec("bloom-560m", "bigscience/bloom-560m", "bloom", _bloom(1024, 16, 24), 559_214_592,
         max_positions=None, repeated_layers_key="n_layer"),
    _dec("bloom-1b1", "bigscience/bloom-1b1", "bloom", _bloom(1536, 16, 24), 1_065_314_304,
         max_positions=None, repeated_layers_key="n_layer"),
    _dec("bloom-1b7", "bigscience/bloom-1b7", "bloom", _bloom(2048, 16, 24), 1_722_408_960,
         max_positions=None, repeated_layers_key="n_layer"),
    _dec("bloom-3b", "bigscience/bloom-3b", "bloom", _bloom(2560, 32, 30), 3_002_557_440,
         max_positions=None, repeated_layers_key="n_layer"),
    _dec("bloom-7b1", "bigscience/bloom-7b1", "bloom", _bloom(4096, 32, 30), 7_069_016_064,
         max_positions=None, repeated_layers_key="n_layer"),
    # --- Falcon-7B (multi-query, parallel attention, one LN per block, tied, no biases)
    # formula: V*h + L*(h*(h + 2*64) + h^2 + 8h^2 + 2h) + 2h
    #        = 65024*4544 + 32*207,070,080 + 9088 = 6,921,720,704 (hub shows 6.92B)
    # dtype: bfloat16, huggingface.co/justinpinkney/falcon-7b config.json ("Duplicate from
    # tiiuae/falcon-7b", the RW-era revision)
    _dec("falcon-7b", "tiiuae/falcon-7b", "falcon",
         {"alibi": False, "apply_residual_connection_post_layernorm": False,
          "attention_dropout": 0.0, "bias": False, "bos_token_id": 11, "eos_token_id": 11,
          "hidden_dropout": 0.0, "hidden_size": 4544, "initializer_range": 0.02,
          "layer_norm_epsilon": 1e-05, "multi_query": True, "new_decoder_architecture": False,
          "num_attention_heads": 71, "num_hidden_layers": 32, "parallel_attn": True,
          "torch_dtype": "bfloat16", "vocab_size": 65024},
         6_921_720_704, max_positions=2048),
    # --- Llama family (untied unless noted):
    # V*h*(1 or 2) + L*(2*h*H*d + 2*h*kv*d + 3*h*ff + 2h) + h, d = head dim
    # cited: TinyLlama 1,100,048,384
    _dec("tinyllama-1.1b", "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", "llama",
         _llama(2048, 5632, 22, 32, 4, vocab=32000, max_pos=2048, **_LLAMA2), 1_100_048_384,
         aliases=("tinyllama",)),
    # cited: 6,738,415,616 / 13,015,864,320 / 68,976,648,192 (hub safetensors totals)
    # dtype: float16 for all three: scaleapi/llm-engine model-engine/tests/unit/domain/
    # test_llm_use_cases.py (the three configs, "_name_or_path" meta-llama/Llama-2-*-hf) and a
    # transformers log loading models--meta-llama--Llama-2-7b-hf/snapshots/.../config.json.
    _dec("llama-2-7b", "meta-llama/Llama-2-7b-hf", "llama",
         _llama(4096, 11008, 32, 32, 32, vocab=32000, max_pos=4096, torch_dtype="float16",
                **_LLAMA2), 6_738_415_616,
         aliases=("llama2-7b",)),
    _dec("llama-2-13b", "meta-llama/Llama-2-13b-hf", "llama",
         _llama(5120, 13824, 40, 40, 40, vocab=32000, max_pos=4096, torch_dtype="float16",
                **_LLAMA2), 13_015_864_320,
         aliases=("llama2-13b",)),
    _dec("llama-2-70b", "meta-llama/Llama-2-70b-hf", "llama",
         _llama(8192, 28672, 80, 64, 8, vocab=32000, max_pos=4096, torch_dtype="float16",
                **_LLAMA2), 68_976_648_192,
         aliases=("llama2-70b",)),
    # hub: 8,030,261,248 / 70,553,706,496 (3.1 has the same shapes as 3)
    # dtype: bfloat16 (3-8B, 3-70B): scaleapi/llm-engine test_llm_use_cases.py's copies of
    # their configs; (3.1-8B): the config a vLLM helper script prints after
    # AutoModel.from_pretrained("meta-llama/Llama-3.1-8B"). 3.1-70B/405B and 3.2 unchecked, so
    # it is not in _LLAMA3.
    _dec("llama-3-8b", "meta-llama/Meta-Llama-3-8B", "llama",
         _llama(4096, 14336, 32, 32, 8, vocab=128256, max_pos=8192, torch_dtype="bfloat16",
                **_LLAMA3), 8_030_261_248,
         aliases=("llama3-8b",)),
    _dec("llama-3-70b", "meta-llama/Meta-Llama-3-70B", "llama",
         _llama(8192, 28672, 80, 64, 8, vocab=128256, max_pos=8192, torch_dtype="bfloat16",
                **_LLAMA3), 70_553_706_496,
         aliases=("llama3-70b",)),
    _dec("llama-3.1-8b", "meta-llama/Llama-3.1-8B", "llama",
         _llama(4096, 14336, 32, 32, 8, vocab=128256, max_pos=131072,
                rope_scaling=_llama3_rope(8.0), torch_dtype="bfloat16", **_LLAMA3),
         8_030_261_248, aliases=("llama3.1-8b", "meta-llama/Meta-Llama-3.1-8B")),
    _dec("llama-3.1-70b", "meta-llama/Llama-3.1-70B", "llama",
         _llama(8192, 28672, 80, 64, 8, vocab=128256, max_pos=131072,
                rope_scaling=_llama3_rope(8.0), **_LLAMA3),
         70_553_706_496, aliases=("llama3.1-70b", "meta-llama/Meta-Llama-3.1-70B")),
    # hub: 405,853,388,800
    _dec("llama-3.1-405b", "meta-llama/Llama-3.1-405B", "llama",
         _llama(16384, 53248, 126, 128, 8, vocab=128256, max_pos=131072,
                rope_scaling=_llama3_rope(8.0), **_LLAMA3),
         405_853_388_800, aliases=("llama3.1-405b", "meta-llama/Meta-Llama-3.1-405B")),
    # hub: 1,235,814,400 / 3,212,749,824 (tied embeddings, explicit head_dim)
    _dec("llama-3.2-1b", "meta-llama/Llama-3.2-1B", "llama",
         _llama(2048, 8192, 16, 32, 8, vocab=128256, max_pos=131072, head_dim=64,
                rope_scaling=_llama3_rope(32.0), **{**_LLAMA3, "tie_word_embeddings": True}),
         1_235_814_400, aliases=("llama3.2-1b",)),
    _dec("llama-3.2-3b", "meta-llama/Llama-3.2-3B", "llama",
         _llama(3072, 8192, 28, 24, 8, vocab=128256, max_pos=131072, head_dim=128,
                rope_scaling=_llama3_rope(32.0), **{**_LLAMA3, "tie_word_embeddings": True}),
         3_212_749_824, aliases=("llama3.2-3b",)),
    # --- Mistral / Mixtral. cited: 7,241,732,096 (v0.1), 7,248,023,552 (v0.3, V=32768)
    # dtype: bfloat16 (v0.1): the MistralConfig printed after loading mistralai/Mistral-7B-v0.1,
    # and mlc-ai/mlc-llm model_preset.py "mistral_7b". v0.3 unchecked.
    _dec("mistral-7b-v0.1", "mistralai/Mistral-7B-v0.1", "mistral",
         _llama(4096, 14336, 32, 32, 8, vocab=32000, max_pos=32768, bos_token_id=1,
                eos_token_id=2, rope_theta=10000.0, sliding_window=4096, torch_dtype="bfloat16"),
         7_241_732_096, aliases=("mistral-7b",)),
    _dec("mistral-7b-v0.3", "mistralai/Mistral-7B-v0.3", "mistral",
         _llama(4096, 14336, 32, 32, 8, vocab=32768, max_pos=32768, bos_token_id=1,
                eos_token_id=2, rope_theta=1000000.0, sliding_window=None),
         7_248_023_552),
    # dtype: bfloat16, scaleapi/llm-engine test_llm_use_cases.py and AI-Hypercomputer/maxtext
    # hf_model_configs.py (mixtral_8x7b_dict) copies of the config.
    # cited (model card 46.7B): 46,702,792,704 =
    # 2*V*h + L*(2h^2 + 2*h*1024 + 8*3*h*ff + 8h + 2h) + h
    _dec("mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1", "mixtral",
         _llama(4096, 14336, 32, 32, 8, vocab=32000, max_pos=32768, bos_token_id=1,
                eos_token_id=2, rope_theta=1000000.0, sliding_window=None,
                num_experts_per_tok=2, num_local_experts=8, router_aux_loss_coef=0.02,
                torch_dtype="bfloat16"),
         46_702_792_704),
    # --- Qwen2.5 (q/k/v biases; tied for 0.5b/1.5b/3b, untied for 7b/14b)
    # hub: 494,032,768 / 1,543,714,304 / 3,085,938,688 / 7,615,616,512 / 14,770,033,664;
    # formula: Llama formula + (H + 2*kv)*d q/k/v bias per layer.
    # dtype: bfloat16 (1.5b/3b/7b): config.json rebuilt byte for byte, its git blob id equal to
    # the one zetsunozomi/Pier-LLM-Pretraining experiments/qwen/pins.json records for the hub
    # revisions 8faed761 / 3aab1f19 / d1497293 (float16 and float32 give other ids). 0.5b/14b
    # unchecked.
    _dec("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", "qwen2",
         _qwen25(896, 4864, 24, 14, 2, vocab=151936, max_pos=32768, max_window_layers=24,
                 tie_word_embeddings=True),
         494_032_768),
    _dec("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B", "qwen2",
         _qwen25(1536, 8960, 28, 12, 2, vocab=151936, max_pos=131072, max_window_layers=28,
                 tie_word_embeddings=True, torch_dtype="bfloat16"),
         1_543_714_304),
    _dec("qwen2.5-3b", "Qwen/Qwen2.5-3B", "qwen2",
         _qwen25(2048, 11008, 36, 16, 2, vocab=151936, max_pos=32768, max_window_layers=36,
                 tie_word_embeddings=True, torch_dtype="bfloat16"),
         3_085_938_688),
    _dec("qwen2.5-7b", "Qwen/Qwen2.5-7B", "qwen2",
         _qwen25(3584, 18944, 28, 28, 4, vocab=152064, max_pos=131072, max_window_layers=28,
                 torch_dtype="bfloat16"),
         7_615_616_512),
    _dec("qwen2.5-14b", "Qwen/Qwen2.5-14B", "qwen2",
         _qwen25(5120, 13824, 48, 40, 8, vocab=152064, max_pos=131072, max_window_layers=48,
                 eps=1e-05),
         14_770_033_664),
    # --- Qwen3 (no q/k/v bias, RMSNorm on q and k per head, head_dim 128)
    # cited: 596,049,920 (0.6b, tied) and 8,190,735,360 (8b); Llama formula + 2*d per layer.
    _dec("qwen3-0.6b", "Qwen/Qwen3-0.6B", "qwen3",
         _llama(1024, 3072, 28, 16, 8, vocab=151936, max_pos=40960, eps=1e-06, head_dim=128,
                attention_bias=False, bos_token_id=151643, eos_token_id=151645,
                max_window_layers=28, rope_theta=1000000.0, sliding_window=None,
                tie_word_embeddings=True, use_sliding_window=False),
         596_049_920),
    _dec("qwen3-8b", "Qwen/Qwen3-8B", "qwen3",
         _llama(4096, 12288, 36, 32, 8, vocab=151936, max_pos=40960, eps=1e-06, head_dim=128,
                attention_bias=False, bos_token_id=151643, eos_token_id=151645,
                max_window_layers=36, rope_theta=1000000.0, sliding_window=None,
                use_sliding_window=False),
         8_190_735_360),
    # --- Gemma (tied, head_dim 256; gemma-2b is multi-query). hub: 2,506,172,416 and
    # 8,537,680,896. The checkpoints' config.json say hidden_act "gelu" plus
    # hidden_activation "gelu_pytorch_tanh"; transformers maps both to the value used here.
    # dtype: bfloat16 (2b): a copy of google/gemma-2b's config in a diffusion loader
    # (load_gemma2) and mlc-ai/mlc-llm model_preset.py "gemma_2b"; (7b): the GemmaConfig printed
    # after loading google/gemma-7b.
    _dec("gemma-2b", "google/gemma-2b", "gemma",
         _llama(2048, 16384, 18, 8, 1, vocab=256000, max_pos=8192, eps=1e-06, head_dim=256,
                hidden_act="gelu_pytorch_tanh", attention_bias=False, bos_token_id=2,
                eos_token_id=1, pad_token_id=0, rope_theta=10000.0, tie_word_embeddings=True,
                torch_dtype="bfloat16"),
         2_506_172_416),
    _dec("gemma-7b", "google/gemma-7b", "gemma",
         _llama(3072, 24576, 28, 16, 16, vocab=256000, max_pos=8192, eps=1e-06, head_dim=256,
                hidden_act="gelu_pytorch_tanh", attention_bias=False, bos_token_id=2,
                eos_token_id=1, pad_token_id=0, rope_theta=10000.0, tie_word_embeddings=True,
                torch_dtype="bfloat16"),
         8_537_680_896),
    # --- Phi (PhiForCausalLM: biases everywhere, LayerNorm, untied head with bias):
    # 2*V*h + V + L*(4h^2 + 2h*ff + 7h + ff) + 2h. cited: phi-1.5 1,418,270,720; phi-2
    # 2,779,683,840. dtype: float16 for both (in _phi): phi-2's config.json as quoted by the
    # experimental_experiment Phi-2 export example and mlc-ai/mlc-llm "phi-2"; the PhiConfig
    # printed after loading microsoft/phi-1_5, and mlc-llm "phi-1_5".
    _dec("phi-1.5", "microsoft/phi-1_5", "phi", _phi(2048, 24, 0.5, 0.0), 1_418_270_720,
         aliases=("phi-1_5",)),
    _dec("phi-2", "microsoft/phi-2", "phi", _phi(2560, 32, 0.4, 0.1), 2_779_683_840),
    # --- Phi-3-mini-4k (fused qkv and gate_up projections, untied). cited: 3,821,079,552
    # dtype: bfloat16, scaleapi/llm-engine test_llm_use_cases.py's copy of its config.json.
    _dec("phi-3-mini-4k", "microsoft/Phi-3-mini-4k-instruct", "phi3",
         _llama(3072, 8192, 32, 32, 32, vocab=32064, max_pos=4096, attention_bias=False,
                bos_token_id=1, embd_pdrop=0.0, eos_token_id=32000,
                original_max_position_embeddings=4096, pad_token_id=32000, resid_pdrop=0.0,
                rope_theta=10000.0, sliding_window=2047, torch_dtype="bfloat16"),
         3_821_079_552, aliases=("phi-3-mini",)),
    # --- ViT (ViTForImageClassification, no pooler):
    # h + 197h + 768h + h + L*(4h^2 + 2h*ff + 9h + ff) + 2h + 1000h + 1000
    # cited: 86,567,656 and 304,326,632
    _e("vit-base-patch16-224", "google/vit-base-patch16-224", "vit", "image-classification",
       _vit(768, 12, 12), 86_567_656, aliases=("vit-base", "vit-b-16"),
       repeated_layers_key="num_hidden_layers", **_IMG),
    _e("vit-large-patch16-224", "google/vit-large-patch16-224", "vit", "image-classification",
       _vit(1024, 16, 24), 304_326_632, aliases=("vit-large", "vit-l-16"),
       repeated_layers_key="num_hidden_layers", **_IMG),
    # --- BEiT base (BeitForImageClassification; relative position bias per layer,
    # layer scale, mean pooling). cited: 86,530,984; formula:
    # h + 768h + h + L*(4h^2 + 2h*ff + 10h + ff + (27*27 + 3)*H) + 2h + 1000h + 1000
    _e("beit-base-patch16-224", "microsoft/beit-base-patch16-224", "beit",
       "image-classification",
       {**_vit(768, 12, 12), "drop_path_rate": 0.1, "layer_scale_init_value": 0.1,
        "use_absolute_position_embeddings": False, "use_mask_token": False,
        "use_mean_pooling": True, "use_relative_position_bias": True,
        "use_shared_relative_position_bias": False, "vocab_size": 8192},
       86_530_984, aliases=("beit-base",), repeated_layers_key="num_hidden_layers", **_IMG),
    # --- Whisper (WhisperForConditionalGeneration, proj_out tied to the decoder embedding).
    # enc: 3*mel*d + d + 3d^2 + d + 1500d + L*(4d^2 + 2d*ff + 8d + ff) + 2d
    # dec: V*d + 448d + L*(8d^2 + 2d*ff + 13d + ff) + 2d
    # cited: 37,760,640 / 72,593,920 / 241,734,912 / 763,857,920 / 1,543,490,560
    _e("whisper-tiny", "openai/whisper-tiny", "whisper", "speech-seq2seq", _whisper(384, 4, 6),
       37_760_640, **_AUDIO),
    _e("whisper-base", "openai/whisper-base", "whisper", "speech-seq2seq", _whisper(512, 6, 8),
       72_593_920, **_AUDIO),
    _e("whisper-small", "openai/whisper-small", "whisper", "speech-seq2seq",
       _whisper(768, 12, 12), 241_734_912, **_AUDIO),
    _e("whisper-medium", "openai/whisper-medium", "whisper", "speech-seq2seq",
       _whisper(1024, 24, 16), 763_857_920, **_AUDIO),
    _e("whisper-large-v3", "openai/whisper-large-v3", "whisper", "speech-seq2seq",
       _whisper(1280, 32, 20, mel=128, vocab=51866), 1_543_490_560, **_AUDIO),
    # --- memfit.models.zoo CNNs. card: torchvision's documented num_params for resnet18 / resnet50.
    _e("resnet-18", None, None, "image-classification", {"arch": "resnet18", "num_classes": 1000},
       11_689_512, aliases=("resnet18",), repeated_layers_key=None, **_IMG),
    _e("resnet-50", None, None, "image-classification", {"arch": "resnet50", "num_classes": 1000},
       25_557_032, aliases=("resnet50",), repeated_layers_key=None, **_IMG),
]
# fmt: on
