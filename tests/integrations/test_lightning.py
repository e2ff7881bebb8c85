"""`memfit.integrations.lightning` / `.pytorch_lightning`: a real Lightning fit on CPU with the
callback, its estimate against memfit's, the measured steps, and the stop before the first step."""

from __future__ import annotations

import pytest
import torch

L = pytest.importorskip("lightning")
pl = pytest.importorskip("pytorch_lightning")

import memfit  # noqa: E402
from memfit.events import Category  # noqa: E402
from memfit.integrations._session import AGREEMENT  # noqa: E402
from memfit.integrations.lightning import MemfitCallback, WontFitError  # noqa: E402
from tests.conftest import tiny_gpt2  # noqa: E402
from tests.integrations.test_transformers import _Tokens  # noqa: E402

SEQ, BATCH, VOCAB = 32, 4, 100


def _module(base, seq=SEQ, vocab=VOCAB):
    class CausalLM(base):
        def __init__(self):
            super().__init__()
            self.model = tiny_gpt2(2, n_positions=seq, vocab=vocab)

        def forward(self, **batch):
            return self.model(**batch)

        def training_step(self, batch, batch_idx):
            loss = self(**batch).loss
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return CausalLM()


def _fit(lightning, callback, module=None, batch=BATCH, dataset=None, **kw):
    trainer = lightning.Trainer(
        accelerator="cpu", max_steps=2, callbacks=[callback], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, **kw,
    )  # fmt: skip
    module = module or _module(lightning.LightningModule)
    loader = torch.utils.data.DataLoader(dataset or _Tokens(), batch_size=batch)
    trainer.fit(module, loader)
    return trainer, module


def test_lightning_fit_is_estimated_and_measured():
    cb = MemfitCallback(print_fn=lambda _: None)
    _fit(L, cb, accumulate_grad_batches=1)
    w = memfit.Workload(batch_size=BATCH, seq_len=SEQ, optimizer="adamw")
    assert cb.estimate.workload == w
    ref = memfit.estimate(tiny_gpt2(2, n_positions=SEQ), w)
    got, want = cb.estimate.profile.breakdown, ref.profile.breakdown
    for cat in ("parameters", "optimizer_state", "inputs", "workspaces"):
        assert got[cat] == want[cat], cat
    # Lightning zeroes the gradients after the next training_step: they are alive in its
    # forward, where the peak moves (memfit's own loop peaks in backward, without them).
    assert ref.profile.peak_phase == "backward" and want["gradients"] == 0
    assert cb.estimate.profile.peak_phase == "forward"
    assert got["gradients"] == sum(512 * -(-p.numel() * 4 // 512) for p in
                                   tiny_gpt2(2, n_positions=SEQ).parameters())  # fmt: skip
    c = cb.comparison
    assert c.steps == 2 and c.estimated == 1_627_136 and c.measured == 1_643_520  # +1.01 %
    assert abs(c.relative) <= AGREEMENT
    assert cb.session.measurement.profile.peak_phase == "forward"
    assert cb.session.measurement.profile.breakdown[Category.GRADIENTS] == got["gradients"]


def test_pytorch_lightning_namespace():
    from memfit.integrations.pytorch_lightning import MemfitCallback as PLCallback

    cb = PLCallback(print_fn=lambda _: None, measure_steps=0)
    _fit(pl, cb)
    assert cb.estimate.workload == memfit.Workload(batch_size=BATCH, seq_len=SEQ)
    assert cb.comparison is None


def test_a_gpu_too_small_stops_before_the_first_step():
    seq, vocab, batch = 64, 1000, 32
    module = _module(L.LightningModule, seq, vocab)
    before = [p.detach().clone() for p in module.parameters()]
    cb = MemfitCallback(gpu="rtx-4090@560MiB", print_fn=lambda _: None)
    with pytest.raises(WontFitError) as err:
        _fit(L, cb, module=module, batch=batch, dataset=_Tokens(seq, vocab))
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))
    message = str(err.value)
    assert "will not fit NVIDIA GeForce RTX 4090 limited to 0.55 GiB" in message
    assert "batch_size=4 (now 32)" in message and "accumulate_grad_batches=8 (now 1)" in message
    assert err.value.changes["batch_size"] * err.value.changes["accumulate_grad_batches"] == 32


def test_an_out_of_memory_error_in_the_measured_steps_is_explained():
    class Failing(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = tiny_gpt2(2, n_positions=SEQ)

        def training_step(self, batch, batch_idx):
            if batch_idx == 1:  # injected, as a CUDA allocation failure would raise
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
            return self.model(**batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    lines: list[str] = []
    cb = MemfitCallback(print_fn=lines.append)
    with pytest.raises(torch.OutOfMemoryError):
        _fit(L, cb, module=Failing())
    assert not cb.session.measuring
    assert lines[-1].startswith("memfit: out of memory during the measured steps\n")
    assert cb.session.measurement.oom_report in lines[-1]


def test_a_ddp_strategy_is_read_as_ddp_and_fsdp_is_refused():
    from types import SimpleNamespace

    from memfit.errors import BadInputError
    from memfit.integrations._lightning_hooks import read_run

    module = _module(L.LightningModule)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids.clone()}

    def trainer(strategy):
        return SimpleNamespace(world_size=4, strategy=strategy, precision="bf16-mixed",
                               optimizers=[module.configure_optimizers()],
                               accumulate_grad_batches=2)  # fmt: skip

    reading = read_run(trainer(L.pytorch.strategies.DDPStrategy()), module, batch)
    w = reading.workload
    assert (w.gpus, w.ddp, w.grad_accum, w.precision) == (4, True, 2, "bf16-mixed")
    with pytest.raises(BadInputError, match=r"4 processes \(FSDPStrategy\)"):
        read_run(trainer(L.pytorch.strategies.FSDPStrategy()), module, batch)
    cap = read_run(trainer(L.pytorch.strategies.DDPStrategy(bucket_cap_mb=50)), module, batch)
    assert any(n.startswith("DDPStrategy(bucket_cap_mb=50): memfit places") for n in cap.notes)
    with pytest.raises(BadInputError, match="gradient_as_bucket_view=True"):
        read_run(trainer(L.pytorch.strategies.DDPStrategy(gradient_as_bucket_view=True)), module,
                 batch)  # fmt: skip


def test_a_plan_over_several_gpus_names_fsdp2_not_lightnings_fsdp1():
    from types import SimpleNamespace

    from memfit.integrations._lightning_hooks import argument_changes

    trainer = SimpleNamespace(accumulate_grad_batches=1, precision="32-true")
    now = memfit.Workload(batch_size=8, seq_len=SEQ)
    w = memfit.Workload(batch_size=2, seq_len=SEQ, grad_accum=2, gpus=2)
    changes, _notes, other = argument_changes(w, trainer, now)
    assert changes == {"batch_size": 2, "accumulate_grad_batches": 2, "devices": 2}
    assert any("ModelParallelStrategy()" in o and "FSDP1" in o for o in other)


def test_a_module_holding_a_qlora_model_is_read_and_measured(tmp_path):
    """A LightningModule around a model loaded in 4 bits by transformers and wrapped by peft:
    the copy reads each bitsandbytes layer (as the Trainer's callback does), and the measured
    steps agree with the estimate."""
    pytest.importorskip("bitsandbytes")
    peft = pytest.importorskip("peft")
    import transformers

    cfg = transformers.LlamaConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, vocab_size=256, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    quant = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")
    base = transformers.LlamaForCausalLM.from_pretrained(
        tmp_path, quantization_config=quant, dtype=torch.bfloat16, device_map="cpu"
    )
    base = peft.prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
    lora = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))

    class QLoRA(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = lora

        def training_step(self, batch, batch_idx):
            return self.model(**batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad])

    cb = MemfitCallback(print_fn=lambda _: None)
    _fit(L, cb, module=QLoRA(), dataset=_Tokens(vocab=256))
    assert cb.estimate.trainable_parameter_count == 4096  # 2 blocks x 2 x r(128 + 128)
    assert cb.estimate.parameter_count == 397_952  # counted as unquantized
    assert any("NF4 base weights (bitsandbytes), read from the model: 14 linear layers" in n
               for n in cb.estimate.notes)  # fmt: skip
    assert abs(cb.comparison.relative) <= AGREEMENT
