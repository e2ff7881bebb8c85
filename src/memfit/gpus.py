"""The GPU catalog: what each card offers a PyTorch training job.

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
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memfit.errors import BadInputError, closest

__all__ = ["GPU", "get_gpu", "list_gpus"]

_MiB = 1 << 20
_GiB = 1 << 30
_T = 10**12  # TFLOPS -> FLOP/s
_GB = 10**9  # GB/s (decimal, as datasheets give it) -> bytes/s

# Host link, one direction: transfer rate x lanes x 128b/130b encoding / 8 bits (PCI-SIG
# base specs: Gen3 8 GT/s, Gen4 16 GT/s, Gen5 32 GT/s). NVIDIA datasheets quote the
# bidirectional sum (e.g. "PCIe Gen4 x16: 64GB/s bidirectional" on the L40S datasheet).
PCIE_GEN3_X16_BYTES_PER_S = 8 * 10**9 * 16 * 128 // 130 // 8  # 15.75 GB/s
PCIE_GEN4_X8_BYTES_PER_S = 16 * 10**9 * 8 * 128 // 130 // 8  # 15.75 GB/s (RTX 4060 is x8)
PCIE_GEN4_X16_BYTES_PER_S = 16 * 10**9 * 16 * 128 // 130 // 8  # 31.51 GB/s
PCIE_GEN5_X16_BYTES_PER_S = 32 * 10**9 * 16 * 128 // 130 // 8  # 63.02 GB/s

# PyTorch's SDPA FLASH backend: aten/src/ATen/native/transformers/cuda/sdp_utils.cpp,
# check_flash_attention_hardware_support() accepts check_sm_version<sm80, sm121> (inclusive)
# in current source; older releases used <sm80, sm90>. Either way: Ampere, Ada, Hopper yes; Volta,
# Turing no. (It also needs fp16/bf16 inputs and head_dim <= 256; that is the caller's
# business.)
FLASH_ATTENTION_MIN_CC = (8, 0)
FLASH_ATTENTION_MAX_CC = (12, 1)
# Native bf16 (tensor-core bf16 and bf16 arithmetic) arrived with sm80 (Ampere).
BF16_MIN_CC = (8, 0)


def _flash_supported(cc: tuple[int, int]) -> bool:
    return FLASH_ATTENTION_MIN_CC <= cc <= FLASH_ATTENTION_MAX_CC


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
    architecture: str  # "turing", "volta", "ampere", "ada", "hopper"
    # Extras beyond the core spec (defaults keep direct construction cheap):
    peak_tf32_flops: int = 0  # dense TF32 tensor-core rate; 0 before Ampere
    sm_count: int = 0  # multiprocessors (cudaDeviceProp.multiProcessorCount)
    nvlink: bool = False  # GPUs of this SKU are normally linked by NVLink (SXM boards)
    memory_source_quality: str = "exact"  # "exact", "derived" or "uncertain" (see module doc)

    @property
    def total_memory_gib(self) -> float:
        return self.total_memory_bytes / _GiB


# fmt: off
_CATALOG: tuple[GPU, ...] = (
    # ---------------------------------------------------------------- Turing (sm75)
    GPU(
        name="t4",
        display_name="Tesla T4",
        aliases=("tesla-t4", "nvidia-t4"),
        # exact: deviceQuery "15110 MBytes (15843721216 bytes)" (CUDA 10.2 and 11.2 drivers);
        # torch repr on later drivers: total_memory=15079-15109MB; one 14930MB report.
        total_memory_bytes=15843721216,
        compute_capability=(7, 5),
        bf16=False,
        flash_attention=False,
        memory_bandwidth_bytes_per_s=320 * _GB,  # T4 datasheet: 320+ GB/s
        peak_fp16_flops=65 * _T,  # T4 datasheet: mixed precision (FP16/FP32) 65 TFLOPS
        peak_bf16_flops=0,
        peak_fp32_flops=int(8.1 * _T),  # T4 datasheet: single precision 8.1 TFLOPS
        pcie_bandwidth_bytes_per_s=PCIE_GEN3_X16_BYTES_PER_S,  # datasheet: PCIe Gen3 x16
        architecture="turing",
        sm_count=40,  # deviceQuery: 40 multiprocessors
    ),
    GPU(
        name="rtx-2060",
        display_name="NVIDIA GeForce RTX 2060",
        aliases=("2060", "rtx2060", "geforce-rtx-2060"),
        # exact: deviceQuery (Linux, driver 12.4) "5917 MBytes (6204162048 bytes)";
        # Windows reports 6144 MBytes (6442123264 bytes).
        total_memory_bytes=6204162048,
        compute_capability=(7, 5),
        bf16=False,
        flash_attention=False,
        memory_bandwidth_bytes_per_s=336 * _GB,  # NVIDIA spec: 14 Gbps x 192-bit = 336 GB/s
        # Turing whitepaper rule for GeForce: FP16 tensor with FP32 accumulate = half the
        # FP16-accumulate rate; 240 tensor cores x 64 FMA x 2 x 1.68 GHz = 51.6 / 2 = 25.8.
        peak_fp16_flops=int(25.8 * _T),
        peak_bf16_flops=0,
        peak_fp32_flops=int(6.45 * _T),  # 1920 CUDA cores x 2 x 1.68 GHz boost
        pcie_bandwidth_bytes_per_s=PCIE_GEN3_X16_BYTES_PER_S,
        architecture="turing",
        sm_count=30,  # deviceQuery: 30 multiprocessors
    ),
    # ---------------------------------------------------------------- Volta (sm70)
    GPU(
        name="v100-16gb",
        display_name="Tesla V100-SXM2-16GB",
        # "v100" means this 16 GB SXM2 card (AWS p3.2xlarge-p3.16xlarge, GCP, most HPC).
        aliases=("v100", "tesla-v100", "v100-sxm2-16gb", "v100-16g", "v100-16"),
        # exact: deviceQuery (driver 12.4) "16144 MBytes (16928342016 bytes)" = the common OOM
        # "15.77 GiB total capacity"; older drivers: 16128 MiB (11.0), 16160 MiB (9.0).
        total_memory_bytes=16928342016,
        compute_capability=(7, 0),
        bf16=False,
        flash_attention=False,
        memory_bandwidth_bytes_per_s=900 * _GB,  # V100 datasheet: 900 GB/s
        peak_fp16_flops=125 * _T,  # V100 SXM2 datasheet: tensor performance 125 TFLOPS
        peak_bf16_flops=0,
        peak_fp32_flops=int(15.7 * _T),  # V100 SXM2 datasheet: single precision 15.7 TFLOPS
        pcie_bandwidth_bytes_per_s=PCIE_GEN3_X16_BYTES_PER_S,  # V100 host link is PCIe Gen3
        architecture="volta",
        sm_count=80,  # deviceQuery: 80 multiprocessors
        nvlink=True,  # SXM2: NVLink 300 GB/s
    ),
    GPU(
        name="v100-32gb",
        display_name="Tesla V100-SXM2-32GB",
        aliases=("v100-sxm2-32gb", "v100-32g", "v100-32"),
        # exact: deviceQuery (driver 12.9, SXM2; driver 12.4, PCIe) "32494 MBytes
        # (34072559616 bytes)"; older drivers 32480-32511 MiB.
        total_memory_bytes=34072559616,
        compute_capability=(7, 0),
        bf16=False,
        flash_attention=False,
        memory_bandwidth_bytes_per_s=900 * _GB,  # V100 datasheet: 900 GB/s
        peak_fp16_flops=125 * _T,  # V100 SXM2 datasheet: 125 TFLOPS
        peak_bf16_flops=0,
        peak_fp32_flops=int(15.7 * _T),  # V100 SXM2 datasheet: 15.7 TFLOPS
        pcie_bandwidth_bytes_per_s=PCIE_GEN3_X16_BYTES_PER_S,
        architecture="volta",
        sm_count=80,
        nvlink=True,
    ),
    # ---------------------------------------------------------------- Ampere (sm80 / sm86)
    GPU(
        name="a10",
        display_name="NVIDIA A10",
        aliases=("nvidia-a10",),
        # exact: deviceQuery (driver 12.8) "22599 MBytes (23696375808 bytes)"; driver 12.2
        # showed 22516 MiB (23609475072 bytes). ECC is on by default (24 GB GDDR6).
        total_memory_bytes=23696375808,
        compute_capability=(8, 6),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=600 * _GB,  # A10 datasheet: 600 GB/s
        peak_fp16_flops=125 * _T,  # A10 datasheet: FP16 tensor 125 TFLOPS (250 sparse)
        peak_bf16_flops=125 * _T,  # A10 datasheet: BF16 tensor 125 TFLOPS (250 sparse)
        peak_fp32_flops=int(31.2 * _T),  # A10 datasheet: FP32 31.2 TFLOPS
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,  # datasheet: PCIe Gen4
        architecture="ampere",
        peak_tf32_flops=int(62.5 * _T),  # A10 datasheet: TF32 62.5 TFLOPS (125 sparse)
        sm_count=72,  # deviceQuery: 72 multiprocessors
    ),
    GPU(
        name="a10g",
        display_name="NVIDIA A10G",
        aliases=("nvidia-a10g", "aws-a10g"),
        # derived: torch repr (torch 2.15 cu130) total_memory=22587MB -> 22587 MiB; matches
        # the OOM "total capacity of 22.06 GiB" reported for A10G.
        total_memory_bytes=22587 * _MiB,
        compute_capability=(8, 6),
        bf16=True,
        flash_attention=True,
        # Baseten "NVIDIA A10 vs A10G": same 24 GB GDDR6 and 600 GB/s as the A10.
        memory_bandwidth_bytes_per_s=600 * _GB,
        # uncertain: NVIDIA publishes no A10G datasheet. Baseten: the A10 "prioritizes
        # tensor compute" while the A10G has more CUDA-core throughput. 80 SMs (torch repr)
        # x 128 x 2 x ~1.71 GHz ~= 35 TFLOPS FP32; tensor FP16/BF16 with FP32 accumulate at
        # the GeForce-GA102 half rate ~= 70 TFLOPS.
        peak_fp16_flops=70 * _T,
        peak_bf16_flops=70 * _T,
        peak_fp32_flops=35 * _T,
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ampere",
        peak_tf32_flops=35 * _T,  # uncertain: GeForce-style TF32 = FP32 rate
        sm_count=80,  # torch repr: multi_processor_count=80
        memory_source_quality="derived",
    ),
    GPU(
        name="a100-40gb",
        display_name="NVIDIA A100-SXM4-40GB",
        aliases=("a100-sxm4-40gb", "a100-sxm-40gb", "a100-40g", "a100-40"),
        # derived = exact: Paddle's get_device_properties for 'A100-SXM4-40GB' prints
        # total_memory=40536MB; 40536 MiB = 42505273344 bytes, the byte-exact figure
        # matrixMulDrv printed for an A100-PCIE-40GB, and the ubiquitous OOM "39.59 GiB total
        # capacity" (Colab A100). Driver 12.4 reports 40326 MiB (42285268992 bytes); one
        # SXM4 node reports 40441 MiB.
        total_memory_bytes=42505273344,
        compute_capability=(8, 0),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=1555 * _GB,  # A100 datasheet: 40GB HBM2 1,555 GB/s
        peak_fp16_flops=312 * _T,  # A100 datasheet: FP16 tensor 312 TFLOPS (624 sparse)
        peak_bf16_flops=312 * _T,  # A100 datasheet: BF16 tensor 312 TFLOPS
        peak_fp32_flops=int(19.5 * _T),  # A100 datasheet: FP32 19.5 TFLOPS
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,  # A100: PCIe Gen4 host link
        architecture="ampere",
        peak_tf32_flops=156 * _T,  # A100 datasheet: TF32 156 TFLOPS (312 sparse)
        sm_count=108,  # deviceQuery: 108 multiprocessors
        nvlink=True,  # SXM4: NVLink 600 GB/s
    ),
    GPU(
        name="a100-80gb",
        display_name="NVIDIA A100-SXM4-80GB",
        # "a100" means this 80 GB SXM4 card: the 80 GB HBM2e part replaced the 40 GB launch
        # part across the market (AWS p4de, GCP a2-ultragpu, Azure NDm A100 v4). Ask for
        # "a100-40gb" for Colab / AWS p4d / GCP a2-highgpu.
        aliases=("a100", "a100-sxm4-80gb", "a100-sxm-80gb", "a100-80g", "a100-80"),
        # exact: deviceQuery (driver 12.2) "81051 MBytes (84987740160 bytes)" = the common OOM
        # "79.15 GiB total capacity"; driver 12.5 showed 81158 MiB (85100068864 bytes).
        total_memory_bytes=84987740160,
        compute_capability=(8, 0),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=2039 * _GB,  # A100 80GB SXM datasheet: 2,039 GB/s
        peak_fp16_flops=312 * _T,  # A100 datasheet
        peak_bf16_flops=312 * _T,  # A100 datasheet
        peak_fp32_flops=int(19.5 * _T),  # A100 datasheet
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ampere",
        peak_tf32_flops=156 * _T,  # A100 datasheet
        sm_count=108,
        nvlink=True,
    ),
    GPU(
        name="a100-pcie-80gb",
        display_name="NVIDIA A100 80GB PCIe",
        aliases=("a100-80gb-pcie", "a100-pcie"),
        # exact: deviceQuery (driver 12.4) "81038 MBytes (84974239744 bytes)".
        total_memory_bytes=84974239744,
        compute_capability=(8, 0),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=1935 * _GB,  # A100 80GB PCIe datasheet: 1,935 GB/s
        peak_fp16_flops=312 * _T,  # A100 datasheet (same peaks as SXM)
        peak_bf16_flops=312 * _T,
        peak_fp32_flops=int(19.5 * _T),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ampere",
        peak_tf32_flops=156 * _T,
        sm_count=108,
    ),
    GPU(
        name="rtx-3060",
        display_name="NVIDIA GeForce RTX 3060",
        aliases=("3060", "rtx3060", "geforce-rtx-3060", "rtx-3060-12gb"),
        # exact: deviceQuery (Linux, driver 12.2) "12044 MBytes (12629508096 bytes)"; other
        # reports 12004-12042 MiB, and 12288 MiB (12884377600 bytes, likely WSL/Windows).
        total_memory_bytes=12629508096,
        compute_capability=(8, 6),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=360 * _GB,  # NVIDIA spec: 15 Gbps x 192-bit
        # GA102/GA106 GeForce whitepaper rule: FP16/BF16 tensor with FP32 accumulate = 2x
        # FP32 rate; FP32 = 3584 cores x 2 x 1.777 GHz = 12.74 TFLOPS.
        peak_fp16_flops=int(25.5 * _T),
        peak_bf16_flops=int(25.5 * _T),
        peak_fp32_flops=int(12.74 * _T),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ampere",
        peak_tf32_flops=int(12.74 * _T),  # GeForce Ampere: TF32 dense = FP32 rate
        sm_count=28,  # deviceQuery: 28 multiprocessors
    ),
    GPU(
        name="rtx-3080-ti",
        display_name="NVIDIA GeForce RTX 3080 Ti",
        aliases=("3080-ti", "3080ti", "rtx3080ti", "geforce-rtx-3080-ti"),
        # exact: deviceQuery (driver 11.4) "12045 MBytes (12630491136 bytes)".
        total_memory_bytes=12630491136,
        compute_capability=(8, 6),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=912 * _GB,  # NVIDIA spec: 19 Gbps x 384-bit = 912 GB/s
        # 10240 cores x 2 x 1.665 GHz = 34.1 TFLOPS FP32; tensor FP32-acc = 2x that.
        peak_fp16_flops=int(68.2 * _T),
        peak_bf16_flops=int(68.2 * _T),
        peak_fp32_flops=int(34.1 * _T),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ampere",
        peak_tf32_flops=int(34.1 * _T),
        sm_count=80,  # deviceQuery: 80 multiprocessors
    ),
    GPU(
        name="rtx-3090",
        display_name="NVIDIA GeForce RTX 3090",
        aliases=("3090", "rtx3090", "geforce-rtx-3090"),
        # exact: deviceQuery (drivers 12.1 and 12.2, two sources) "24238 MBytes
        # (25414860800 bytes)"; driver 11.8 showed 24265-24268 MiB.
        total_memory_bytes=25414860800,
        compute_capability=(8, 6),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=936 * _GB,  # GA102 whitepaper: 936 GB/s
        # GA102 whitepaper (RTX 3090): FP16 tensor w/ FP32 acc 71 TFLOPS (142 sparse),
        # BF16 71, TF32 35.6, FP32 35.6.
        peak_fp16_flops=71 * _T,
        peak_bf16_flops=71 * _T,
        peak_fp32_flops=int(35.6 * _T),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ampere",
        peak_tf32_flops=int(35.6 * _T),
        sm_count=82,  # deviceQuery: 82 multiprocessors
    ),
    GPU(
        name="rtx-a6000",
        display_name="NVIDIA RTX A6000",
        aliases=("a6000", "rtxa6000"),
        # exact: deviceQuery (driver 12.7) "48790 MBytes (51160023040 bytes)", ECC off (the
        # default on this workstation card); with ECC on nvidia-smi shows ~46 GB.
        total_memory_bytes=51160023040,
        compute_capability=(8, 6),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=768 * _GB,  # RTX A6000 datasheet: 768 GB/s
        # RTX A6000 datasheet: tensor performance 309.7 TFLOPS (with sparsity) -> 154.8 dense;
        # pro cards run FP32-accumulate at full rate. FP32 38.7 TFLOPS.
        peak_fp16_flops=int(154.8 * _T),
        peak_bf16_flops=int(154.8 * _T),
        peak_fp32_flops=int(38.7 * _T),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ampere",
        peak_tf32_flops=int(77.4 * _T),  # 2x FP32, as on the A40 datasheet (37.4 -> 74.8)
        sm_count=84,  # deviceQuery: 84 multiprocessors
    ),
    # ---------------------------------------------------------------- Ada (sm89)
    GPU(
        name="l4",
        display_name="NVIDIA L4",
        aliases=("nvidia-l4",),
        # exact: deviceQuery (driver 12.0) "22518 MBytes (23612293120 bytes)" (ECC on);
        # newer drivers' OOM messages say "22.04 GiB" (~22569 MiB).
        total_memory_bytes=23612293120,
        compute_capability=(8, 9),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=300 * _GB,  # L4 datasheet: 300 GB/s
        peak_fp16_flops=121 * _T,  # L4 datasheet: FP16/BF16 tensor 242 TFLOPS sparse -> 121
        peak_bf16_flops=121 * _T,
        peak_fp32_flops=int(30.3 * _T),  # L4 datasheet: FP32 30.3 TFLOPS
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,  # datasheet: PCIe Gen4 x16
        architecture="ada",
        peak_tf32_flops=60 * _T,  # L4 datasheet: TF32 120 TFLOPS sparse -> 60 dense
        sm_count=58,  # deviceQuery: 58 multiprocessors
    ),
    GPU(
        name="l40s",
        display_name="NVIDIA L40S",
        aliases=("nvidia-l40s",),
        # exact: cuda-device-query (driver 12.4) "45373 MBytes (47576711168 bytes)" (ECC on).
        total_memory_bytes=47576711168,
        compute_capability=(8, 9),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=864 * _GB,  # L40S datasheet: 864 GB/s
        peak_fp16_flops=int(362.05 * _T),  # L40S datasheet: FP16 362.05 (733 sparse)
        peak_bf16_flops=int(362.05 * _T),  # L40S datasheet: BF16 362.05 (733 sparse)
        peak_fp32_flops=int(91.6 * _T),  # L40S datasheet: FP32 91.6 TFLOPS
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,  # datasheet: PCIe Gen4 x16
        architecture="ada",
        peak_tf32_flops=183 * _T,  # L40S datasheet: TF32 183 (366 sparse)
        sm_count=142,  # cuda-device-query: 142 multiprocessors
    ),
    GPU(
        name="rtx-4060",
        display_name="NVIDIA GeForce RTX 4060",
        aliases=("4060", "rtx4060", "geforce-rtx-4060"),
        # uncertain: two OOM reports on "RTX 4060 8GB" cards say "total capacity of 7.75 GiB"
        # and "7.72 GiB" (one host is a Core Ultra 9 185H laptop, so possibly the 4060
        # Laptop GPU); 7.75 GiB = 7936 MiB. nvidia-smi shows 8188 MiB.
        total_memory_bytes=7936 * _MiB,
        compute_capability=(8, 9),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=272 * _GB,  # NVIDIA spec: 17 Gbps x 128-bit = 272 GB/s
        # Ada whitepaper rule for GeForce: FP16/BF16 tensor w/ FP32 acc = 2x FP32;
        # FP32 = 3072 cores x 2 x 2.46 GHz boost = 15.11 TFLOPS.
        peak_fp16_flops=int(30.2 * _T),
        peak_bf16_flops=int(30.2 * _T),
        peak_fp32_flops=int(15.11 * _T),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X8_BYTES_PER_S,  # the RTX 4060 is PCIe 4.0 x8
        architecture="ada",
        peak_tf32_flops=int(15.11 * _T),
        sm_count=24,  # 3072 CUDA cores / 128 per SM
        memory_source_quality="uncertain",
    ),
    GPU(
        name="rtx-4070",
        display_name="NVIDIA GeForce RTX 4070",
        aliases=("4070", "rtx4070", "geforce-rtx-4070"),
        # uncertain: no RTX 4070 figure found; this is the RTX 4070 Ti's OOM "11.73 GiB total
        # capacity" (same 12 GB GDDR6X, nvidia-smi 12282 MiB for both) = 12012 MiB.
        total_memory_bytes=12012 * _MiB,
        compute_capability=(8, 9),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=504 * _GB,  # NVIDIA spec: 21 Gbps x 192-bit = 504 GB/s
        # FP32 = 5888 cores x 2 x 2.475 GHz = 29.1 TFLOPS; tensor FP32-acc = 2x.
        peak_fp16_flops=int(58.3 * _T),
        peak_bf16_flops=int(58.3 * _T),
        peak_fp32_flops=int(29.1 * _T),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ada",
        peak_tf32_flops=int(29.1 * _T),
        sm_count=46,  # 5888 CUDA cores / 128 per SM
        memory_source_quality="uncertain",
    ),
    GPU(
        name="rtx-4080",
        display_name="NVIDIA GeForce RTX 4080",
        aliases=("4080", "rtx4080", "geforce-rtx-4080"),
        # derived: torch repr total_memory=16049MB (nvidia-smi 16376 MiB). A Windows OOM
        # message says "15.99 GiB" instead.
        total_memory_bytes=16049 * _MiB,
        compute_capability=(8, 9),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=int(716.8 * _GB),  # NVIDIA spec: 22.4 Gbps x 256-bit
        # Ada whitepaper (RTX 4080): FP32 48.7 TFLOPS, FP16 tensor w/ FP32 acc 97.5 dense.
        peak_fp16_flops=int(97.5 * _T),
        peak_bf16_flops=int(97.5 * _T),
        peak_fp32_flops=int(48.7 * _T),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ada",
        peak_tf32_flops=int(48.7 * _T),
        sm_count=76,  # torch repr: multi_processor_count=76
        memory_source_quality="derived",
    ),
    GPU(
        name="rtx-4090",
        display_name="NVIDIA GeForce RTX 4090",
        aliases=("4090", "rtx4090", "geforce-rtx-4090"),
        # derived: TensorRT trtexec "Device Global Memory: 24207 MiB" = the common Linux OOM
        # "total capacity of 23.64 GiB" (23.61-23.68 GiB seen). Other reports: deviceQuery
        # 24081 MiB (driver 13.0) and 24564 MiB (25756696576 bytes); Windows 23028 MiB.
        total_memory_bytes=24207 * _MiB,
        compute_capability=(8, 9),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=1008 * _GB,  # NVIDIA spec: 21 Gbps x 384-bit
        # Ada whitepaper (RTX 4090): FP16 tensor w/ FP32 acc 165.2 (330.4 sparse),
        # BF16 165.2, TF32 82.6, FP32 82.6 TFLOPS.
        peak_fp16_flops=int(165.2 * _T),
        peak_bf16_flops=int(165.2 * _T),
        peak_fp32_flops=int(82.6 * _T),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ada",
        peak_tf32_flops=int(82.6 * _T),
        sm_count=128,  # deviceQuery: 128 multiprocessors
        memory_source_quality="derived",
    ),
    GPU(
        name="rtx-6000-ada",
        display_name="NVIDIA RTX 6000 Ada Generation",
        aliases=("6000-ada", "rtx6000ada", "rtx-6000-ada-generation"),
        # exact: unsloth-zoo PR #1053 (torch 2.10 cu130): get_device_properties and
        # mem_get_info both "returned exactly 50,865,307,648 bytes" (ECC off). With ECC on
        # an OOM message says "total capacity of 44.43 GiB".
        total_memory_bytes=50865307648,
        compute_capability=(8, 9),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=960 * _GB,  # RTX 6000 Ada datasheet: 960 GB/s
        # RTX 6000 Ada datasheet: FP32 91.1 TFLOPS; AI 1,457 TFLOPS = FP8 sparse -> FP16
        # dense with FP32 accumulate = 1457 / 4 = 364.2 (pro card: full rate).
        peak_fp16_flops=int(364.2 * _T),
        peak_bf16_flops=int(364.2 * _T),
        peak_fp32_flops=int(91.1 * _T),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ada",
        peak_tf32_flops=int(182.1 * _T),  # half the FP16 dense rate, as on the L40S
        sm_count=142,  # 18176 CUDA cores / 128 per SM
    ),
    # ---------------------------------------------------------------- Hopper (sm90)
    GPU(
        name="h100-pcie",
        display_name="NVIDIA H100 PCIe",
        aliases=("h100-pcie-80gb",),
        # derived: torch repr total_memory=81008MB (nvidia-smi: 81559 MiB).
        total_memory_bytes=81008 * _MiB,
        compute_capability=(9, 0),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=2000 * _GB,  # H100 PCIe datasheet: 2 TB/s (HBM2e)
        # H100 datasheet (PCIe): FP16/BF16 tensor 1,513 sparse -> 756.5 dense; TF32 756 sparse
        # -> 378 dense; FP32 51 TFLOPS (114 SMs).
        peak_fp16_flops=int(756.5 * _T),
        peak_bf16_flops=int(756.5 * _T),
        peak_fp32_flops=int(51.2 * _T),
        pcie_bandwidth_bytes_per_s=PCIE_GEN5_X16_BYTES_PER_S,  # datasheet: PCIe Gen5 128 GB/s
        architecture="hopper",
        peak_tf32_flops=378 * _T,
        sm_count=114,  # torch repr: multi_processor_count=114
        memory_source_quality="derived",
    ),
    GPU(
        name="h100-sxm",
        display_name="NVIDIA H100 80GB HBM3",
        # "h100" means this SXM5 card (HGX H100 boards: every hyperscaler's H100 instances).
        aliases=("h100", "h100-sxm5", "h100-80gb", "h100-80gb-hbm3", "h100-sxm-80gb"),
        # exact: deviceQuery (driver 12.8) "81090 MBytes (85028896768 bytes)"; driver 12.7:
        # 81106 MiB (85045477376 bytes); driver 13.0: 81079 MiB (85017755648 bytes).
        total_memory_bytes=85028896768,
        compute_capability=(9, 0),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=3350 * _GB,  # H100 SXM datasheet: 3.35 TB/s
        # H100 SXM: FP16/BF16 tensor 989.4 dense (1,979 sparse), TF32 494.7, FP32 66.9
        # (NVIDIA datasheet; per-type table in glennklockwood.com/garden/processors/h100).
        peak_fp16_flops=int(989.4 * _T),
        peak_bf16_flops=int(989.4 * _T),
        peak_fp32_flops=int(66.9 * _T),
        pcie_bandwidth_bytes_per_s=PCIE_GEN5_X16_BYTES_PER_S,  # datasheet: PCIe Gen5
        architecture="hopper",
        peak_tf32_flops=int(494.7 * _T),
        sm_count=132,  # deviceQuery: 132 multiprocessors
        nvlink=True,  # NVLink 900 GB/s
    ),
    GPU(
        name="h200",
        display_name="NVIDIA H200",
        aliases=("h200-sxm", "h200-141gb", "nvidia-h200"),
        # derived: torch repr (Modal) total_memory=143156MB = the common OOM "total capacity
        # of 139.80 GiB" (139.81 also seen); nvidia-smi 143771 MiB.
        total_memory_bytes=143156 * _MiB,
        compute_capability=(9, 0),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=4800 * _GB,  # H200 datasheet: 4.8 TB/s HBM3e
        # H200 = H100 SXM silicon with 141 GB HBM3e: same 989.4 / 494.7 / 66.9 peaks.
        peak_fp16_flops=int(989.4 * _T),
        peak_bf16_flops=int(989.4 * _T),
        peak_fp32_flops=int(66.9 * _T),
        pcie_bandwidth_bytes_per_s=PCIE_GEN5_X16_BYTES_PER_S,
        architecture="hopper",
        peak_tf32_flops=int(494.7 * _T),
        sm_count=132,  # torch repr: multi_processor_count=132
        nvlink=True,
        memory_source_quality="derived",
    ),
)
# fmt: on


def _normalize(text: str) -> str:
    """Lowercase, '-'-joined, vendor words dropped: 'NVIDIA GeForce RTX 4090' -> 'rtx-4090'."""
    cleaned = text.strip().lower()
    for sep in ("_", " ", "/", "."):
        cleaned = cleaned.replace(sep, "-")
    tokens = [t for t in cleaned.split("-") if t and t not in ("nvidia", "geforce")]
    return "-".join(tokens)


def _compact(text: str) -> str:
    return _normalize(text).replace("-", "")


def _build_index() -> dict[str, GPU]:
    index: dict[str, GPU] = {}
    for gpu in _CATALOG:
        for key in (gpu.name, gpu.display_name, *gpu.aliases):
            compact = _compact(key)
            other = index.get(compact)
            if other is not None and other.name != gpu.name:
                raise AssertionError(f"GPU alias {key!r} is ambiguous: {other.name} and {gpu.name}")
            index[compact] = gpu
    return index


_INDEX = _build_index()


def list_gpus() -> list[GPU]:
    """Every GPU in the catalog, in catalog order (oldest architecture first)."""
    return list(_CATALOG)


#: The GPU whose kernels, context and workspaces are assumed for a bare budget ("12GiB").
_BUDGET_ONLY_GPU = "a100-80gb"


def _looks_like_size(name: str) -> bool:
    # A unit is required: "4090" is a card, "4090MiB" a budget.
    return bool(re.match(r"^\s*\d+(\.\d+)?\s*[kmgt]i?b\s*$", name, re.IGNORECASE))


def with_budget(gpu: GPU, size: str) -> GPU:
    """`gpu` limited to a memory budget (a MIG slice, a shared card, a safety cap).

    The budget replaces the capacity PyTorch would see; it must be larger than what CUDA keeps
    outside PyTorch's allocator (context, kernels), and not larger than the card.
    """
    from dataclasses import replace

    from memfit.device_overhead import device_overhead
    from memfit.units import parse_bytes

    budget = parse_bytes(size)
    outside = device_overhead(gpu).outside_allocator_bytes()
    gib = 1 << 30
    if budget <= outside:
        raise BadInputError(
            f"The budget {size.strip()!r} ({budget / gib:.2f} GiB) is smaller than the memory "
            f"CUDA itself takes on {gpu.display_name} outside PyTorch's allocator (CUDA context "
            f"and kernels, {outside / gib:.2f} GiB): nothing would be left for tensors. "
            f"Give a budget above {outside / gib:.2f} GiB."
        )
    if budget > gpu.total_memory_bytes:
        raise BadInputError(
            f"The budget {size.strip()!r} ({budget / gib:.2f} GiB) is more than "
            f"{gpu.display_name} has ({gpu.total_memory_gib:.2f} GiB). Give a smaller budget "
            "or another GPU."
        )
    return replace(
        gpu,
        name=f"{gpu.name}@{size.strip()}",
        display_name=f"{gpu.display_name} limited to {budget / gib:.2f} GiB",
        total_memory_bytes=budget,
    )


def get_gpu(name: str) -> GPU:
    """Look a GPU up by canonical name, alias or torch display name (case-insensitive).

    ``"rtx-4090@12GiB"`` is the card limited to a budget; a bare ``"12GiB"`` assumes an A100's
    kernels and context (see `with_budget`).

    ``"4090"``, ``"RTX4090"``, ``"NVIDIA GeForce RTX 4090"`` and ``"rtx-4090"`` all work.
    ``"a100"`` is the 80 GB SXM4 card, ``"h100"`` the SXM5 card and ``"v100"`` the 16 GB SXM2.
    An unknown name raises BadInputError quoting it and naming the closest known names.
    """
    if isinstance(name, str) and "@" in name:
        base, _, size = name.partition("@")
        return with_budget(get_gpu(base) if base.strip() else get_gpu(_BUDGET_ONLY_GPU), size)
    if isinstance(name, str) and name.strip()[:1].isdigit() and _looks_like_size(name):
        return with_budget(get_gpu(_BUDGET_ONLY_GPU), name)
    if not isinstance(name, str) or not name.strip():
        raise BadInputError(
            f"GPU name {name!r} is empty; use one of: {', '.join(g.name for g in _CATALOG)}."
        )
    gpu = _INDEX.get(_compact(name))
    if gpu is not None:
        return gpu
    wanted = _normalize(name)
    # Suggest canonical names first; fall back to aliases ("5090" is closer to "4090").
    hint = closest(wanted, [g.name for g in _CATALOG]) or closest(
        wanted, [a for g in _CATALOG for a in g.aliases]
    )
    raise BadInputError(
        f"Unknown GPU {name!r}.{hint} Known GPUs: {', '.join(g.name for g in _CATALOG)}."
    )
