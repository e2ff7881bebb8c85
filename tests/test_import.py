"""`import memfit` stays light: no transformers, matplotlib, or CUDA initialisation."""

from __future__ import annotations

import subprocess
import sys


def test_import_is_lean():
    code = (
        "import sys, memfit, torch\n"
        "heavy = [m for m in ('transformers', 'matplotlib', 'peft') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert not torch.cuda.is_initialized()\n"
        "assert callable(memfit.estimate)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_api():
    import memfit

    assert set(memfit.__all__) >= {"estimate", "Estimate", "Workload", "MemoryProfile"}


def test_estimate_is_callable_twice():
    # Regression: `memfit.estimate` once resolved to the submodule after the first call.
    import memfit

    w = memfit.Workload(batch_size=1, seq_len=16, optimizer="sgd")
    first = memfit.estimate("gpt2", w)
    second = memfit.estimate("gpt2", w)
    assert first.profile.peak_allocated_bytes == second.profile.peak_allocated_bytes


def test_inputs_are_categorised_and_released():
    import memfit

    est = memfit.estimate("gpt2", memfit.Workload(batch_size=2, seq_len=16, mode="inference"))
    # Inference passes input_ids only (no labels, no loss): one int64 tensor of 2 x 16 x 8 =
    # 256 B, rounded up to one 512-B allocator block, alive during the forward (the peak).
    assert est.profile.peak_phase == "forward"
    assert est.profile.breakdown["inputs"] == 512
    assert est.profile.peak_op != "nll_loss_forward.default"
    train = memfit.estimate("gpt2", memfit.Workload(batch_size=2, seq_len=16, optimizer="sgd"))
    assert any(ev[4] == "nll_loss_forward.default" for ev in train.profile.events)
    assert not any(ev[4] == "nll_loss_forward.default" for ev in est.profile.events)


def test_verbs_are_functions_not_submodules():
    # A submodule named like a verb would shadow it once imported (memfit.measure -> module).
    import importlib
    import pkgutil

    import memfit

    for info in pkgutil.iter_modules(memfit.__path__):
        importlib.import_module(f"memfit.{info.name}")

    for name in memfit.__all__:
        assert not isinstance(getattr(memfit, name), type(memfit)), name
