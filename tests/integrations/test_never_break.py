"""The callbacks never break the training they watch (DESIGN.md, "Never break the run"): a
failure of memfit's own work in a Hugging Face Trainer or a Lightning fit is printed once, the
callback stops, and the run trains exactly as without the callback (torch.equal weights).
A grouped-query-attention Llama (SDPA with `enable_gqa`, as transformers calls it without a
mask) trains with the callback as without it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from memfit.integrations import _lightning_hooks, _session  # noqa: E402
from memfit.integrations.transformers import MemfitCallback  # noqa: E402
from memfit.measurement.measure import _LiveTracker  # noqa: E402
from tests.conftest import tiny_gpt2  # noqa: E402
from tests.integrations.test_transformers import SEQ, _args, _Tokens, _train  # noqa: E402

#: The first words of the one report of a failure (memfit.errors.Failsafe.trip).
REPORT = "stopped after its own error in"


def _injected(*_: Any, **__: Any) -> Any:
    raise RuntimeError("injected")


def _weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _hf_trained(tmp_path, callbacks: list[Any], model: Any = None) -> list[torch.Tensor]:
    model = model if model is not None else tiny_gpt2(2, n_positions=SEQ)
    _train(model, _args(tmp_path), callbacks)
    return _weights(model)


@pytest.fixture(scope="module")
def hf_reference(tmp_path_factory) -> list[torch.Tensor]:
    return _hf_trained(tmp_path_factory.mktemp("reference"), [])


#: Where memfit's own work is made to fail: (object, attribute, the stage's words in the report).
HF_FAULTS = {
    "estimate": (_session, "estimate", "estimating the run (on_train_begin)"),
    "measure": (_LiveTracker, "_record_op", "recording the aten op"),
    "compare": (_session, "Comparison", "ending the measurement (on_step_end)"),
}


@pytest.mark.parametrize("stage", list(HF_FAULTS))
def test_trainer_callback_failure_is_printed_once_and_training_is_unchanged(
    tmp_path, monkeypatch, hf_reference, stage
):
    owner, name, where = HF_FAULTS[stage]
    monkeypatch.setattr(owner, name, _injected)
    lines: list[str] = []
    cb = MemfitCallback(print_fn=lines.append)
    assert _same(_hf_trained(tmp_path, [cb]), hf_reference)
    reports = [line for line in lines if REPORT in line]
    assert len(reports) == 1 and where in reports[0] and "RuntimeError: injected" in reports[0]
    assert cb.failed is not None and "injected" in cb.failed
    assert cb.comparison is None
    assert (cb.estimate is None) == (stage == "estimate")


def test_trainer_callback_strict_raises_memfits_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(_session, "estimate", _injected)
    with pytest.raises(RuntimeError, match="injected"):
        _hf_trained(tmp_path, [MemfitCallback(print_fn=lambda _: None, strict=True)])


def test_trainer_callback_is_off_after_a_failure(tmp_path, monkeypatch):
    """After its failure the callback does nothing: no measurement is started."""
    monkeypatch.setattr(_session, "estimate", _injected)
    started: list[Any] = []
    monkeypatch.setattr(_session.Session, "start_measuring", lambda *a: started.append(a))
    cb = MemfitCallback(print_fn=lambda _: None)
    _hf_trained(tmp_path, [cb])
    assert started == [] and cb.session.measurement is None


# -- Lightning -----------------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["estimate", "measure"])
def test_lightning_callback_failure_is_printed_once_and_training_is_unchanged(monkeypatch, stage):
    L = pytest.importorskip("lightning")
    from memfit.integrations.lightning import MemfitCallback as LightningCallback
    from tests.integrations.test_lightning import _fit

    def fitted(callback: Any) -> list[torch.Tensor]:
        torch.manual_seed(0)
        _, module = _fit(L, callback)
        return _weights(module)

    want = fitted(L.Callback())
    if stage == "estimate":
        monkeypatch.setattr(_lightning_hooks, "read_run", _injected)
    else:
        monkeypatch.setattr(_LiveTracker, "_record_op", _injected)
    lines: list[str] = []
    cb = LightningCallback(print_fn=lines.append)
    assert _same(fitted(cb), want)
    assert len([line for line in lines if REPORT in line]) == 1
    assert cb.failed is not None and "injected" in cb.failed and cb.comparison is None


# -- grouped-query attention -----------------------------------------------------------------


def tiny_gqa_llama() -> torch.nn.Module:
    """A seeded 2-layer Llama, hidden 32, 4 query heads over 2 key/value heads, with SDPA: given
    no attention mask, transformers calls SDPA with `enable_gqa=True` (K/V not repeated)."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
        bos_token_id=0, eos_token_id=0, pad_token_id=None,
    )  # fmt: skip
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa")


def test_a_grouped_query_attention_llama_trains_the_same_with_the_callback(tmp_path, monkeypatch):
    sdpa_calls: list[bool] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def seen(*args: Any, **kwargs: Any) -> Any:
        key = args[1] if len(args) > 1 else kwargs["key"]
        sdpa_calls.append(bool(kwargs.get("enable_gqa")) and key.shape[1] == 2)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", seen)
    want = _hf_trained(tmp_path, [], tiny_gqa_llama())
    assert sdpa_calls and all(sdpa_calls)  # grouped K/V reach SDPA, as on the GPU
    lines: list[str] = []
    cb = MemfitCallback(print_fn=lines.append)
    assert _same(_hf_trained(tmp_path, [cb], tiny_gqa_llama()), want)
    assert cb.failed is None and not [line for line in lines if REPORT in line]
    assert cb.estimate is not None and cb.comparison is not None and cb.comparison.steps == 2


def test_dataset_has_no_attention_mask():
    """The GQA test relies on it: with a mask, transformers repeats K/V before SDPA."""
    assert set(_Tokens()[0]) == {"input_ids", "labels"}
