"""`memfit.apply_` proven on CPU: gradients equal the baseline's, the model is not double-wrapped,
the saved weights load into the unmodified model, bad input is named."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import transformers

import memfit
from memfit.techniques import (
    AccumulationConfig,
    CheckpointConfig,
    EmbeddingOnCpuConfig,
    FreezeConfig,
    FSDPConfig,
    OptimizerConfig,
    PrecisionConfig,
    TieEmbeddingsConfig,
    configs_from_workload,
)
from memfit.techniques.apply import apply_
from memfit.techniques.weights_io import load_weights
from tests.conftest import tiny_gpt2

VOCAB, SEQ = 100, 16


def tiny_llama(tied: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
        num_hidden_layers=2, vocab_size=VOCAB, tie_word_embeddings=tied,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="eager")


def batch(n: int = 4, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    return {"input_ids": ids, "labels": ids}


def grads_after(model: torch.nn.Module, configs, b) -> dict[str, torch.Tensor]:
    """Gradients of one step's backward (no optimizer) under `configs`."""
    setup = apply_(model, configs)
    setup.step(b)  # no OptimizerConfig: gradients stay
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_checkpointing_gradients_bit_exact():
    base = grads_after(tiny_gpt2(), [], batch())
    for policy in ("full", "selective"):
        ck = grads_after(tiny_gpt2(), [CheckpointConfig(policy=policy)], batch())
        assert base.keys() == ck.keys()
        for k in base:
            assert torch.equal(base[k], ck[k]), (policy, k)


def test_accumulation_equals_one_big_batch():
    base = grads_after(tiny_gpt2(), [], batch(8))
    acc = grads_after(tiny_gpt2(), [AccumulationConfig(steps=4)], batch(8))
    for k in base:
        torch.testing.assert_close(acc[k], base[k], rtol=1e-5, atol=1e-7)


def test_accumulation_uneven_split_weights_by_samples():
    # 7 samples in 3 micro-batches (3, 2, 2): each loss weighted by its share of samples.
    # GPT-2's loss is a mean over tokens; every sample has the same number of tokens here.
    base = grads_after(tiny_gpt2(), [], batch(7))
    acc = grads_after(tiny_gpt2(), [AccumulationConfig(steps=3)], batch(7))
    for k in base:
        torch.testing.assert_close(acc[k], base[k], rtol=1e-5, atol=1e-7)


def test_tied_embeddings_one_parameter_one_gradient():
    model = tiny_llama(tied=False)
    n_before = sum(p.numel() for p in model.parameters())
    setup = apply_(model, [TieEmbeddingsConfig(), OptimizerConfig(name="sgd", lr=0.1)])
    assert model.lm_head.weight is model.model.embed_tokens.weight
    # One VOCAB x 32 matrix fewer.
    assert sum(p.numel() for p in model.parameters()) == n_before - VOCAB * 32
    assert setup.optimizer is not None
    opt_params = [p for g in setup.optimizer.param_groups for p in g["params"]]
    assert sum(p is model.lm_head.weight for p in opt_params) == 1
    model(**batch()).loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(grads) == len(list(model.parameters()))
    assert model.lm_head.weight.grad is model.model.embed_tokens.weight.grad


def test_embedding_on_cpu_gradients_equal_and_hooked_once():
    base = grads_after(tiny_llama(), [], batch())
    model = tiny_llama()
    apply_(model, [EmbeddingOnCpuConfig()])
    got = grads_after(model, [EmbeddingOnCpuConfig()], batch())  # applied twice
    emb = model.model.embed_tokens
    assert emb.weight.device.type == "cpu"
    assert len(emb._forward_hooks) == 1 and len(emb._forward_pre_hooks) == 1
    for k in base:
        assert torch.equal(base[k], got[k]), k


def test_lora_freezes_base_and_starts_at_the_base_output():
    pytest.importorskip("peft")
    model = tiny_llama()
    ref = copy.deepcopy(model)
    b = batch()
    setup = apply_(model, [memfit.LoraConfig(rank=4), OptimizerConfig(name="adamw")])
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)
    # 2 layers x 7 linear layers (q, k, v, o, gate, up, down), each with A (4 x in), B (out x 4).
    lin = [(32, 32)] * 4 + [(32, 64), (32, 64), (64, 32)]
    expected = 2 * sum(4 * i + o * 4 for i, o in lin)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == expected
    with torch.no_grad():
        assert torch.equal(model(**b).logits, ref(**b).logits)  # B = 0 at init
    setup.step(b)
    apply_(model, [memfit.LoraConfig(rank=4)])  # the same adapters again: no-op
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == expected
    with pytest.raises(memfit.BadInputError, match="already has LoRA adapters of rank"):
        apply_(model, [memfit.LoraConfig(rank=8)])


def test_precision_recipes():
    model = tiny_gpt2()
    s = apply_(model, [PrecisionConfig(precision="bf16-true")])
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert s.autocast_dtype is None and s.scaler is None
    s = apply_(tiny_gpt2(), [PrecisionConfig(precision="fp16-mixed"), OptimizerConfig()])
    assert s.autocast_dtype == torch.float16 and s.scaler is not None
    s = apply_(tiny_gpt2(), [PrecisionConfig(precision="bf16-mixed"), OptimizerConfig()])
    assert s.autocast_dtype == torch.bfloat16 and s.scaler is None
    loss = s.step(batch())
    assert isinstance(loss, float) and loss > 0


def test_step_trains_and_keeps_no_graph():
    model = tiny_gpt2()
    setup = apply_(model, [CheckpointConfig(), AccumulationConfig(steps=2), OptimizerConfig()])
    before = model.transformer.h[0].attn.c_attn.weight.detach().clone()
    losses = [setup.step(batch()) for _ in range(3)]
    assert all(isinstance(x, float) for x in losses)
    assert not torch.equal(before, model.transformer.h[0].attn.c_attn.weight)
    assert all(p.grad is None for p in model.parameters())  # zero_grad(set_to_none=True)


def test_apply_twice_does_not_double_wrap():
    from torch.utils.flop_counter import FlopCounterMode

    def step_flops(model) -> int:
        with FlopCounterMode(display=False) as fc:
            model(**batch()).loss.backward()
        return fc.get_total_flops()

    once = tiny_gpt2()
    apply_(once, [CheckpointConfig()])
    twice = tiny_gpt2()
    apply_(twice, [CheckpointConfig()])
    apply_(twice, [CheckpointConfig()])
    assert step_flops(once) == step_flops(twice)


def test_recompute_flops_equal_the_estimate():
    """Checkpointing's recomputation, counted with FlopCounterMode on the applied model,
    equals the recompute FLOPs memfit's estimate predicts for that workload."""
    from torch.utils.flop_counter import FlopCounterMode

    def step_flops(model) -> int:
        with FlopCounterMode(display=False) as fc:
            model(**batch()).loss.backward()
        return fc.get_total_flops()

    plain = step_flops(tiny_gpt2(4))
    model = tiny_gpt2(4)
    apply_(model, [CheckpointConfig(first=3)])
    measured = step_flops(model) - plain
    w = memfit.Workload(
        batch_size=4, seq_len=SEQ, attention="eager", optimizer="none",
        checkpointing="blocks", checkpoint_first=3,
    )  # fmt: skip
    est = memfit.estimate(tiny_gpt2(4), w)
    assert measured > 0
    assert est.flops["recompute"] == measured


def test_saved_weights_load_into_the_unmodified_model(tmp_path):
    pytest.importorskip("peft")
    model = tiny_llama(tied=False)
    setup = apply_(
        model,
        [TieEmbeddingsConfig(), CheckpointConfig(), memfit.LoraConfig(rank=4),
         OptimizerConfig(name="adamw", lr=0.05)],
    )  # fmt: skip
    for _ in range(2):
        setup.step(batch())
    path = str(tmp_path / "model.safetensors")
    setup.save(path)
    fresh = tiny_llama(tied=False)
    load_weights(fresh, path)
    b = batch(seed=3)
    with torch.no_grad():
        torch.testing.assert_close(fresh(**b).logits, model(**b).logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(fresh.lm_head.weight, fresh.model.embed_tokens.weight)
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        assert "lm_head.weight" not in set(f.keys())  # stored once
        assert not [k for k in f.keys() if "lora" in k]  # noqa: SIM118


def test_configs_from_a_workload_and_a_plan():
    w = memfit.Workload(
        precision="bf16-mixed", grad_accum=4, checkpointing="blocks", checkpoint_first=2,
        optimizer="adafactor",
    )  # fmt: skip
    # In the order reports list them; apply_ runs them in its own order.
    assert configs_from_workload(w, lr=0.01) == [
        AccumulationConfig(steps=4),
        CheckpointConfig(first=2),
        OptimizerConfig(name="adafactor", lr=0.01),
        PrecisionConfig(precision="bf16-mixed"),
    ]
    setup = apply_(tiny_gpt2(), w)
    assert setup.grad_accum == 4
    assert isinstance(setup.optimizer, torch.optim.Adafactor)


# ---------------------------------------------------------------------------- bad input


def test_plan_for_another_architecture():
    with pytest.raises(memfit.BadInputError, match=r"do not exist in GPT2LMHeadModel"):
        apply_(tiny_gpt2(), [CheckpointConfig(blocks=("model.layers.0",))])


def test_eight_bit_optimizer_names_the_extra():
    pytest.importorskip("torch")
    try:
        import bitsandbytes  # noqa: F401

        pytest.skip("bitsandbytes is installed")
    except ImportError:
        pass
    with pytest.raises(ImportError, match=r"memfit\[bnb\]"):
        apply_(tiny_gpt2(), [OptimizerConfig(name="adamw-8bit")])


def test_fsdp_without_process_group():
    with pytest.raises(memfit.BadInputError, match="init_process_group"):
        apply_(tiny_gpt2(), [FSDPConfig()])


def test_bad_configs():
    with pytest.raises(memfit.BadInputError, match="Two different PrecisionConfigs"):
        apply_(tiny_gpt2(), [PrecisionConfig(precision="fp16-mixed"), PrecisionConfig()])
    with pytest.raises(memfit.BadInputError, match="not a technique config"):
        apply_(tiny_gpt2(), ["checkpointing"])
    with pytest.raises(memfit.BadInputError, match="match no parameter"):
        apply_(tiny_gpt2(), [FreezeConfig(prefixes=("encoder",))])
    with pytest.raises(memfit.BadInputError, match="offload_optimizer"):
        apply_(tiny_gpt2(), memfit.Workload(offload_optimizer=True, mode="inference"))
    with pytest.raises(memfit.BadInputError, match="grad_accum is 4"):
        apply_(tiny_gpt2(), [AccumulationConfig(steps=4)]).step(batch(2))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_syncs_only_on_the_last_micro_batch():
    """Under DDP, accumulation runs the first k-1 micro-batches in no_sync(); the gradients are
    those of the whole batch."""
    import contextlib

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group(
        "gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{_free_port()}"
    )
    try:
        base = grads_after(tiny_gpt2(), [], batch(8))
        ddp = DDP(tiny_gpt2())
        entered = []
        original = ddp.no_sync

        @contextlib.contextmanager
        def counting_no_sync():
            entered.append(True)
            with original():
                yield

        ddp.no_sync = counting_no_sync  # type: ignore[method-assign]
        setup = apply_(ddp, [AccumulationConfig(steps=4)])
        setup.step(batch(8))
        assert len(entered) == 3
        got = {n.removeprefix("module."): p.grad for n, p in ddp.named_parameters()}
        for k in base:
            torch.testing.assert_close(got[k], base[k], rtol=1e-5, atol=1e-7)
    finally:
        dist.destroy_process_group()


def test_fsdp2_per_block_on_a_single_process_group():
    """FSDP2 on gloo with one rank: every block and the root are sharded once, and the steps
    give the losses of the unsharded model (one rank: nothing is averaged away)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    dist.init_process_group(
        "gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{_free_port()}"
    )
    try:
        ref = apply_(tiny_gpt2(), [AccumulationConfig(steps=2), OptimizerConfig()])
        model = tiny_gpt2()
        setup = apply_(model, [FSDPConfig(), AccumulationConfig(steps=2), OptimizerConfig()])
        apply_(model, [FSDPConfig()])  # a second call shards nothing again
        assert isinstance(model, FSDPModule)
        assert all(isinstance(b, FSDPModule) for b in model.transformer.h)
        for _ in range(2):
            b = batch()
            assert setup.step(b) == pytest.approx(ref.step(b), rel=1e-6)
    finally:
        dist.destroy_process_group()


def test_offloaded_optimizer_steps_like_the_plain_one():
    """Optimizer state and update on CPU copies: the same weights as the plain optimizer, and
    the state is held by the CPU copies, not by the model's parameters."""
    from memfit.techniques.offload.cpu_optimizer import CpuOffloadOptimizer

    ref, model = tiny_gpt2(), tiny_gpt2()
    plain = apply_(ref, [OptimizerConfig(name="adamw", lr=0.01)])
    setup = apply_(model, memfit.Workload(optimizer="adamw", offload_optimizer=True), lr=0.01)
    assert isinstance(setup.optimizer, CpuOffloadOptimizer)
    for seed in range(3):
        b = batch(seed=seed)
        assert setup.step(b) == plain.step(b)
    for p, q in zip(ref.parameters(), model.parameters(), strict=True):
        assert torch.equal(p, q)
    inner = setup.optimizer.inner
    held = {id(p) for p in model.parameters()}
    assert inner.state and all(id(p) not in held for p in inner.state)
    assert all(p.grad is None for p in model.parameters())
    assert setup.optimizer.state_dict()["state"].keys() == inner.state_dict()["state"].keys()


def test_seq2seq_shares_encoder_and_decoder_embeddings():
    cfg = transformers.BartConfig(
        vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, max_position_embeddings=32,
    )  # fmt: skip
    model = transformers.BartForConditionalGeneration._from_config(cfg)
    dec = model.get_decoder()
    dec.embed_tokens = torch.nn.Embedding(VOCAB, 16)  # untied, as in a converted checkpoint
    n_before = len(list(model.parameters()))
    apply_(model, [TieEmbeddingsConfig()])
    enc_w = model.get_encoder().embed_tokens.weight
    assert dec.embed_tokens.weight is enc_w
    assert model.lm_head.weight is model.get_input_embeddings().weight
    assert len(list(model.parameters())) == n_before - 1


def test_estimating_an_applied_model_traces_the_copy():
    """memfit.estimate copies a module it is given; the copy's checkpointed blocks must run
    the copy's layers (a closure over the original forward ran the original, real ones)."""
    w = memfit.Workload(batch_size=2, seq_len=SEQ, attention="eager", checkpointing="blocks")
    fresh = memfit.estimate(tiny_gpt2(), w).profile
    model = tiny_gpt2()
    apply_(model, [CheckpointConfig()])
    applied = memfit.estimate(model, w).profile
    assert applied.peak_allocated_bytes == fresh.peak_allocated_bytes
    assert applied.breakdown == fresh.breakdown


def test_offloaded_optimizer_resumes_with_its_learning_rate_and_takes_groups():
    from memfit.techniques.offload.cpu_optimizer import CpuOffloadOptimizer

    model = tiny_gpt2()
    opt = CpuOffloadOptimizer(model.parameters(), lambda g: torch.optim.AdamW(g, lr=1.0))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    for _ in range(3):
        model(**batch()).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
    saved = opt.state_dict()
    assert saved["param_groups"][0]["lr"] == pytest.approx(1e-3)
    fresh = CpuOffloadOptimizer(model.parameters(), lambda g: torch.optim.AdamW(g, lr=1.0))
    fresh.load_state_dict(saved)
    assert fresh.param_groups[0]["lr"] == pytest.approx(1e-3)  # not the initial 1.0
    # Parameter groups keep their options.
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    rest = [p for n, p in model.named_parameters() if p.dim() <= 1]
    grouped = CpuOffloadOptimizer(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lambda g: torch.optim.AdamW(g, lr=1e-3),
    )
    assert [g["weight_decay"] for g in grouped.inner.param_groups] == [0.1, 0.0]


def test_fp16_true_with_adam_is_refused():
    with pytest.raises(
        memfit.BadInputError, match=r"fp16-true with adamw \(torch.optim.AdamW\) diverges"
    ):
        apply_(tiny_gpt2(), memfit.Workload(precision="fp16-true", optimizer="adamw"))


def test_embedding_on_cpu_refuses_tied_weights():
    with pytest.raises(memfit.BadInputError, match=r"also lm_head.weight \(tied embeddings\)"):
        apply_(tiny_gpt2(), [EmbeddingOnCpuConfig()])  # GPT-2 ties wte and lm_head
    with pytest.raises(memfit.BadInputError, match="tied embeddings"):
        memfit.estimate("gpt2", memfit.Workload(seq_len=32, embedding_on_cpu=True))


def test_lora_save_after_peft_merge_adds_the_delta_once(tmp_path):
    pytest.importorskip("peft")
    from peft.tuners.lora import LoraLayer

    model = tiny_llama()
    setup = apply_(model, [memfit.LoraConfig(rank=4), OptimizerConfig(name="adamw", lr=0.05)])
    setup.step(batch())  # B != 0 now
    b = batch(seed=5)
    with torch.no_grad():
        want = model(**b).logits
    for m in model.modules():
        if isinstance(m, LoraLayer):
            m.merge()
    path = str(tmp_path / "m.safetensors")
    setup.save(path)
    fresh = tiny_llama()
    load_weights(fresh, path)
    with torch.no_grad():
        torch.testing.assert_close(fresh(**b).logits, want, rtol=1e-5, atol=1e-5)


def test_a_second_checkpoint_policy_is_refused():
    model = tiny_gpt2()
    apply_(model, [CheckpointConfig()])
    with pytest.raises(memfit.BadInputError, match="already checkpointed with another policy"):
        apply_(model, [CheckpointConfig(policy="selective")])


# ------------------------------------------------------------- what any trainer gets


def test_mixed_precision_is_on_the_model_so_any_trainer_gets_it():
    # HF Trainer, Lightning or a user's loop call model(...) themselves, without setup.step:
    # the forward itself runs under autocast, so the logits come out in bf16.
    model = tiny_gpt2()
    setup = apply_(model, [PrecisionConfig(precision="bf16-mixed")])
    ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    assert model(input_ids=ids).logits.dtype == torch.bfloat16
    assert next(model.parameters()).dtype == torch.float32  # fp32 master weights kept
    apply_(model, [PrecisionConfig(precision="bf16-mixed")])  # idempotent: one wrapper
    assert model.forward.args[1] is None  # the partial wraps the class forward, not itself
    unpickled = pickle.loads(pickle.dumps(model))
    assert unpickled(input_ids=ids).logits.dtype == torch.bfloat16
    assert setup.notes == ()  # bf16-mixed leaves nothing to the caller


def test_setup_says_what_it_leaves_to_the_caller_and_the_defaults_it_chose():
    w = memfit.Workload(precision="fp16-mixed", grad_accum=4, optimizer="sgd")
    setup = apply_(tiny_gpt2(), w)
    assert setup.notes == (
        "learning rate: memfit's default 0.001 (pass apply_(..., lr=)).",
        "fp16 loss scaling: setup.step and setup.backward use setup.scaler; another trainer "
        "must scale the loss itself (HF Trainer: fp16=True).",
        "gradient accumulation: setup.step splits each batch into 4 micro-batches; another "
        "trainer needs its own setting (HF Trainer: gradient_accumulation_steps=4).",
        "the optimizer step: setup.step runs it; another trainer takes setup.optimizer "
        "(HF Trainer: optimizers=(setup.optimizer, None)).",
    )
    assert "optimizer sgd, lr 0.001" in setup.techniques
    chosen = apply_(tiny_gpt2(), w, lr=0.05)
    assert chosen.optimizer.defaults["lr"] == 0.05
    assert not any(n.startswith("learning rate") for n in chosen.notes)
    with pytest.raises(memfit.BadInputError, match=r"OptimizerConfig\(lr=\.\.\.\)"):
        apply_(tiny_gpt2(), [OptimizerConfig(name="sgd")], lr=0.05)
