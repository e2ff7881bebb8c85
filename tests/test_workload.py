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

    with pytest.raises(BadInputError, match="--gpus"):
        Workload(gpus=0)
    with pytest.raises(BadInputError, match="CPUOffloadPolicy"):
        Workload(gpus=2, offload_optimizer=True)
    assert FSDPConfig(world_size=4) in configs_from_workload(Workload(gpus=4))
    assert "FSDP over 4 GPUs" in technique_labels(Workload(gpus=4))


def test_fsdp_mixed_precision_is_the_policy_unless_autocast_is_asked():
    # With several GPUs, "-mixed" means FSDP2's MixedPrecisionPolicy: no autocast.
    policy = Workload(gpus=4, precision="bf16-mixed")
    assert policy.fsdp_param_dtype == "bfloat16" and not policy.autocast
    asked = Workload(gpus=4, precision="fp16-mixed", fsdp_autocast=True)
    assert asked.fsdp_param_dtype is None and asked.autocast
    one = Workload(precision="bf16-mixed")
    assert one.fsdp_param_dtype is None and one.autocast
    with pytest.raises(BadInputError, match="fsdp_autocast"):
        Workload(precision="bf16-mixed", fsdp_autocast=True)
    with pytest.raises(BadInputError, match="fsdp_autocast"):
        Workload(gpus=2, precision="fp32", fsdp_autocast=True)
