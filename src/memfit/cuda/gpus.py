"""The GPU record: what a card offers a PyTorch training job (the entries are in
`memfit.cuda._gpu_data`; `memfit.cuda.target` resolves `--gpu`).

Every number below carries a comment naming where it comes from. Three kinds of source:

* ``exact``: a byte-exact ``cudaDeviceProp.totalGlobalMem`` figure printed by CUDA's
  ``deviceQuery`` ("Total amount of global memory: N MBytes (B bytes)") or by
  ``torch.cuda.get_device_properties(0).total_memory`` (the same field: PyTorch copies
  ``totalGlobalMem``).
* ``derived``: a MiB-resolution figure (PyTorch's ``_CudaDeviceProperties`` repr prints
  ``total_memory=<floor(bytes / MiB)>MB``; TensorRT prints MiB), or an OOM message
  ("GPU 0 has a total capacity of X GiB", two decimals), converted to bytes. A MiB-derived
  figure is a lower bound, at most 1 MiB below the real one; a GiB-derived one is within
  about 5 MiB.
* ``uncertain``: derived from a sibling card or from a report whose exact card/OS is unclear.
  The comment gives the arithmetic (for example nvidia-smi's total less the amount the driver
  was seen to keep back on a sibling card).

``total_memory_bytes`` is what PyTorch reports, NOT the marketing size and NOT what
``nvidia-smi`` shows as total: the driver keeps some memory back (e.g. H100 80GB HBM3:
nvidia-smi 81559 MiB, CUDA 81079-81106 MiB). The amount kept back varies with the driver
version (A100-PCIE-40GB: 40536 MiB on an older driver, 40326 MiB on driver 12.4; RTX 4090:
24081-24564 MiB), with ECC (GDDR cards lose ~6% with ECC on: RTX 6000 Ada reports 47.37 GiB
with ECC off, 44.43 GiB with it on), and with the OS (Windows/WDDM reports differently).
Treat every figure as +-0.5 % unless its comment says otherwise; where several drivers were
seen, the comment gives the range.

Peak FLOP figures are dense (no 2:4 sparsity) tensor-core rates with FP32 accumulate, from
NVIDIA datasheets / architecture whitepapers. GeForce cards run FP16/BF16 tensor math with
FP32 accumulate at half the FP16-accumulate rate; the figures below are the FP32-accumulate
ones, which is what PyTorch autocast uses.

AMD Instinct cards (``architecture`` in ``ROCM_ARCHITECTURES``) are reached through PyTorch's
ROCm build, which keeps the ``torch.cuda`` API: ``total_memory`` is hipDeviceProp's
``totalGlobalMem``, ``compute_capability`` is the (major, minor) PyTorch derives from the
gfx target (gfx942, MI300X: (9, 4); note that gfx90a, MI250X, reads (9, 0) like Hopper), and
``sm_count`` is the number of compute units. ``flash_attention`` there means the AOTriton
kernels behind SDPA's FLASH backend support the gfx target (sdp_utils.cpp,
check_flash_attention_hardware_support under USE_ROCM), not the sm80-sm121 range.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.precision import PRECISIONS, precision_of
from memfit.units import GIB

__all__ = ["GPU"]

TERA = 10**12  # TFLOPS -> FLOP/s
GIGA = 10**9  # GB/s (decimal, as datasheets give it) -> bytes/s

# Host link, one direction: transfer rate x lanes x 128b/130b encoding / 8 bits (PCI-SIG
# base specs: Gen3 8 GT/s, Gen4 16 GT/s, Gen5 32 GT/s). NVIDIA datasheets quote the
# bidirectional sum (e.g. "PCIe Gen4 x16: 64GB/s bidirectional" on the L40S datasheet).
PCIE_GEN3_X16_BYTES_PER_S = 8 * 10**9 * 16 * 128 // 130 // 8  # 15.75 GB/s
PCIE_GEN4_X8_BYTES_PER_S = 16 * 10**9 * 8 * 128 // 130 // 8  # 15.75 GB/s (RTX 4060 is x8)
PCIE_GEN4_X16_BYTES_PER_S = 16 * 10**9 * 16 * 128 // 130 // 8  # 31.51 GB/s
PCIE_GEN5_X8_BYTES_PER_S = 32 * 10**9 * 8 * 128 // 130 // 8  # 31.51 GB/s (RTX 5060 Ti is x8)
PCIE_GEN5_X16_BYTES_PER_S = 32 * 10**9 * 16 * 128 // 130 // 8  # 63.02 GB/s

# PyTorch's SDPA FLASH backend: aten/src/ATen/native/transformers/cuda/sdp_utils.cpp,
# check_flash_attention_hardware_support() accepts check_sm_version<sm80, sm121> (inclusive)
# in current source; older releases used <sm80, sm90>. Either way: Ampere, Ada, Hopper,
# Blackwell (sm100, sm120) yes; Volta, Turing no. (It also needs fp16/bf16 inputs and
# head_dim <= 256; that is the caller's business.) On ROCm the same function asks AOTriton
# whether it was built for the gfx target (aotriton::v2::flash::check_gpu); gfx942 (MI300X) is
# one of its primary targets, gfx11xx needs TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1.
FLASH_ATTENTION_MIN_CC = (8, 0)
FLASH_ATTENTION_MAX_CC = (12, 1)
# Native bf16 (tensor-core bf16 and bf16 arithmetic) arrived with sm80 (Ampere); CDNA2 and
# later have it too.
BF16_MIN_CC = (8, 0)
#: ``GPU.architecture`` values of AMD cards run by PyTorch's ROCm build (see the module doc).
ROCM_ARCHITECTURES = frozenset({"cdna3"})


#: A run "fits" when its device memory stays this fraction below the GPU's capacity. It covers
#: the estimator's error targets (reserved memory within 3 % median, 8 % worst) for most jobs.
FIT_MARGIN_FRACTION = 0.05


def fit_limit(capacity_bytes: int) -> int:
    """The most device memory a run that fits may use on a GPU of `capacity_bytes`."""
    return int(capacity_bytes * (1 - FIT_MARGIN_FRACTION))


@dataclass(frozen=True, kw_only=True)
class GPU:
    """One GPU model, as PyTorch on Linux sees it. All rates are peaks, not sustained."""

    name: str  # canonical lowercase CLI name
    display_name: str  # what torch.cuda.get_device_name() prints
    aliases: tuple[str, ...]
    total_memory_bytes: int  # torch.cuda.get_device_properties(0).total_memory
    compute_capability: tuple[int, int]
    bf16: bool  # native bf16 (sm80+)
    flash_attention: bool  # PyTorch SDPA FLASH backend runs on this arch
    memory_bandwidth_bytes_per_s: int
    peak_fp16_flops: int  # dense tensor-core fp16, fp32 accumulate
    peak_bf16_flops: int  # 0 when unsupported
    peak_fp32_flops: int  # non-tensor-core fp32
    pcie_bandwidth_bytes_per_s: int  # host link, one direction
    architecture: str  # "turing", "volta", "ampere", "ada", "hopper", "blackwell", "cdna3"
    # Extras beyond the core spec (defaults keep direct construction cheap):
    peak_tf32_flops: int = 0  # dense TF32 tensor-core rate; 0 before Ampere
    sm_count: int = 0  # multiprocessors (cudaDeviceProp.multiProcessorCount)
    # GPUs of this SKU are normally linked by NVLink (SXM boards; AMD's Infinity Fabric on OAM
    # boards counts too). Two-card NVLink bridges (A40, H100 NVL) do not.
    nvlink: bool = False
    memory_source_quality: str = "exact"  # "exact", "derived" or "uncertain" (see module doc)

    @property
    def total_memory_gib(self) -> float:
        return self.total_memory_bytes / GIB

    @property
    def fit_limit(self) -> int:
        """The most device memory a run that fits may use (`FIT_MARGIN_FRACTION` below the
        capacity)."""
        return fit_limit(self.total_memory_bytes)

    @property
    def rocm(self) -> bool:
        """An AMD card, run by PyTorch's ROCm build behind the torch.cuda API."""
        return self.architecture in ROCM_ARCHITECTURES


#: The first compute capability with float8 matmuls (`torch._scaled_mm`: Ada sm89, Hopper).
FP8_MATMUL_MIN_CC = (8, 9)


def card_notes(gpu: GPU, precision: str, quantize: str | None) -> list[str]:
    """What a run of this precision and quantization does differently on `gpu` than its figures
    alone say: a dtype the card has no native support for. Said beside the verdict, never
    silently.

    - bfloat16 before sm80 (Turing, Volta): PyTorch runs it by emulation (the bytes are the
      same, the matmuls run at the fp32 rate), but `torch.cuda.is_bf16_supported()` is False
      there, so the HF Trainer (`bf16=True`) and Lightning (`precision="bf16-..."`) refuse to
      start; fp16 is what those users run.
    - float8 weight-only (torchao `Float8WeightOnlyConfig`): its linear dequantizes the weight
      and runs the matmul in the activation dtype (torchao float8_tensor.py, the branch for an
      input that is not a Float8Tensor), so it runs on any card; float8 matmuls, which need
      sm89+, are not used.
    """
    notes: list[str] = []
    cc = f"sm{gpu.compute_capability[0]}{gpu.compute_capability[1]}"
    if precision in PRECISIONS and precision_of(precision).bf16 and not gpu.bf16:
        notes.append(
            f"{gpu.display_name} ({cc}) has no native bfloat16: PyTorch runs {precision} there "
            "by emulation (the same bytes, matmuls at the fp32 rate), and the HF Trainer "
            "(bf16=True) and Lightning refuse to start it because "
            "torch.cuda.is_bf16_supported() is False. On this card use fp16-mixed to train, "
            "fp16-true for inference"
        )
    if quantize == "fp8" and gpu.compute_capability < FP8_MATMUL_MIN_CC:
        notes.append(
            f"{gpu.display_name} ({cc}) has no float8 matmul (sm89+); fp8 here is weight-only "
            "(torchao Float8WeightOnlyConfig), which dequantizes each weight before its matmul, "
            "so it runs on this card as estimated"
        )
    return notes
