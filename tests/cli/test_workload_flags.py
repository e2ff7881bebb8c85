"""Every workload flag of the CLI sets exactly one Workload field, every field a user can set
from the CLI has its flag, and an estimate's JSON rebuilds the Workload it estimated."""

from __future__ import annotations

import dataclasses

import pytest

import memfit
from memfit.cli.common.workload_options import WORKLOAD_OPTIONS, build_workload
from memfit.report.json import estimate_json, workload_from_json
from memfit.workload import LoraConfig, Workload

#: Flag -> the field it sets, where the names differ.
RENAMED = {"batch": "batch_size", "seq": "seq_len", "lora_rank": "lora", "lora_targets": "lora"}
#: Fields the library takes and the CLI does not: a list of module prefixes (`freeze`), a
#: partial checkpointing depth the planner picks, the step count of a trace, and FSDP2's
#: mixed-precision policy (the trainer integrations read it from the launch).
LIBRARY_ONLY = {"freeze", "checkpoint_first", "steps", "fsdp_mixed"}

#: A value other than the default for each flag (with what it needs beside it).
SAMPLES: dict[str, tuple[object, dict[str, object]]] = {
    "batch": (3, {}), "seq": (96, {}), "image_size": (64, {"seq": None}),
    "mode": ("inference", {}), "precision": ("bf16-mixed", {}), "optimizer": ("sgd", {}),
    "grad_accum": (2, {}), "checkpointing": ("blocks", {}), "lora_rank": (4, {}),
    "lora_targets": ("q_proj", {"lora_rank": 4}), "attention": ("eager", {}),
    "gpu": ("t4", {}), "gpus": (2, {}), "ddp": (True, {"gpus": 2}),
    "offload_optimizer": (True, {}), "embedding_on_cpu": (True, {}),
    "tie_embeddings": (True, {}), "quantize": ("nf4", {"lora_rank": 4}),
    "prepare_kbit": (True, {"quantize": "nf4", "lora_rank": 4}),
    "optimizer_in_backward": (True, {}),
    "offload_activations": ("torchtune", {}), "chunked_loss": (4, {}),
    "fsdp_cpu_offload": (True, {}), "host_memory": ("8GiB", {}),
    "prompt_len": (64, {"mode": "generate"}), "new_tokens": (8, {"mode": "generate"}),
    "num_beams": (2, {"mode": "generate"}), "cache": ("static", {"mode": "generate"}),
    "tp": (2, {"mode": "generate"}), "teacher": ("gpt2", {}),
    "teacher_precision": ("bf16", {"teacher": "gpt2"}),
    "teacher_quantize": ("nf4", {"teacher": "gpt2"}),
    "distill_loss": ("chunked-kl", {"teacher": "gpt2"}),
    "teacher_top_k": (8, {"teacher": "gpt2"}),
}  # fmt: skip


def _field(flag: str) -> str:
    return RENAMED.get(flag, flag)


def _differing(a: Workload, b: Workload) -> set[str]:
    return {f.name for f in dataclasses.fields(Workload) if f.compare
            and getattr(a, f.name) != getattr(b, f.name)}  # fmt: skip


def test_every_field_has_one_flag_or_is_library_only() -> None:
    flags = [name for name, _, _ in WORKLOAD_OPTIONS]
    fields = {f.name for f in dataclasses.fields(Workload) if f.init}
    assert set(SAMPLES) == set(flags)
    assert {_field(f) for f in flags} | LIBRARY_ONLY == fields
    assert not {_field(f) for f in flags} & LIBRARY_ONLY


@pytest.mark.parametrize("flag", list(SAMPLES))
def test_each_flag_sets_its_field(flag: str) -> None:
    value, needs = SAMPLES[flag]
    base = build_workload(**needs)
    changed = build_workload(**{**needs, flag: value})
    field = _field(flag)
    got = _differing(base, changed)
    # --mode inference also drops the optimizer a training step resolves (and fp32 -> auto).
    allowed = {field, "optimizer", "precision"} if flag == "mode" else {field}
    assert field in got and got <= allowed, (flag, got)


WORKLOADS = [
    Workload(batch_size=2, seq_len=64, precision="bf16-mixed", optimizer="adamw-8bit",
             checkpointing="blocks", checkpoint_first=1,
             lora=LoraConfig(rank=4, targets=("c_attn",)),
             gpu="a100-80gb", grad_accum=2, chunked_loss=2, offload_activations="torchtune"),
    Workload(batch_size=1, seq_len=32, precision="fp32", optimizer="sgd-momentum",
             freeze=("transformer.wte",), gpu="t4", host_memory="8GiB", offload_optimizer=True),
    Workload(mode="generate", prompt_len=16, new_tokens=4, num_beams=2, precision="bf16-true",
             gpu="l4", cache="static"),
]  # fmt: skip


@pytest.mark.parametrize("w", WORKLOADS)
def test_the_estimates_json_rebuilds_its_workload(w: Workload) -> None:
    from tests.conftest import tiny_gpt2

    est = memfit.estimate(tiny_gpt2(2, n_positions=64), w)
    assert workload_from_json(estimate_json(est)["workload"]) == est.workload == w


def test_messages_name_the_flags_the_options_declare() -> None:
    # `fail` rewrites Python names in library messages to flags; its table is read from the
    # options themselves, so a new option's flag is rewritten without a second entry.
    from memfit.cli.common.exits import FLAGS, cli_wording

    assert FLAGS["batch_size"] == "--batch" and FLAGS["seq_len"] == "--seq"
    for name, _, _ in WORKLOAD_OPTIONS:
        if _field(name) != "lora":
            assert FLAGS[_field(name)].startswith("--"), name
    assert "lora" not in FLAGS  # LoRA's two flags build one LoraConfig
    assert cli_wording("chunked_loss=4 with a teacher") == "--chunked-loss 4 with a teacher"
