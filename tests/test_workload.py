from __future__ import annotations

import pytest

from memfit import BadInputError, LoraConfig, Workload
from memfit.techniques import labels as technique_labels


def test_defaults_and_properties():
    w = Workload(batch_size=4, seq_len=128, precision="bf16-mixed")
    assert w.training and w.mixed and not w.pure_low_precision
    assert w.compute_dtype_name == "bfloat16"
    assert Workload(precision="fp16-true").compute_dtype_name == "float16"
    assert technique_labels(Workload(grad_accum=4, checkpointing="blocks")) == [
        "grad-accum x4",
        "checkpointing every block",
    ]
    assert technique_labels(Workload(checkpointing="blocks", checkpoint_first=3)) == [
        "checkpointing the first 3 blocks"
    ]


@pytest.mark.parametrize(
    ("kwargs", "quoted"),
    [
        ({"batch_size": 0}, "0"),
        ({"batch_size": -1}, "-1"),
        ({"seq_len": 0}, "0"),
        ({"precision": "fp8"}, "'fp8'"),
        ({"optimizer": "adamw8bit"}, "adamw-8bit"),
        ({"mode": "eval"}, "'eval'"),
        ({"grad_accum": 0}, "0"),
        ({"checkpointing": "all"}, "'all'"),
    ],
)
def test_bad_values_quote_the_value(kwargs, quoted):
    with pytest.raises(BadInputError) as e:
        Workload(**kwargs)
    assert quoted in str(e.value)


def test_lora_rank_positive():
    with pytest.raises(BadInputError):
        LoraConfig(rank=0)


def test_gpus_validation_and_fsdp_config():
    import pytest

    from memfit import BadInputError, Workload
    from memfit.techniques import FSDPConfig, configs_from_workload

    with pytest.raises(BadInputError, match="gpus=1"):
        Workload(gpus=0)
    with pytest.raises(BadInputError, match="CPUOffloadPolicy"):
        Workload(gpus=2, offload_optimizer=True)
    assert FSDPConfig(world_size=4) in configs_from_workload(Workload(gpus=4))
    assert "FSDP over 4 GPUs" in technique_labels(Workload(gpus=4))


def test_fsdp_mixed_precision_is_the_policy_unless_autocast_or_accelerate_is_asked():
    # With several GPUs, "-mixed" means FSDP2's MixedPrecisionPolicy: no autocast.
    policy = Workload(gpus=4, precision="bf16-mixed")
    assert policy.fsdp_param_dtype == "bfloat16" and not policy.autocast
    assert policy.fsdp_reduce_dtype is None  # reduced in float32
    asked = Workload(gpus=4, precision="fp16-mixed", fsdp_mixed="autocast")
    assert asked.fsdp_param_dtype is None and asked.autocast
    # accelerate's: 16-bit all-gathers, reduction and output, and autocast over the forward.
    acc = Workload(gpus=4, precision="bf16-mixed", fsdp_mixed="accelerate")
    assert (acc.fsdp_param_dtype, acc.fsdp_reduce_dtype, acc.autocast) == (
        "bfloat16", "bfloat16", True)  # fmt: skip
    one = Workload(precision="bf16-mixed")
    assert one.fsdp_param_dtype is None and one.autocast
    with pytest.raises(BadInputError, match="fsdp_mixed"):
        Workload(precision="bf16-mixed", fsdp_mixed="autocast")
    with pytest.raises(BadInputError, match="fsdp_mixed"):
        Workload(gpus=2, precision="fp32", fsdp_mixed="accelerate")
    with pytest.raises(BadInputError, match="with ddp"):
        Workload(gpus=2, ddp=True, precision="bf16-mixed", fsdp_mixed="accelerate")
    with pytest.raises(BadInputError, match="'torch'"):
        Workload(gpus=2, precision="bf16-mixed", fsdp_mixed="torch")


def test_optimizer_follows_the_mode_unless_given():
    assert Workload().optimizer == "adamw"
    assert Workload(mode="inference").optimizer == "none"
    assert Workload(optimizer="sgd").optimizer == "sgd"
    assert Workload(mode="inference", optimizer="none").optimizer == "none"
    # A copy that changes the mode takes that mode's optimizer when none was given ...
    assert Workload().with_(mode="inference").optimizer == "none"
    assert Workload(mode="inference").with_(mode="train").optimizer == "adamw"
    # ... and keeps one that was, so a training-only optimizer in inference is refused.
    with pytest.raises(BadInputError, match="optimizer='sgd'"):
        Workload(optimizer="sgd").with_(mode="inference")
    # Equal workloads compare equal however the optimizer came.
    assert Workload(optimizer="adamw") == Workload()


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"optimizer": "adamw"}, "optimizer='adamw'"),
        ({"grad_accum": 4}, "grad_accum=4"),
        ({"checkpointing": "blocks"}, "checkpointing='blocks'"),
        ({"lora": LoraConfig(rank=8)}, "lora=LoraConfig(rank=8)"),
        ({"offload_optimizer": True}, "offload_optimizer=True"),
        ({"freeze": ("transformer.h.0",)}, "freeze=('transformer.h.0',)"),
    ],
)
def test_training_only_options_with_inference_are_refused(kwargs, named):
    with pytest.raises(BadInputError) as e:
        Workload(mode="inference", **kwargs)
    assert named in str(e.value)
    assert "mode='train'" in str(e.value)


def test_messages_name_the_python_parameters():
    with pytest.raises(BadInputError, match=r"batch_size must be a positive integer, got 0\. "
                       r"Pass e\.g\. batch_size=1\."):  # fmt: skip
        Workload(batch_size=0)
    with pytest.raises(BadInputError) as e:
        Workload(embedding_on_cpu=True, tie_embeddings=True)
    assert "--" not in str(e.value)


def test_same_value_forms_as_the_cli():
    assert LoraConfig(rank=4, targets="q_proj, v_proj").targets == ("q_proj", "v_proj")
    assert LoraConfig(rank=4, targets=["q_proj"]).targets == ("q_proj",)
    assert Workload(freeze="transformer.wte,transformer.wpe").freeze == (
        "transformer.wte",
        "transformer.wpe",
    )
    assert Workload(gpu="rtx-4090@12GiB").gpu == "rtx-4090@12GiB"
    with pytest.raises(BadInputError, match="rtx-4090"):
        Workload(gpu="rtx-4091")
