"""Checkpoints already quantized (a config.json's `quantization_config`): read as the installed
transformers reads them, stored as its quantizer stores them, run as it runs them on the target
GPU. See memfit.techniques.prequantized.config for the methods and the kernel/fallback rule."""

from memfit.techniques.prequantized.config import (
    ForwardPath,
    PrequantizedConfig,
    forward_path,
    read_quantization_config,
)
from memfit.techniques.prequantized.trace import bind_prequantized, prepare_prequantized

__all__ = [
    "ForwardPath",
    "PrequantizedConfig",
    "bind_prequantized",
    "forward_path",
    "prepare_prequantized",
    "read_quantization_config",
]
