"""The technique table: one row per technique, each with its apply handler; the workload's
configs and `apply_`'s order are read from it, and the trace runs its hooks."""

from __future__ import annotations

import typing

import memfit
import memfit.techniques
from memfit.techniques import composition
from memfit.techniques.accumulation import AccumulationConfig
from memfit.techniques.checkpointing import CheckpointConfig
from memfit.techniques.chunked_loss import ChunkedLossConfig
from memfit.techniques.distillation.config import DistillationConfig
from memfit.techniques.freeze import FreezeConfig
from memfit.techniques.offload.activations import ActivationOffloadConfig
from memfit.techniques.offload.embedding_on_cpu import EmbeddingOnCpuConfig
from memfit.techniques.optimizer import OptimizerConfig
from memfit.techniques.optimizer_in_backward import OptimizerInBackwardConfig
from memfit.techniques.parallel.data_parallel import DDPConfig
from memfit.techniques.parallel.fsdp import FSDPConfig
from memfit.techniques.precision import PrecisionConfig
from memfit.techniques.quantize.config import QuantizeConfig
from memfit.techniques.registry import _HANDLERS
from memfit.techniques.table import ORDER, STAGES, TECHNIQUES, configs_of
from memfit.techniques.tie_embeddings import TieEmbeddingsConfig
from memfit.workload import LoraConfig


def test_one_row_per_handler_and_per_config_type() -> None:
    rows = [t.config for t in TECHNIQUES]
    assert len(rows) == len(set(rows))
    # A technique's module registers its handler; its row is the one other line it needs.
    assert set(rows) == set(_HANDLERS)
    assert set(rows) == set(typing.get_args(composition.TechniqueConfig))
    assert {t.stage for t in TECHNIQUES} <= set(STAGES)
    assert sorted(t.report for t in TECHNIQUES) == list(range(len(TECHNIQUES)))


def test_apply_order_is_the_tables() -> None:
    assert (
        TieEmbeddingsConfig, FreezeConfig, LoraConfig, ChunkedLossConfig, DistillationConfig,
        PrecisionConfig, QuantizeConfig, EmbeddingOnCpuConfig, CheckpointConfig, FSDPConfig,
        ActivationOffloadConfig, DDPConfig, AccumulationConfig, OptimizerConfig,
        OptimizerInBackwardConfig,
    ) == ORDER  # fmt: skip


def test_a_workload_reads_as_its_configs_in_report_order() -> None:
    w = memfit.Workload(
        batch_size=2, grad_accum=4, seq_len=64, precision="bf16-mixed", optimizer="adamw",
        checkpointing="blocks", checkpoint_first=2, lora=LoraConfig(rank=4), quantize="nf4",
        freeze=("model.embed",), optimizer_in_backward=False, embedding_on_cpu=True,
        offload_activations="torchtune", chunked_loss=4,
    )  # fmt: skip
    got = configs_of(w, lr=1e-4)
    assert [type(c) for c in got] == [
        AccumulationConfig, CheckpointConfig, QuantizeConfig, LoraConfig, FreezeConfig,
        OptimizerConfig, EmbeddingOnCpuConfig, ActivationOffloadConfig,
        ChunkedLossConfig, PrecisionConfig,
    ]  # fmt: skip
    assert got[0] == AccumulationConfig(steps=4)
    assert got[1] == CheckpointConfig(first=2)
    assert got[5] == OptimizerConfig(name="adamw", lr=1e-4, offload=False)
    assert got[7] == ActivationOffloadConfig(variant="torchtune")
    assert got[-1] == PrecisionConfig(precision="bf16-mixed")
    inference = memfit.Workload(mode="inference", seq_len=64, precision="bf16-true")
    assert configs_of(inference) == [PrecisionConfig(precision="bf16-true")]
