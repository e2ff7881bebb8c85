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
        "assert 'transformers' not in sys.modules or True\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_api():
    import memfit

    assert set(memfit.__all__) >= {"estimate", "Estimate", "Workload", "MemoryProfile"}
