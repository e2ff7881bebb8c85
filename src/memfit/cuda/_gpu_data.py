"""The GPU catalog's entries (see `memfit.cuda.gpus` for what each field means and how the
figures were sourced; `memfit.cuda.target` looks them up)."""

from __future__ import annotations

from memfit.cuda.gpus import (
    GIGA,
    GPU,
    PCIE_GEN3_X16_BYTES_PER_S,
    PCIE_GEN4_X8_BYTES_PER_S,
    PCIE_GEN4_X16_BYTES_PER_S,
    PCIE_GEN5_X8_BYTES_PER_S,
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
        aliases=("3060", "rtx3060", "geforce-rtx-3060", "rtx-3060-12gb", "3060-12gb"),
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
    GPU(
        name="rtx-a5000",
        display_name="NVIDIA RTX A5000",
        aliases=("a5000", "rtxa5000"),
        # exact: a device-properties print (CUDA sample-style device_info) "24226 MBytes
        # (25402343424 bytes)", 64 multiprocessors; nvidia-smi shows 24564 MiB.
        total_memory_bytes=25402343424,
        compute_capability=(8, 6),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=768 * GIGA,  # RTX A5000 datasheet: 768 GB/s
        # RTX A5000 datasheet: tensor performance 222.2 TFLOPS (with sparsity) -> 111.1 dense
        # (pro card: FP32 accumulate at full rate); FP32 27.8 TFLOPS.
        peak_fp16_flops=int(111.1 * TERA),
        peak_bf16_flops=int(111.1 * TERA),
        peak_fp32_flops=int(27.8 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,  # datasheet: PCIe Gen4 x16
        architecture="ampere",
        peak_tf32_flops=int(55.6 * TERA),  # 2x FP32, as on the A40 datasheet
        sm_count=64,  # device_info: 64 multiprocessors
    ),
    GPU(
        name="rtx-a4000",
        display_name="NVIDIA RTX A4000",
        aliases=("a4000", "rtxa4000"),
        # derived: OOM "GPU 0 has a total capacity of 15.61 GiB" on an RTX A4000 16GB
        # (DengKaiCQ/VGGT-Long #6) = 15985 MiB, within ~5 MiB.
        total_memory_bytes=15985 * MIB,
        compute_capability=(8, 6),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=448 * GIGA,  # RTX A4000 datasheet: 448 GB/s
        # RTX A4000 datasheet: tensor performance 153.4 TFLOPS (with sparsity) -> 76.7 dense;
        # FP32 19.2 TFLOPS.
        peak_fp16_flops=int(76.7 * TERA),
        peak_bf16_flops=int(76.7 * TERA),
        peak_fp32_flops=int(19.2 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,  # datasheet: PCIe Gen4 x16
        architecture="ampere",
        peak_tf32_flops=int(38.4 * TERA),  # 2x FP32, as on the A40 datasheet
        sm_count=48,  # 6144 CUDA cores / 128 per SM
        memory_source_quality="derived",
    ),
    GPU(
        name="a40",
        display_name="NVIDIA A40",
        aliases=("nvidia-a40",),
        # exact: deviceQuery (driver 12.4) "45403 MBytes (47608692736 bytes)", 84
        # multiprocessors (ECC on, the A40's default: 48 GB GDDR6 with ECC).
        total_memory_bytes=47608692736,
        compute_capability=(8, 6),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=696 * GIGA,  # A40 datasheet: 696 GB/s
        # A40 datasheet: BF16/FP16 tensor 149.7 TFLOPS (299.4 sparse), TF32 74.8 (149.6
        # sparse), FP32 37.4 TFLOPS.
        peak_fp16_flops=int(149.7 * TERA),
        peak_bf16_flops=int(149.7 * TERA),
        peak_fp32_flops=int(37.4 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,  # datasheet: PCIe Gen4 x16
        architecture="ampere",
        peak_tf32_flops=int(74.8 * TERA),
        sm_count=84,  # deviceQuery: 84 multiprocessors
        # nvlink stays False: the A40's NVLink is a bridge between two cards (112.5 GB/s).
    ),
    GPU(
        name="a100-pcie-40gb",
        display_name="NVIDIA A100-PCIE-40GB",
        aliases=("a100-40gb-pcie", "a100-pcie-40g"),
        # exact: deviceQuery (driver 12.2, three sources) "40339 MBytes (42298834944 bytes)";
        # other drivers: 40370 MiB (12.0), 40338 MiB (12.3), 40326 MiB (12.4), 40441 MiB (13.0),
        # 40536 MiB (older; see a100-40gb).
        total_memory_bytes=42298834944,
        compute_capability=(8, 0),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=1555 * GIGA,  # A100 datasheet: 40GB PCIe 1,555 GB/s
        peak_fp16_flops=312 * TERA,  # A100 datasheet (same peaks as SXM)
        peak_bf16_flops=312 * TERA,
        peak_fp32_flops=int(19.5 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,
        architecture="ampere",
        peak_tf32_flops=156 * TERA,
        sm_count=108,  # deviceQuery: 108 multiprocessors
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
        name="l40",
        display_name="NVIDIA L40",
        aliases=("nvidia-l40",),
        # derived: OOM "GPU 0 has a total capacity of 44.40 GiB" on a single L40 (QwenLM/Qwen3-VL
        # #2097, CUDA 12.8 wheels) = 45466 MiB, within ~5 MiB (ECC on, the default).
        total_memory_bytes=45466 * MIB,
        compute_capability=(8, 9),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=864 * GIGA,  # L40 datasheet: 864 GB/s
        # L40 datasheet: BF16/FP16 tensor 181.05 TFLOPS (362.1 sparse), TF32 90.5 (181
        # sparse), FP32 90.5 TFLOPS.
        peak_fp16_flops=int(181.05 * TERA),
        peak_bf16_flops=int(181.05 * TERA),
        peak_fp32_flops=int(90.5 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X16_BYTES_PER_S,  # datasheet: PCIe Gen4 x16
        architecture="ada",
        peak_tf32_flops=int(90.5 * TERA),
        sm_count=142,  # 18176 CUDA cores / 128 per SM (same AD102 configuration as the L40S)
        memory_source_quality="derived",
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
        name="rtx-4060-ti-8gb",
        display_name="NVIDIA GeForce RTX 4060 Ti",  # the 16 GB card prints the same name
        aliases=(
            "4060-ti-8gb", "4060ti-8gb", "4060-ti-8g", "4060ti-8g", "rtx-4060-ti-8g",
            "rtx4060ti-8gb",
        ),
        # uncertain: no figure found for this card; this is the RTX 4060's OOM "total capacity
        # of 7.75 GiB" (same 8 GB GDDR6, nvidia-smi 8188 MiB on both) = 7936 MiB.
        total_memory_bytes=7936 * MIB,
        compute_capability=(8, 9),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=288 * GIGA,  # NVIDIA spec: 18 Gbps x 128-bit = 288 GB/s
        peak_fp16_flops=int(44.1 * TERA),  # same AD106 chip and clocks as the 16 GB card
        peak_bf16_flops=int(44.1 * TERA),
        peak_fp32_flops=int(22.06 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X8_BYTES_PER_S,
        architecture="ada",
        peak_tf32_flops=int(22.06 * TERA),
        sm_count=34,
        memory_source_quality="uncertain",
    ),
    GPU(
        name="rtx-4060-ti-16gb",
        display_name="NVIDIA GeForce RTX 4060 Ti",  # the 8 GB card prints the same name
        aliases=(
            "4060-ti-16gb", "4060ti-16gb", "4060-ti-16g", "4060ti-16g", "rtx-4060-ti-16g",
            "rtx4060ti-16gb",
        ),
        # exact: deviceQuery (Debian, driver 590.48, CUDA 13.1) "15948 MBytes (16722821120
        # bytes)", 34 multiprocessors. Windows reports 16380 MiB (17175150592 bytes), which is
        # also nvidia-smi's total.
        total_memory_bytes=16722821120,
        compute_capability=(8, 9),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=288 * GIGA,  # NVIDIA spec: 18 Gbps x 128-bit = 288 GB/s
        # Ada GeForce rule: FP16/BF16 tensor w/ FP32 acc = 2x FP32; FP32 = 4352 cores x 2 x
        # 2.535 GHz boost = 22.06 TFLOPS. (A bf16 matmul benchmark measured 44.7 TFLOPS.)
        peak_fp16_flops=int(44.1 * TERA),
        peak_bf16_flops=int(44.1 * TERA),
        peak_fp32_flops=int(22.06 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN4_X8_BYTES_PER_S,  # the RTX 4060 Ti is PCIe 4.0 x8
        architecture="ada",
        peak_tf32_flops=int(22.06 * TERA),
        sm_count=34,  # deviceQuery: 34 multiprocessors
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
    GPU(
        name="h100-nvl",
        display_name="NVIDIA H100 NVL",
        aliases=("h100-nvl-94gb", "h100nvl"),
        # derived: OOM "GPU 0 has a total capacity of 93.00 GiB" on an H100 NVL 94GB (RunPod;
        # ali-vilab/VACE #56) = 95232 MiB. Another record (torch 2.5.1+cu124) gives
        # 99456909312 bytes (92.63 GiB); nvidia-smi shows 95830 MiB.
        total_memory_bytes=95232 * MIB,
        compute_capability=(9, 0),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=3900 * GIGA,  # H100 NVL datasheet: 3.9 TB/s (HBM3)
        # H100 NVL datasheet (per GPU): BF16/FP16 tensor 1,671 TFLOPS sparse -> 835.5 dense;
        # TF32 835 sparse -> 417.5 dense; FP32 60 TFLOPS.
        peak_fp16_flops=int(835.5 * TERA),
        peak_bf16_flops=int(835.5 * TERA),
        peak_fp32_flops=60 * TERA,
        pcie_bandwidth_bytes_per_s=PCIE_GEN5_X16_BYTES_PER_S,  # datasheet: PCIe Gen5 128 GB/s
        architecture="hopper",
        peak_tf32_flops=int(417.5 * TERA),
        sm_count=132,  # 16896 CUDA cores / 128 per SM
        # nvlink stays False: NVL cards are bridged in pairs (600 GB/s); the rest is PCIe.
        memory_source_quality="derived",
    ),
    GPU(
        name="gh200",
        display_name="NVIDIA GH200 480GB",
        # "gh200" means the 96 GB HBM3 part (Lambda's and most HPC centres' GH200); torch names
        # it "GH200 480GB" or "GH200 120GB" after the Grace LPDDR5X beside it.
        aliases=("gh200-480gb", "gh200-120gb", "gh200-96gb", "nvidia-gh200", "grace-hopper"),
        # exact: deviceQuery (driver 12.9, a 4-GH200 node) "96768 MBytes (101468602368
        # bytes)"; driver 12.2: 97280 MiB (102005473280 bytes); an OOM message says "total
        # capacity of 94.88 GiB" (~97157 MiB; Lightning-AI/litgpt #1892).
        total_memory_bytes=101468602368,
        compute_capability=(9, 0),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=4000 * GIGA,  # GH200 datasheet: 96GB HBM3, 4 TB/s
        # GH200 datasheet: the H100 SXM's tensor peaks, FP16/BF16 1,979 sparse -> 989.4 dense,
        # TF32 494.7 dense; FP32 67 TFLOPS.
        peak_fp16_flops=int(989.4 * TERA),
        peak_bf16_flops=int(989.4 * TERA),
        peak_fp32_flops=67 * TERA,
        # The host link is NVLink-C2C to the Grace CPU, 900 GB/s both ways (GH200 datasheet):
        # CPU offload runs at 450 GB/s per direction, not over PCIe.
        pcie_bandwidth_bytes_per_s=450 * GIGA,
        architecture="hopper",
        peak_tf32_flops=int(494.7 * TERA),
        sm_count=132,  # deviceQuery: 132 multiprocessors
        nvlink=True,  # multi-GH200 nodes link the GPUs with NVLink 4 (900 GB/s)
    ),
    # ---------------------------------------------------------------- Blackwell (sm100 / sm120)
    GPU(
        name="b200",
        display_name="NVIDIA B200",
        aliases=("nvidia-b200", "hgx-b200", "dgx-b200", "b200-sxm", "b200-180gb"),
        # derived: torch repr (torch 2.x cu128) total_memory=182631MB = the "Total Global
        # Memory: 178.35 GB" (GiB) pytorch/ao #4002 printed from cudaDeviceProp; a Modal B200
        # printed 182642MB.
        total_memory_bytes=182631 * MIB,
        compute_capability=(10, 0),
        bf16=True,
        flash_attention=True,
        # pytorch/ao #4002: the driver reports a 7680-bit bus at 3996 MHz x 2 = 7.67 TB/s
        # (NVIDIA's HGX pages say 7.7 TB/s; the DGX B200 sheet rounds to 8 TB/s).
        memory_bandwidth_bytes_per_s=7700 * GIGA,
        # NVIDIA Blackwell datasheet, HGX B200 at 1,000 W (per-type table in
        # glennklockwood.com/garden/processors/B200): FP16/BF16 2,250 dense (4,500 sparse),
        # TF32 1,100 dense, FP32 80 TFLOPS.
        peak_fp16_flops=2250 * TERA,
        peak_bf16_flops=2250 * TERA,
        peak_fp32_flops=80 * TERA,
        pcie_bandwidth_bytes_per_s=PCIE_GEN5_X16_BYTES_PER_S,  # host CPUs of HGX B200: Gen5
        architecture="blackwell",
        peak_tf32_flops=1100 * TERA,
        sm_count=148,  # torch repr: multi_processor_count=148
        nvlink=True,  # NVLink 5, 1.8 TB/s per GPU both ways
        memory_source_quality="derived",
    ),
    GPU(
        name="rtx-pro-6000",
        display_name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
        aliases=(
            "rtx-pro-6000-blackwell", "rtx-pro-6000-blackwell-workstation-edition",
            "rtxpro6000", "pro-6000",
        ),
        # derived: torch repr (torch 2.7.1+cu128, Server Edition) total_memory=97250MB, 188
        # multiprocessors. The Workstation Edition has the same 96 GB GDDR7 (ECC) and is
        # assumed to report the same; nvidia-smi shows 97887 MiB.
        total_memory_bytes=97250 * MIB,
        compute_capability=(12, 0),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=1792 * GIGA,  # datasheet: 1,792 GB/s (28 Gbps x 512-bit)
        # Pro card: FP32 accumulate at full rate (a cuBLASLt bf16 benchmark measured 457.6
        # TFLOPS, above any half-rate figure). FP16 dense = 4,000 AI TOPS (FP4 sparse) / 8 =
        # 500; FP32 = 24064 cores x 2 x 2.617 GHz = 125.9 TFLOPS; TF32 half the FP16 rate.
        peak_fp16_flops=500 * TERA,
        peak_bf16_flops=500 * TERA,
        peak_fp32_flops=int(125.9 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN5_X16_BYTES_PER_S,  # datasheet: PCIe Gen5 x16
        architecture="blackwell",
        peak_tf32_flops=250 * TERA,
        sm_count=188,  # torch repr: multi_processor_count=188
        memory_source_quality="derived",
    ),
    GPU(
        name="rtx-5090",
        display_name="NVIDIA GeForce RTX 5090",
        aliases=("5090", "rtx5090", "geforce-rtx-5090", "rtx-5090-32gb"),
        # exact: deviceQuery (driver 12.8; NVIDIA/nccl #1637) "32120 MBytes (33680457728
        # bytes)"; Fedora, driver 570.133: 32117 MiB (33677180928 bytes); the OOM message says
        # "total capacity of 31.37 GiB". nvidia-smi shows 32607 MiB.
        total_memory_bytes=33680457728,
        compute_capability=(12, 0),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=1792 * GIGA,  # NVIDIA spec: 28 Gbps x 512-bit
        # GeForce rule, as on Ada: FP16/BF16 tensor w/ FP32 acc = 2x FP32 (FP16-acc 419
        # dense / 838 sparse); FP32 = 21760 cores x 2 x 2.407 GHz = 104.8 TFLOPS. Measured
        # bf16 and tf32 matmuls both run ~1.2x these at real boost clocks, ratio 2:1 as here.
        peak_fp16_flops=int(209.5 * TERA),
        peak_bf16_flops=int(209.5 * TERA),
        peak_fp32_flops=int(104.8 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN5_X16_BYTES_PER_S,  # PCIe 5.0 x16
        architecture="blackwell",
        peak_tf32_flops=int(104.8 * TERA),
        sm_count=170,  # deviceQuery: 170 multiprocessors
    ),
    GPU(
        name="rtx-5080",
        display_name="NVIDIA GeForce RTX 5080",
        aliases=("5080", "rtx5080", "geforce-rtx-5080", "rtx-5080-16gb"),
        # uncertain: only a Windows figure was found (torch repr total_memory=16302MB, which is
        # nvidia-smi's 16303 MiB less one). On Linux the driver keeps ~495 MiB back on 16 GB
        # Blackwell (RTX 5060 Ti: nvidia-smi 16311 MiB, CUDA 15816 MiB), so 16303 - 495.
        total_memory_bytes=15808 * MIB,
        compute_capability=(12, 0),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=960 * GIGA,  # NVIDIA spec: 30 Gbps x 256-bit
        # FP32 = 10752 cores x 2 x 2.617 GHz = 56.3 TFLOPS; tensor FP32-acc = 2x.
        peak_fp16_flops=int(112.6 * TERA),
        peak_bf16_flops=int(112.6 * TERA),
        peak_fp32_flops=int(56.3 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN5_X16_BYTES_PER_S,
        architecture="blackwell",
        peak_tf32_flops=int(56.3 * TERA),
        sm_count=84,  # torch repr: multi_processor_count=84
        memory_source_quality="uncertain",
    ),
    GPU(
        name="rtx-5070-ti",
        display_name="NVIDIA GeForce RTX 5070 Ti",
        aliases=("5070-ti", "5070ti", "rtx5070ti", "geforce-rtx-5070-ti", "rtx-5070-ti-16gb"),
        # uncertain: no CUDA figure found; nvidia-smi shows 16303 MiB (as on the RTX 5080),
        # less the ~495 MiB the driver keeps back on 16 GB Blackwell (see rtx-5080).
        total_memory_bytes=15808 * MIB,
        compute_capability=(12, 0),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=896 * GIGA,  # NVIDIA spec: 28 Gbps x 256-bit
        # FP32 = 8960 cores x 2 x 2.452 GHz = 43.9 TFLOPS; tensor FP32-acc = 2x.
        peak_fp16_flops=int(87.9 * TERA),
        peak_bf16_flops=int(87.9 * TERA),
        peak_fp32_flops=int(43.9 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN5_X16_BYTES_PER_S,
        architecture="blackwell",
        peak_tf32_flops=int(43.9 * TERA),
        sm_count=70,  # 8960 CUDA cores / 128 per SM
        memory_source_quality="uncertain",
    ),
    GPU(
        name="rtx-5070",
        display_name="NVIDIA GeForce RTX 5070",
        aliases=("5070", "rtx5070", "geforce-rtx-5070", "rtx-5070-12gb"),
        # uncertain: no CUDA figure found; nvidia-smi shows 12227 MiB, less the ~495 MiB seen
        # kept back on 16 GB Blackwell (a 12 GB card may lose less: this errs low).
        total_memory_bytes=11732 * MIB,
        compute_capability=(12, 0),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=672 * GIGA,  # NVIDIA spec: 28 Gbps x 192-bit
        # FP32 = 6144 cores x 2 x 2.512 GHz = 30.9 TFLOPS; tensor FP32-acc = 2x.
        peak_fp16_flops=int(61.7 * TERA),
        peak_bf16_flops=int(61.7 * TERA),
        peak_fp32_flops=int(30.9 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN5_X16_BYTES_PER_S,
        architecture="blackwell",
        peak_tf32_flops=int(30.9 * TERA),
        sm_count=48,  # 6144 CUDA cores / 128 per SM
        memory_source_quality="uncertain",
    ),
    GPU(
        name="rtx-5060-ti-16gb",
        display_name="NVIDIA GeForce RTX 5060 Ti",  # the 8 GB card prints the same name
        aliases=(
            "5060-ti-16gb", "5060ti-16gb", "5060-ti-16g", "5060ti-16g", "rtx-5060-ti-16g",
            "rtx5060ti-16gb",
        ),
        # derived: "15,816 MiB CUDA-visible" (llama.cpp's cudaMemGetInfo total; Linux, driver
        # 595.71, Luce-Org/lucebox #407). nvidia-smi shows 16311 MiB.
        total_memory_bytes=15816 * MIB,
        compute_capability=(12, 0),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=448 * GIGA,  # NVIDIA spec: 28 Gbps x 128-bit
        # FP32 = 4608 cores x 2 x 2.572 GHz = 23.7 TFLOPS; tensor FP32-acc = 2x.
        peak_fp16_flops=int(47.4 * TERA),
        peak_bf16_flops=int(47.4 * TERA),
        peak_fp32_flops=int(23.7 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN5_X8_BYTES_PER_S,  # the RTX 5060 Ti is PCIe 5.0 x8
        architecture="blackwell",
        peak_tf32_flops=int(23.7 * TERA),
        sm_count=36,  # 4608 CUDA cores / 128 per SM
        memory_source_quality="derived",
    ),
    GPU(
        name="rtx-5060-ti-8gb",
        display_name="NVIDIA GeForce RTX 5060 Ti",  # the 16 GB card prints the same name
        aliases=(
            "5060-ti-8gb", "5060ti-8gb", "5060-ti-8g", "5060ti-8g", "rtx-5060-ti-8g",
            "rtx5060ti-8gb",
        ),
        # uncertain: no CUDA figure found; nvidia-smi shows 8151 MiB, less the ~495 MiB kept
        # back on the 16 GB card (an 8 GB card may lose less: this errs low).
        total_memory_bytes=7656 * MIB,
        compute_capability=(12, 0),
        bf16=True,
        flash_attention=True,
        memory_bandwidth_bytes_per_s=448 * GIGA,  # same GB206 and memory bus as the 16 GB card
        peak_fp16_flops=int(47.4 * TERA),
        peak_bf16_flops=int(47.4 * TERA),
        peak_fp32_flops=int(23.7 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN5_X8_BYTES_PER_S,
        architecture="blackwell",
        peak_tf32_flops=int(23.7 * TERA),
        sm_count=36,
        memory_source_quality="uncertain",
    ),
    # ---------------------------------------------------------------- AMD CDNA 3 (gfx942, ROCm)
    GPU(
        name="mi300x",
        display_name="AMD Instinct MI300X",
        aliases=("instinct-mi300x", "amd-mi300x", "amd-instinct-mi300x"),
        # derived: torch repr on ROCm (torch 2.3 and torch 2.6 / ROCm 6.2.4, two sources;
        # ROCm/ROCm #4203) total_memory=196592MB, i.e. 192 GiB less 16 MiB.
        total_memory_bytes=196592 * MIB,
        # torch.cuda.get_device_capability() on gfx942 (torch repr: major=9, minor=4). Not an
        # NVIDIA sm: see the module doc.
        compute_capability=(9, 4),
        bf16=True,
        flash_attention=True,  # AOTriton supports gfx942 (see FLASH_ATTENTION_MIN_CC's note)
        memory_bandwidth_bytes_per_s=5300 * GIGA,  # MI300X datasheet: 5.3 TB/s HBM3
        # MI300X datasheet: FP16/BF16 matrix 1,307.4 TFLOPS dense (2,614.9 sparse), TF32
        # 653.7 dense, FP32 vector 163.4 TFLOPS.
        peak_fp16_flops=int(1307.4 * TERA),
        peak_bf16_flops=int(1307.4 * TERA),
        peak_fp32_flops=int(163.4 * TERA),
        pcie_bandwidth_bytes_per_s=PCIE_GEN5_X16_BYTES_PER_S,  # datasheet: PCIe Gen5 x16
        architecture="cdna3",
        peak_tf32_flops=int(653.7 * TERA),
        sm_count=304,  # torch repr: multi_processor_count=304 (compute units)
        nvlink=True,  # OAM boards: 7 Infinity Fabric links, 896 GB/s aggregate
        memory_source_quality="derived",
    ),
)
# fmt: on
