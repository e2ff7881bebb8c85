"""The Trainer's FSDP settings read as memfit's FSDP2 Workload: the model copied at
`on_init_end`, before the Trainer shards it (here sharded for real by FSDP2 over a one-process
gloo group), `fsdp_config` read as accelerate hands it to FSDP2, and what memfit does not model
refused with the setting to change."""

from __future__ import annotations

import socket

import pytest
import torch
from torch.distributed.tensor import DTensor

transformers = pytest.importorskip("transformers")

import memfit  # noqa: E402
from memfit.errors import BadInputError  # noqa: E402
from memfit.integrations._hf_args import read_run  # noqa: E402
from memfit.integrations.transformers import MemfitCallback  # noqa: E402
from memfit.techniques import FSDPConfig  # noqa: E402
from memfit.techniques.parallel.fsdp import shard_model  # noqa: E402

SEQ, BATCH, VOCAB = 32, 4, 256


class _TwoProcesses(transformers.TrainingArguments):
    @property
    def world_size(self) -> int:  # as under `accelerate launch --num_processes 2`
        return 2


def _args(tmp_path, cls=_TwoProcesses, **kw):
    kw.setdefault("fsdp", True)
    kw.setdefault("per_device_train_batch_size", BATCH)
    return cls(str(tmp_path), max_steps=2, use_cpu=True, report_to=[], save_strategy="no", **kw)


def _llama() -> torch.nn.Module:
    cfg = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, vocab_size=VOCAB, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone()}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fsdp_is_read_from_the_copy_made_before_sharding(tmp_path):
    args = _args(tmp_path, bf16=True, fsdp_config={"version": 2, "activation_checkpointing": True})
    model = _llama()
    cb = MemfitCallback(print_fn=lambda _: None)
    cb.on_init_end(args, None, None, model=model)  # the Trainer calls it in __init__
    dist = torch.distributed
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{_port()}")
    try:
        shard_model(model, FSDPConfig())  # as accelerate's prepare does when training begins
        assert isinstance(next(model.parameters()), DTensor)
        optimizer = torch.optim.AdamW(model.parameters())
        reading = read_run(args, model, optimizer, _batch(), unsharded=cb._unsharded)
        with pytest.raises(BadInputError, match="sharded \\(a DTensor\\)"):
            read_run(args, model, optimizer, _batch())  # no copy: the shards cannot be read
    finally:
        dist.destroy_process_group()
    want = memfit.Workload(batch_size=BATCH, seq_len=SEQ, precision="bf16-mixed", gpus=2,
                           fsdp_mixed="accelerate", checkpointing="blocks")  # fmt: skip
    assert reading.workload == want
    got = memfit.estimate(reading.spec, reading.workload)
    ref = memfit.estimate(_llama(), want)
    assert got.profile.breakdown == ref.profile.breakdown
    assert got.profile.peak_allocated_bytes == ref.profile.peak_allocated_bytes


def test_fsdp_settings(tmp_path):
    model = _llama()
    offload = read_run(_args(tmp_path, fsdp="full_shard offload auto_wrap"), model, None,
                       _batch())  # fmt: skip
    assert offload.workload == memfit.Workload(
        batch_size=BATCH, seq_len=SEQ, gpus=2, fsdp_cpu_offload=True, optimizer="none"
    )
    named = _args(tmp_path, fsdp_config={"transformer_layer_cls_to_wrap": "LlamaDecoderLayer"})
    assert read_run(named, model, None, _batch()).workload.gpus == 2


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        (dict(fsdp_config={"version": 1}), "FSDP1"),
        (dict(fsdp="shard_grad_op"), "reshard_after_forward False"),
        (dict(fsdp_config={"auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 10}),
         "SIZE_BASED_WRAP"),
        (dict(fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaMLP"]}),
         "repeated blocks \\(LlamaDecoderLayer\\)"),
    ],
)  # fmt: skip
def test_what_memfit_does_not_model_is_refused(tmp_path, kw, words):
    with pytest.raises(BadInputError, match=words):
        read_run(_args(tmp_path, **kw), _llama(), None, _batch())


def test_fsdp_in_one_process_is_refused(tmp_path):
    with pytest.raises(BadInputError, match="FSDP in one process"):
        read_run(_args(tmp_path, cls=transformers.TrainingArguments), _llama(), None, _batch())


def test_deepspeed_is_refused(tmp_path):
    args = _args(tmp_path, fsdp=None)
    args.deepspeed = {"zero_optimization": {"stage": 3}}  # as TrainingArguments(deepspeed=...)
    with pytest.raises(BadInputError, match="DeepSpeed, which memfit does not model"):
        read_run(args, _llama(), None, _batch())


def test_a_plan_over_several_gpus_is_written_as_fsdp_arguments(tmp_path):
    from memfit.integrations.transformers import training_arguments_for

    args = _args(tmp_path, cls=transformers.TrainingArguments, fsdp=None)
    w = memfit.Workload(batch_size=2, seq_len=SEQ, gpus=2, precision="bf16-mixed",
                        fsdp_mixed="accelerate", fsdp_cpu_offload=True)  # fmt: skip
    new = training_arguments_for(w, args)
    assert new.fsdp is True and new.bf16 is True and new.per_device_train_batch_size == 2
    assert new.fsdp_config["version"] == 2 and new.fsdp_config["cpu_offload"] is True
    assert not args.fsdp  # the original is left alone
    # Read back as the callback reads it, the arguments are the plan's Workload.
    two = _args(tmp_path, fsdp=new.fsdp, fsdp_config=new.fsdp_config, bf16=True,
                per_device_train_batch_size=2)  # fmt: skip
    ids = torch.zeros(2, SEQ, dtype=torch.long)
    reading = read_run(two, _llama(), None, {"input_ids": ids, "labels": ids})
    assert reading.workload == w.with_(optimizer="none")
