"""Runs whose parameters mix dtypes, read by the callbacks as loaded (memfit.models.loaded): a
bf16 llama with peft's fp32 LoRA adapters (peft's default, `autocast_adapter_dtype=True`)
under a real Trainer(bf16=True) and a Lightning fit with precision "bf16-mixed", on CPU.

Before, the callbacks read such a run as "bf16-mixed" and the trace cast every parameter to
fp32: the frozen base was estimated at twice its bytes (121,344 B of parameters instead of
64,000 B) and the CPU measurement disagreed by -13.46 %.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import memfit  # noqa: E402
from memfit.errors import BadInputError  # noqa: E402
from memfit.integrations._reading import precision_of  # noqa: E402
from memfit.integrations._session import AGREEMENT  # noqa: E402
from memfit.integrations.transformers import MemfitCallback  # noqa: E402
from memfit.models.loaded import mark_as_loaded  # noqa: E402
from tests.integrations.test_transformers import _args, _quiet, _Tokens, _train  # noqa: E402

SEQ, BATCH, VOCAB, HIDDEN, FFN, LAYERS, RANK = 32, 4, 128, 32, 64, 2, 4
BLOCK = 512  # the CUDA caching allocator's rounding of every storage


def _ceil(nbytes: int) -> int:
    return -(-nbytes // BLOCK) * BLOCK


def llama_lora_bf16() -> torch.nn.Module:
    """A 2-layer llama loaded in bf16, LoRA r=4 on q_proj and v_proj through peft (adapters
    kept in fp32 by peft's default)."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2 * SEQ,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM._from_config(
        cfg, attn_implementation="eager", dtype=torch.bfloat16
    )
    lora = peft.LoraConfig(r=RANK, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return peft.get_peft_model(model, lora)


#: By hand. The base, bf16 (2 B), frozen: embed_tokens and lm_head (128 x 32, untied), per
#: layer q/k/v/o_proj (32 x 32), gate/up_proj (64 x 32), down_proj (32 x 64) and two RMSNorm
#: weights (32: one 512 B block each), and the final norm.
BASE_BYTES = (
    2 * _ceil(VOCAB * HIDDEN * 2)
    + LAYERS
    * (4 * _ceil(HIDDEN * HIDDEN * 2) + 3 * _ceil(HIDDEN * FFN * 2) + 2 * _ceil(HIDDEN * 2))
    + _ceil(HIDDEN * 2)
)
#: The adapters, fp32 (4 B): lora_A (4 x 32) and lora_B (32 x 4) on 2 modules of 2 layers.
ADAPTERS = 2 * LAYERS * 2
ADAPTER_BYTES = ADAPTERS * _ceil(RANK * HIDDEN * 4)
#: fp32 gradients of the adapters; fused AdamW's exp_avg and exp_avg_sq (fp32, as the
#: parameter) and its `step` (a float32 scalar on the device when fused) per adapter.
GRADIENT_BYTES = ADAPTER_BYTES
OPTIMIZER_BYTES = 2 * ADAPTER_BYTES + ADAPTERS * BLOCK


def test_hand_counts():
    assert BASE_BYTES == 59_904 and ADAPTER_BYTES == 4_096 and OPTIMIZER_BYTES == 12_288


def _state_bytes(est: memfit.Estimate) -> tuple[int, int, int]:
    rec = est.records_summary
    return rec["parameters"], rec["gradients"], rec["optimizer_state"]


def test_trainer_bf16_base_with_fp32_adapters_is_estimated_as_loaded(tmp_path):
    lines: list[str] = []
    cb = MemfitCallback(print_fn=lines.append)
    _train(llama_lora_bf16(), _args(tmp_path, bf16=True), [cb])
    # bf16=True is autocast: "bf16-mixed", over the dtypes the model was loaded in.
    w = memfit.Workload(batch_size=BATCH, seq_len=SEQ, precision="bf16-mixed",
                        optimizer="adamw-fused")  # fmt: skip
    assert cb.estimate.workload == w
    assert _state_bytes(cb.estimate) == (BASE_BYTES + ADAPTER_BYTES, GRADIENT_BYTES,
                                         OPTIMIZER_BYTES)  # fmt: skip
    # memfit.estimate of the same configuration: the real (not meta) model, marked as loaded,
    # with memfit's own batch instead of the Trainer's.
    want = memfit.estimate(mark_as_loaded(llama_lora_bf16()), w)
    assert cb.estimate.profile.peak_allocated_bytes == want.profile.peak_allocated_bytes
    assert cb.estimate.profile.breakdown == want.profile.breakdown
    assert cb.estimate.trainable_parameter_count == want.trainable_parameter_count == 1_024
    assert ("parameters as loaded, each in its own dtype: trainable 1,024 float32; frozen "
            "28,832 bfloat16.") in cb.estimate.notes  # fmt: skip
    # The CPU run holds what the estimate says (CPU autocast runs the same matmuls in bf16).
    c = cb.comparison
    assert c.estimated == 624_128 and c.measured == 628_736  # +0.74 %
    assert abs(c.relative) <= AGREEMENT
    # Unmarked, the precision casts the base to fp32 (the estimate before): every storage
    # twice its bytes but the 2 x 2 + 1 RMSNorm weights, whose 128 B still fill one block.
    cast = memfit.estimate(llama_lora_bf16(), w)
    norms = (2 * LAYERS + 1) * BLOCK
    assert _state_bytes(cast)[0] == 2 * (BASE_BYTES - norms) + norms + ADAPTER_BYTES == 121_344


def test_precision_of_reads_autocast_over_the_loaded_dtypes():
    model = llama_lora_bf16()
    who = "TrainingArguments"
    assert precision_of(model, "bfloat16", who=who) == "bf16-mixed"
    assert precision_of(model, None, who=who) == "bf16-true"  # no autocast: bf16 matmuls
    assert precision_of(model.float(), None, who=who) == "fp32"
    assert precision_of(model, "float16", who=who) == "fp16-mixed"  # fp32 trainables: fine
    with pytest.raises(BadInputError, match="unscale fp16 gradients"):
        precision_of(model.half(), "float16", who=who)
    with pytest.raises(BadInputError, match=r"\['torch.float16'\] and TrainingArguments runs"):
        precision_of(model, "bfloat16", who=who)
    model.base_model.model.lm_head.to(torch.bfloat16)
    with pytest.raises(BadInputError, match="both float16 and bfloat16"):
        precision_of(model, None, who=who)


def test_lightning_bf16_mixed_over_a_bf16_base_with_fp32_adapters():
    L = pytest.importorskip("lightning")
    from memfit.integrations.lightning import MemfitCallback as LightningCallback

    class LoraLM(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = llama_lora_bf16()

        def training_step(self, batch, batch_idx):
            return self.model(**batch).loss

        def configure_optimizers(self):
            trainable = [p for p in self.parameters() if p.requires_grad]
            return torch.optim.AdamW(trainable, lr=1e-3, fused=True)

    cb = LightningCallback(print_fn=_quiet)
    trainer = L.Trainer(
        accelerator="cpu", max_steps=2, callbacks=[cb], logger=False, precision="bf16-mixed",
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    loader = torch.utils.data.DataLoader(_Tokens(SEQ, VOCAB), batch_size=BATCH)
    trainer.fit(LoraLM(), loader)
    w = memfit.Workload(batch_size=BATCH, seq_len=SEQ, precision="bf16-mixed",
                        optimizer="adamw-fused")  # fmt: skip
    assert cb.estimate.workload == w
    # Lightning zeroes gradients after the next training_step: the trace holds the previous
    # step's beside the new ones (memfit.integrations._lightning_hooks), both fp32.
    assert _state_bytes(cb.estimate) == (BASE_BYTES + ADAPTER_BYTES, 2 * GRADIENT_BYTES,
                                         OPTIMIZER_BYTES)  # fmt: skip
    c = cb.comparison
    assert c.estimated == 624_128 and c.measured == 624_640  # +0.08 %
    assert abs(c.relative) <= AGREEMENT
