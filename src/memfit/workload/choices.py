"""The values a `Workload` field may take."""

from __future__ import annotations

from memfit.optimizers import OPTIMIZERS as _OPTIMIZERS
from memfit.precision import PRECISIONS as _PRECISIONS

#: Precision recipes (memfit.precision: what each means, as a `Precision` value).
PRECISIONS = _PRECISIONS
AUTO_PRECISION = "auto"  # no training: the checkpoint's dtype (memfit.estimator.auto_precision)

#: Optimizers: memfit.optimizers' table (one OptimizerSpec row each), then "none".
OPTIMIZERS = _OPTIMIZERS

#: Quantized base weights (`QuantizeConfig` in memfit.techniques.quantize.config says which library
#: layout each follows): bitsandbytes 4-bit NF4 / NF4 with double quantization / FP4, LLM.int8,
#: torchao weight-only int8 and int4, and float8.
QUANTIZE = ("nf4", "nf4-dq", "fp4", "int8", "int8-wo", "int4-wo", "fp8")

MODES = ("train", "inference", "generate")
#: Activation offloading variants (memfit.techniques.offload.activations): PyTorch's
#: `save_on_cpu(pin_memory=True)` (every saved tensor, parameters included) or torchtune's
#: `OffloadActivations` filters (parameters and tensors under 1 KiB stay on the device).
ACTIVATION_OFFLOAD = ("save_on_cpu", "torchtune")

#: KV caches of `mode="generate"`, as transformers names its cache classes: DynamicCache (grows
#: by concatenation), StaticCache (allocated at the maximum length), QuantizedCache (quantized
#: with a full-precision residual), OffloadedCache (layers kept on the CPU).
CACHES = ("dynamic", "static", "quantized", "offloaded")
CHECKPOINTING = ("off", "blocks")
#: How FSDP2 over several GPUs runs a "-mixed" precision (Workload.fsdp_mixed): FSDP2's
#: MixedPrecisionPolicy with fp32 reduction and no autocast (what FSDP2 users write), autocast
#: over fp32 shards, or accelerate's (and so the Trainer's) policy with 16-bit reduction and
#: output under autocast.
FSDP_MIXED = ("policy", "autocast", "accelerate")
ATTENTION = ("sdpa", "eager")
#: Knowledge-distillation losses (memfit.techniques.distillation.config): the KL divergence between
#: teacher and student over the vocabulary, over all positions at once or over chunks of them
#: (each chunk's logits recomputed in backward).
DISTILL_LOSSES = ("kl", "chunked-kl")
#: Precisions of a distillation teacher's weights (a frozen model needs no fp32 master copy).
TEACHER_PRECISIONS = ("fp32", "fp16", "bf16")
