"""The GPU catalog's entries (see `memfit.cuda.gpus` for what each field means and how the
figures were sourced; `memfit.cuda.target` looks them up)."""

from __future__ import annotations

from memfit.cuda.gpus import (
    GIGA,
    GPU,
    PCIE_GEN3_X16_BYTES_PER_S,
    PCIE_GEN4_X8_BYTES_PER_S,
    PCIE_GEN4_X16_BYTES_PER_S,
    PCIE_GEN5_X16_BYTES_PER_S,
    TERA,
)
from memfit.units import MIB

# fmt: off
CATALOG: tuple[GPU, ...] = (
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
        memory_bandwidth_bytes_per_s=320 * GIGA,  # T4 datasheet: 320+ GB/s
        peak_fp16_flops=65 * TERA,  # T4 datasheet: mixed precision (FP16/FP32) 65 TFLOPS
        peak_bf16_flops=0,
        peak_fp32_flops=int(8.1 * TERA),  # T4 datasheet: single precision 8.1 TFLOPS
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
        memory_bandwidth_bytes_per_s=336 * GIGA,  # NVIDIA spec: 14 Gbps x 192-bit = 336 GB/s
        # Turing whitepaper rule for GeForce: FP16 tensor with FP32 accumulate = half the
        # FP16-accumulate rate; 240 tensor cores x 64 FMA x 2 x 1.68 GHz = 51.6 / 2 = 25.8.
        peak_fp16_flops=int(25.8 * TERA),
        peak_bf16_flops=0,
        peak_fp32_flops=int(6.45 * TERA),  # 1920 CUDA cores x 2 x 1.68 GHz boost
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
        memory_bandwidth_bytes_per_s=900 * GIGA,  # V100 datasheet: 900 GB/s
        peak_fp16_flops=125 * TERA,  # V100 SXM2 datasheet: tensor performance 125 TFLOPS
        peak_bf16_flops=0,
        peak_fp32_flops=int(15.7 * TERA),  # V100 SXM2 datasheet: single precision 15.7 TFLOPS
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
        memory_bandwidth_bytes_per_s=900 * GIGA,  # V100 datasheet: 900 GB/s
        peak_fp16_flops=125 * TERA,  # V100 SXM2 datasheet: 125 TFLOPS
        peak_bf16_flops=0,
        peak_fp32_flops=int(15.7 * TERA),  # V100 SXM2 datasheet: 15.7 TFLOPS
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
        memory_bandwidth_bytes_per_s=600 * GIGA,  # A10 datasheet: 600 GB/s
        peak_fp16_flops=125 * TERA,  # A10 datasheet: FP16 tensor 125 TFLOPS (250 sparse)
        peak_bf16_flops=125 * TERA,  # A10 datasheet: BF16 tensor 125 TFLOPS (250 sparse)
        peak_fp32_flops=int(31.2 * TERA),  # A10 datasheet: FP32 31.2 TFLOPS
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,  # datasheet: PCIe Gen4
        architecture="ampere",
        peak_tf32_flops=int(62.5 * TERA),  # A10 datasheet: TF32 62.5 TFLOPS (125 sparse)
        sm_count=72,  # deviceQuery: 72 multiprocessors
    ),
    GPU(
        name="a10g",
        display_name="NVIDIA A10G",
        aliases=("nvidia-a10g", "aws-a10g"),
        # derived: torch repr (torch 2.15 cu130) total_memory=22587MB -> 22587 MiB; matches
        # the OOM "total capacity of 22.06 GiB" reported for A10G.
        total_memory_bytes=22587 * MIB,
        compute_capability=(8, 6),
        bf16=True,
        flash_attention=True,
        # Baseten "NVIDIA A10 vs A10G": same 24 GB GDDR6 and 600 GB/s as the A10.
        memory_bandwidth_bytes_per_s=600 * GIGA,
        # uncertain: NVIDIA publishes no A10G datasheet. Baseten: the A10 "prioritizes
        # tensor compute" while the A10G has more CUDA-core throughput. 80 SMs (torch repr)
        # x 128 x 2 x ~1.71 GHz ~= 35 TFLOPS FP32; tensor FP16/BF16 with FP32 accumulate at
        # the GeForce-GA102 half rate ~= 70 TFLOPS.
        peak_fp16_flops=70 * TERA,
        peak_bf16_flops=70 * TERA,
        peak_fp32_flops=35 * TERA,
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ampere",
        peak_tf32_flops=35 * TERA,  # uncertain: GeForce-style TF32 = FP32 rate
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
        memory_bandwidth_bytes_per_s=1555 * GIGA,  # A100 datasheet: 40GB HBM2 1,555 GB/s
        peak_fp16_flops=312 * TERA,  # A100 datasheet: FP16 tensor 312 TFLOPS (624 sparse)
        peak_bf16_flops=312 * TERA,  # A100 datasheet: BF16 tensor 312 TFLOPS
        peak_fp32_flops=int(19.5 * TERA),  # A100 datasheet: FP32 19.5 TFLOPS
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,  # A100: PCIe Gen4 host link
        architecture="ampere",
        peak_tf32_flops=156 * TERA,  # A100 datasheet: TF32 156 TFLOPS (312 sparse)
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
        memory_bandwidth_bytes_per_s=2039 * GIGA,  # A100 80GB SXM datasheet: 2,039 GB/s
        peak_fp16_flops=312 * TERA,  # A100 datasheet
        peak_bf16_flops=312 * TERA,  # A100 datasheet
        peak_fp32_flops=int(19.5 * TERA),  # A100 datasheet
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ampere",
        peak_tf32_flops=156 * TERA,  # A100 datasheet
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
        memory_bandwidth_bytes_per_s=1935 * GIGA,  # A100 80GB PCIe datasheet: 1,935 GB/s
        peak_fp16_flops=312 * TERA,  # A100 datasheet (same peaks as SXM)
        peak_bf16_flops=312 * TERA,
        peak_fp32_flops=int(19.5 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ampere",
        peak_tf32_flops=156 * TERA,
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
        memory_bandwidth_bytes_per_s=360 * GIGA,  # NVIDIA spec: 15 Gbps x 192-bit
        # GA102/GA106 GeForce whitepaper rule: FP16/BF16 tensor with FP32 accumulate = 2x
        # FP32 rate; FP32 = 3584 cores x 2 x 1.777 GHz = 12.74 TFLOPS.
        peak_fp16_flops=int(25.5 * TERA),
        peak_bf16_flops=int(25.5 * TERA),
        peak_fp32_flops=int(12.74 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ampere",
        peak_tf32_flops=int(12.74 * TERA),  # GeForce Ampere: TF32 dense = FP32 rate
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
        memory_bandwidth_bytes_per_s=912 * GIGA,  # NVIDIA spec: 19 Gbps x 384-bit = 912 GB/s
        # 10240 cores x 2 x 1.665 GHz = 34.1 TFLOPS FP32; tensor FP32-acc = 2x that.
        peak_fp16_flops=int(68.2 * TERA),
        peak_bf16_flops=int(68.2 * TERA),
        peak_fp32_flops=int(34.1 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ampere",
        peak_tf32_flops=int(34.1 * TERA),
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
        memory_bandwidth_bytes_per_s=936 * GIGA,  # GA102 whitepaper: 936 GB/s
        # GA102 whitepaper (RTX 3090): FP16 tensor w/ FP32 acc 71 TFLOPS (142 sparse),
        # BF16 71, TF32 35.6, FP32 35.6.
        peak_fp16_flops=71 * TERA,
        peak_bf16_flops=71 * TERA,
        peak_fp32_flops=int(35.6 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ampere",
        peak_tf32_flops=int(35.6 * TERA),
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
        memory_bandwidth_bytes_per_s=768 * GIGA,  # RTX A6000 datasheet: 768 GB/s
        # RTX A6000 datasheet: tensor performance 309.7 TFLOPS (with sparsity) -> 154.8 dense;
        # pro cards run FP32-accumulate at full rate. FP32 38.7 TFLOPS.
        peak_fp16_flops=int(154.8 * TERA),
        peak_bf16_flops=int(154.8 * TERA),
        peak_fp32_flops=int(38.7 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ampere",
        peak_tf32_flops=int(77.4 * TERA),  # 2x FP32, as on the A40 datasheet (37.4 -> 74.8)
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
        memory_bandwidth_bytes_per_s=300 * GIGA,  # L4 datasheet: 300 GB/s
        peak_fp16_flops=121 * TERA,  # L4 datasheet: FP16/BF16 tensor 242 TFLOPS sparse -> 121
        peak_bf16_flops=121 * TERA,
        peak_fp32_flops=int(30.3 * TERA),  # L4 datasheet: FP32 30.3 TFLOPS
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,  # datasheet: PCIe Gen4 x16
        architecture="ada",
        peak_tf32_flops=60 * TERA,  # L4 datasheet: TF32 120 TFLOPS sparse -> 60 dense
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
        memory_bandwidth_bytes_per_s=864 * GIGA,  # L40S datasheet: 864 GB/s
        peak_fp16_flops=int(362.05 * TERA),  # L40S datasheet: FP16 362.05 (733 sparse)
        peak_bf16_flops=int(362.05 * TERA),  # L40S datasheet: BF16 362.05 (733 sparse)
        peak_fp32_flops=int(91.6 * TERA),  # L40S datasheet: FP32 91.6 TFLOPS
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,  # datasheet: PCIe Gen4 x16
        architecture="ada",
        peak_tf32_flops=183 * TERA,  # L40S datasheet: TF32 183 (366 sparse)
        sm_count=142,  # cuda-device-query: 142 multiprocessors
    ),
    GPU(
        name="rtx-4060",
        display_name="NVIDIA GeForce RTX 4060",
        aliases=("4060", "rtx4060", "geforce-rtx-4060"),
        # uncertain: two OOM reports on "RTX 4060 8GB" cards say "total capacity of 7.75 GiB"
        # and "7.72 GiB" (one host is a Core Ultra 9 185H laptop, so possibly the 4060
        # Laptop GPU); 7.75 GiB = 7936 MiB. nvidia-smi shows 8188 MiB.
        total_memory_bytes=7936 * MIB,
        compute_capability=(8, 9),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=272 * GIGA,  # NVIDIA spec: 17 Gbps x 128-bit = 272 GB/s
        # Ada whitepaper rule for GeForce: FP16/BF16 tensor w/ FP32 acc = 2x FP32;
        # FP32 = 3072 cores x 2 x 2.46 GHz boost = 15.11 TFLOPS.
        peak_fp16_flops=int(30.2 * TERA),
        peak_bf16_flops=int(30.2 * TERA),
        peak_fp32_flops=int(15.11 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X8_BYTES_PER_S,  # the RTX 4060 is PCIe 4.0 x8
        architecture="ada",
        peak_tf32_flops=int(15.11 * TERA),
        sm_count=24,  # 3072 CUDA cores / 128 per SM
        memory_source_quality="uncertain",
    ),
    GPU(
        name="rtx-4070",
        display_name="NVIDIA GeForce RTX 4070",
        aliases=("4070", "rtx4070", "geforce-rtx-4070"),
        # uncertain: no RTX 4070 figure found; this is the RTX 4070 Ti's OOM "11.73 GiB total
        # capacity" (same 12 GB GDDR6X, nvidia-smi 12282 MiB for both) = 12012 MiB.
        total_memory_bytes=12012 * MIB,
        compute_capability=(8, 9),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=504 * GIGA,  # NVIDIA spec: 21 Gbps x 192-bit = 504 GB/s
        # FP32 = 5888 cores x 2 x 2.475 GHz = 29.1 TFLOPS; tensor FP32-acc = 2x.
        peak_fp16_flops=int(58.3 * TERA),
        peak_bf16_flops=int(58.3 * TERA),
        peak_fp32_flops=int(29.1 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ada",
        peak_tf32_flops=int(29.1 * TERA),
        sm_count=46,  # 5888 CUDA cores / 128 per SM
        memory_source_quality="uncertain",
    ),
    GPU(
        name="rtx-4080",
        display_name="NVIDIA GeForce RTX 4080",
        aliases=("4080", "rtx4080", "geforce-rtx-4080"),
        # derived: torch repr total_memory=16049MB (nvidia-smi 16376 MiB). A Windows OOM
        # message says "15.99 GiB" instead.
        total_memory_bytes=16049 * MIB,
        compute_capability=(8, 9),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=int(716.8 * GIGA),  # NVIDIA spec: 22.4 Gbps x 256-bit
        # Ada whitepaper (RTX 4080): FP32 48.7 TFLOPS, FP16 tensor w/ FP32 acc 97.5 dense.
        peak_fp16_flops=int(97.5 * TERA),
        peak_bf16_flops=int(97.5 * TERA),
        peak_fp32_flops=int(48.7 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ada",
        peak_tf32_flops=int(48.7 * TERA),
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
        total_memory_bytes=24207 * MIB,
        compute_capability=(8, 9),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=1008 * GIGA,  # NVIDIA spec: 21 Gbps x 384-bit
        # Ada whitepaper (RTX 4090): FP16 tensor w/ FP32 acc 165.2 (330.4 sparse),
        # BF16 165.2, TF32 82.6, FP32 82.6 TFLOPS.
        peak_fp16_flops=int(165.2 * TERA),
        peak_bf16_flops=int(165.2 * TERA),
        peak_fp32_flops=int(82.6 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ada",
        peak_tf32_flops=int(82.6 * TERA),
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
        memory_bandwidth_bytes_per_s=960 * GIGA,  # RTX 6000 Ada datasheet: 960 GB/s
        # RTX 6000 Ada datasheet: FP32 91.1 TFLOPS; AI 1,457 TFLOPS = FP8 sparse -> FP16
        # dense with FP32 accumulate = 1457 / 4 = 364.2 (pro card: full rate).
        peak_fp16_flops=int(364.2 * TERA),
        peak_bf16_flops=int(364.2 * TERA),
        peak_fp32_flops=int(91.1 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ada",
        peak_tf32_flops=int(182.1 * TERA),  # half the FP16 dense rate, as on the L40S
        sm_count=142,  # 18176 CUDA cores / 128 per SM
    ),
    # ---------------------------------------------------------------- Hopper (sm90)
    GPU(
        name="h100-pcie",
        display_name="NVIDIA H100 PCIe",
        aliases=("h100-pcie-80gb",),
        # derived: torch repr total_memory=81008MB (nvidia-smi: 81559 MiB).
        total_memory_bytes=81008 * MIB,
        compute_capability=(9, 0),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=2000 * GIGA,  # H100 PCIe datasheet: 2 TB/s (HBM2e)
        # H100 datasheet (PCIe): FP16/BF16 tensor 1,513 sparse -> 756.5 dense; TF32 756 sparse
        # -> 378 dense; FP32 51 TFLOPS (114 SMs).
        peak_fp16_flops=int(756.5 * TERA),
        peak_bf16_flops=int(756.5 * TERA),
        peak_fp32_flops=int(51.2 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN5_X16_BYTES_PER_S,  # datasheet: PCIe Gen5 128 GB/s
        architecture="hopper",
        peak_tf32_flops=378 * TERA,
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
        memory_bandwidth_bytes_per_s=3350 * GIGA,  # H100 SXM datasheet: 3.35 TB/s
        # H100 SXM: FP16/BF16 tensor 989.4 dense (1,979 sparse), TF32 494.7, FP32 66.9
        # (NVIDIA datasheet; per-type table in glennklockwood.com/garden/processors/h100).
        peak_fp16_flops=int(989.4 * TERA),
        peak_bf16_flops=int(989.4 * TERA),
        peak_fp32_flops=int(66.9 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN5_X16_BYTES_PER_S,  # datasheet: PCIe Gen5
        architecture="hopper",
        peak_tf32_flops=int(494.7 * TERA),
        sm_count=132,  # deviceQuery: 132 multiprocessors
        nvlink=True,  # NVLink 900 GB/s
    ),
    GPU(
        name="h200",
        display_name="NVIDIA H200",
        aliases=("h200-sxm", "h200-141gb", "nvidia-h200"),
        # derived: torch repr (Modal) total_memory=143156MB = the common OOM "total capacity
        # of 139.80 GiB" (139.81 also seen); nvidia-smi 143771 MiB.
        total_memory_bytes=143156 * MIB,
        compute_capability=(9, 0),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=4800 * GIGA,  # H200 datasheet: 4.8 TB/s HBM3e
        # H200 = H100 SXM silicon with 141 GB HBM3e: same 989.4 / 494.7 / 66.9 peaks.
        peak_fp16_flops=int(989.4 * TERA),
        peak_bf16_flops=int(989.4 * TERA),
        peak_fp32_flops=int(66.9 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN5_X16_BYTES_PER_S,
        architecture="hopper",
        peak_tf32_flops=int(494.7 * TERA),
        sm_count=132,  # torch repr: multi_processor_count=132
        nvlink=True,
        memory_source_quality="derived",
    ),
)
# fmt: on
