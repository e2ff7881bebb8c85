"""`memfit.integrations.accelerate_config` and `memfit estimate --accelerate-config`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import memfit
from memfit.cli.app import app
from memfit.errors import BadInputError
from memfit.integrations.accelerate_config import read_accelerate_config

FSDP2 = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
mixed_precision: bf16
num_machines: 1
num_processes: 2
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_offload_params: false
  fsdp_reshard_after_forward: true
  fsdp_activation_checkpointing: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
"""

TINY_LLAMA = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
    "vocab_size": 256, "max_position_embeddings": 128,
}  # fmt: skip


def _write(tmp_path, text, name="accelerate.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_fsdp2_config_is_read(tmp_path):
    fields = read_accelerate_config(_write(tmp_path, FSDP2))
    assert fields == {"precision": "bf16-mixed", "gpus": 2, "checkpointing": "blocks",
                      "fsdp_mixed": "accelerate"}  # fmt: skip
    fp32 = FSDP2.replace("mixed_precision: bf16", "mixed_precision: 'no'")
    assert "fsdp_mixed" not in read_accelerate_config(_write(tmp_path, fp32))
    offload = FSDP2.replace("fsdp_offload_params: false", "fsdp_offload_params: true")
    assert read_accelerate_config(_write(tmp_path, offload))["fsdp_cpu_offload"] is True


def test_ddp_config_is_read(tmp_path):
    ddp = FSDP2.replace("distributed_type: FSDP", "distributed_type: MULTI_GPU")
    assert read_accelerate_config(_write(tmp_path, ddp)) == {
        "precision": "bf16-mixed", "gpus": 2, "ddp": True,
    }  # fmt: skip


def test_single_process_configs(tmp_path):
    one = "distributed_type: 'NO'\nmixed_precision: fp16\nnum_processes: 1\n"
    assert read_accelerate_config(_write(tmp_path, one)) == {"precision": "fp16-mixed"}
    as_json = json.dumps({"distributed_type": "NO", "mixed_precision": "no"})
    assert read_accelerate_config(_write(tmp_path, as_json, "c.json")) == {"precision": "fp32"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("mixed_precision: bf16", "mixed_precision: fp8"), "mixed_precision fp8 is not modelled"),
        (("distributed_type: FSDP", "distributed_type: MULTI_XPU"), "DDP on other devices"),
        (
            (
                "distributed_type: FSDP\nmixed_precision: bf16\nnum_machines: 1\nnum_processes: 2",
                "distributed_type: MULTI_GPU\nmixed_precision: bf16\nnum_machines: 1\n"
                "num_processes: 1",
            ),
            "MULTI_GPU with num_processes 1",
        ),
        (("distributed_type: FSDP", "distributed_type: DEEPSPEED"), "DeepSpeed is not modelled"),
        (("fsdp_version: 2", "fsdp_version: 1"), "fsdp_version 1 (FSDP1, flat parameters)"),
        (
            ("fsdp_reshard_after_forward: true", "fsdp_reshard_after_forward: false"),
            "fsdp_reshard_after_forward false",
        ),
        (("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP"), "fsdp_auto_wrap_policy SIZE_BASED_WRAP"),
        (
            ("compute_environment: LOCAL_MACHINE", "dynamo_config:\n  dynamo_backend: INDUCTOR"),
            "dynamo_backend 'INDUCTOR'",
        ),
    ],
)
def test_what_memfit_does_not_model_is_refused(tmp_path, change, message):
    path = _write(tmp_path, FSDP2.replace(*change))
    with pytest.raises(BadInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_accelerate_config(path)


def test_bad_files(tmp_path):
    with pytest.raises(BadInputError, match="No accelerate config"):
        read_accelerate_config(tmp_path / "missing.yaml")
    with pytest.raises(BadInputError, match="not an accelerate config"):
        read_accelerate_config(_write(tmp_path, "- a list\n"))


def test_cli_estimate_follows_the_config(tmp_path):
    model = tmp_path / "config.json"
    model.write_text(json.dumps(TINY_LLAMA))
    config = _write(tmp_path, FSDP2)
    runner = CliRunner()
    r = runner.invoke(app, ["estimate", str(model), "--seq", "64", "--accelerate-config",
                            str(config), "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    w = memfit.Workload(seq_len=64, precision="bf16-mixed", gpus=2, checkpointing="blocks",
                        fsdp_mixed="accelerate")  # fmt: skip
    assert got["workload"]["fsdp_mixed"] == "accelerate"
    assert (
        got["peak_allocated_bytes"] == memfit.estimate(str(model), w).profile.peak_allocated_bytes
    )
    # The same value given as a flag is fine; another value is an error naming both.
    same = runner.invoke(app, ["estimate", str(model), "--seq", "64", "--gpus", "2",
                               "--accelerate-config", str(config), "--json"])  # fmt: skip
    assert same.exit_code == 0, same.output
    r = runner.invoke(app, ["estimate", str(model), "--seq", "64", "--precision", "fp32",
                            "--accelerate-config", str(config)])  # fmt: skip
    assert r.exit_code == 2
    assert "--precision 'fp32' conflicts with mixed_precision in" in r.output


def test_cli_estimate_of_a_ddp_config(tmp_path):
    model = tmp_path / "config.json"
    model.write_text(json.dumps(TINY_LLAMA))
    config = _write(
        tmp_path, FSDP2.replace("distributed_type: FSDP", "distributed_type: MULTI_GPU")
    )
    r = CliRunner().invoke(app, ["estimate", str(model), "--seq", "64", "--accelerate-config",
                                 str(config), "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    assert got["workload"]["ddp"] is True and got["workload"]["gpus"] == 2
    w = memfit.Workload(seq_len=64, precision="bf16-mixed", gpus=2, ddp=True)
    assert (
        got["peak_allocated_bytes"] == memfit.estimate(str(model), w).profile.peak_allocated_bytes
    )
