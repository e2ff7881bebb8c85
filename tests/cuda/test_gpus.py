"""The GPU catalog: cited figures, lookups, and the architecture rules."""

from __future__ import annotations

import pytest

from memfit.cuda.gpus import (
    BF16_MIN_CC,
    FLASH_ATTENTION_MAX_CC,
    FLASH_ATTENTION_MIN_CC,
    GPU,
    ROCM_ARCHITECTURES,
)
from memfit.cuda.target import BUDGET_MEANING, GPU_OPTION_HELP, get_gpu, list_gpus
from memfit.errors import BadInputError

MIB = 1 << 20
GIB = 1 << 30

REQUIRED_NAMES = [
    "t4",
    "v100-16gb",
    "v100-32gb",
    "a10",
    "a10g",
    "l4",
    "l40s",
    "a100-40gb",
    "a100-80gb",
    "h100-pcie",
    "h100-sxm",
    "h200",
    "rtx-2060",
    "rtx-3060",
    "rtx-3080-ti",
    "rtx-3090",
    "rtx-4060",
    "rtx-4070",
    "rtx-4080",
    "rtx-4090",
    "rtx-a6000",
    "rtx-6000-ada",
    # added with the RTX 50 series, the rented datacenter cards and the MI300X
    "rtx-a5000",
    "rtx-a4000",
    "a40",
    "a100-pcie-40gb",
    "l40",
    "rtx-4060-ti-8gb",
    "rtx-4060-ti-16gb",
    "h100-nvl",
    "gh200",
    "b200",
    "rtx-pro-6000",
    "rtx-5090",
    "rtx-5080",
    "rtx-5070-ti",
    "rtx-5070",
    "rtx-5060-ti-16gb",
    "rtx-5060-ti-8gb",
    "mi300x",
]

#: Every "exact" entry's byte figure, as the deviceQuery / torch print its comment cites.
EXACT_BYTES = {
    "t4": 15843721216,  # deviceQuery "15110 MBytes (15843721216 bytes)"
    "rtx-2060": 6204162048,  # deviceQuery (Linux) "5917 MBytes (6204162048 bytes)"
    "v100-16gb": 16928342016,  # deviceQuery "16144 MBytes (16928342016 bytes)" = OOM 15.77 GiB
    "v100-32gb": 34072559616,  # deviceQuery "32494 MBytes (34072559616 bytes)"
    "a10": 23696375808,  # deviceQuery (driver 12.8) "22599 MBytes (23696375808 bytes)"
    "a100-40gb": 42505273344,  # 40536 MiB, = matrixMulDrv's byte figure and OOM 39.59 GiB
    "a100-80gb": 84987740160,  # deviceQuery "81051 MBytes (84987740160 bytes)" = OOM 79.15 GiB
    "a100-pcie-80gb": 84974239744,  # deviceQuery "81038 MBytes (84974239744 bytes)"
    "a100-pcie-40gb": 42298834944,  # deviceQuery (driver 12.2) "40339 MBytes (42298834944 bytes)"
    "a40": 47608692736,  # deviceQuery (driver 12.4) "45403 MBytes (47608692736 bytes)"
    "rtx-3060": 12629508096,  # deviceQuery "12044 MBytes (12629508096 bytes)"
    "rtx-3080-ti": 12630491136,  # deviceQuery "12045 MBytes (12630491136 bytes)"
    "rtx-3090": 25414860800,  # deviceQuery "24238 MBytes (25414860800 bytes)"
    "rtx-a6000": 51160023040,  # deviceQuery "48790 MBytes (51160023040 bytes)"
    "rtx-a5000": 25402343424,  # device_info "24226 MBytes (25402343424 bytes)"
    "l4": 23612293120,  # deviceQuery "22518 MBytes (23612293120 bytes)"
    "l40s": 47576711168,  # cuda-device-query "45373 MBytes (47576711168 bytes)"
    "rtx-4060-ti-16gb": 16722821120,  # deviceQuery (Linux) "15948 MBytes (16722821120 bytes)"
    "rtx-6000-ada": 50865307648,  # unsloth-zoo PR #1053: "exactly 50,865,307,648 bytes"
    "h100-sxm": 85028896768,  # deviceQuery (driver 12.8) "81090 MBytes (85028896768 bytes)"
    "gh200": 101468602368,  # deviceQuery (driver 12.9) "96768 MBytes (101468602368 bytes)"
    "rtx-5090": 33680457728,  # deviceQuery (driver 12.8) "32120 MBytes (33680457728 bytes)"
}

#: MiB- or GiB-derived entries: the MiB figure their comment cites.
DERIVED_MIB = {
    "a10g": 22587,  # torch repr total_memory=22587MB
    "rtx-a4000": 15985,  # OOM 15.61 GiB
    "l40": 45466,  # OOM 44.40 GiB
    "rtx-4080": 16049,  # torch repr
    "rtx-4090": 24207,  # trtexec 24207 MiB
    "h100-pcie": 81008,  # torch repr
    "h200": 143156,  # torch repr
    "h100-nvl": 95232,  # OOM 93.00 GiB
    "b200": 182631,  # torch repr total_memory=182631MB = 178.35 GiB (pytorch/ao #4002)
    "rtx-pro-6000": 97250,  # torch repr
    "rtx-5060-ti-16gb": 15816,  # llama.cpp "15,816 MiB CUDA-visible"
    "mi300x": 196592,  # torch repr on ROCm
}


@pytest.mark.parametrize("name", REQUIRED_NAMES)
def test_every_required_name_exists(name: str) -> None:
    gpu = get_gpu(name)
    assert gpu.name == name
    assert isinstance(gpu, GPU)


def test_names_are_unique_and_canonical() -> None:
    names = [g.name for g in list_gpus()]
    assert len(names) == len(set(names))
    assert all(n == n.lower() and " " not in n for n in names)
    assert len(names) >= len(REQUIRED_NAMES)


@pytest.mark.parametrize(("name", "expected"), sorted(EXACT_BYTES.items()))
def test_total_memory_is_the_cited_figure(name: str, expected: int) -> None:
    assert get_gpu(name).total_memory_bytes == expected
    assert get_gpu(name).memory_source_quality == "exact"


@pytest.mark.parametrize(("name", "mib"), sorted(DERIVED_MIB.items()))
def test_derived_memory_is_the_cited_mib_figure(name: str, mib: int) -> None:
    assert get_gpu(name).total_memory_bytes == mib * MIB
    assert get_gpu(name).memory_source_quality == "derived"


def test_every_exact_entry_has_its_byte_figure_asserted() -> None:
    exact = {g.name for g in list_gpus() if g.memory_source_quality == "exact"}
    assert exact == set(EXACT_BYTES)
    derived = {g.name for g in list_gpus() if g.memory_source_quality == "derived"}
    assert derived == set(DERIVED_MIB)


def test_total_memory_is_below_marketing_size_and_sane() -> None:
    # torch's total_memory is always below the nameplate GB and above 90% of it
    nameplate_gb = {
        "t4": 16,
        "v100-16gb": 16,
        "v100-32gb": 32,
        "a10": 24,
        "a10g": 24,
        "l4": 24,
        "l40s": 48,
        "a100-40gb": 40,
        "a100-80gb": 80,
        "a100-pcie-80gb": 80,
        "h100-pcie": 80,
        "h100-sxm": 80,
        "h200": 141,
        "rtx-2060": 6,
        "rtx-3060": 12,
        "rtx-3080-ti": 12,
        "rtx-3090": 24,
        "rtx-4060": 8,
        "rtx-4070": 12,
        "rtx-4080": 16,
        "rtx-4090": 24,
        "rtx-a6000": 48,
        "rtx-6000-ada": 48,
        "rtx-a5000": 24,
        "rtx-a4000": 16,
        "a40": 48,
        "a100-pcie-40gb": 40,
        "l40": 48,
        "rtx-4060-ti-8gb": 8,
        "rtx-4060-ti-16gb": 16,
        "h100-nvl": 94,
        "gh200": 96,
        "b200": 180,
        "rtx-pro-6000": 96,
        "rtx-5090": 32,
        "rtx-5080": 16,
        "rtx-5070-ti": 16,
        "rtx-5070": 12,
        "rtx-5060-ti-16gb": 16,
        "rtx-5060-ti-8gb": 8,
        "mi300x": 192,
    }
    assert set(nameplate_gb) == {g.name for g in list_gpus()}
    for name, gb in nameplate_gb.items():
        total = get_gpu(name).total_memory_bytes
        # nameplate sizes are GiB-sized for GDDR/HBM parts except H200's 141 GB
        assert total < gb * (1 << 30), name
        assert total > 0.9 * gb * 10**9, name


@pytest.mark.parametrize(
    ("alias", "expected"),
    [
        ("4090", "rtx-4090"),
        ("rtx4090", "rtx-4090"),
        ("RTX 4090", "rtx-4090"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("a100", "a100-80gb"),
        ("A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("h100", "h100-sxm"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("H100 PCIe", "h100-pcie"),
        ("v100", "v100-16gb"),
        ("Tesla T4", "t4"),
        ("T4", "t4"),
        ("3080ti", "rtx-3080-ti"),
        ("rtx 3080 ti", "rtx-3080-ti"),
        ("A6000", "rtx-a6000"),
        ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"),
        ("  L40S ", "l40s"),
        ("NVIDIA A10G", "a10g"),
        ("a10", "a10"),
        # a size in a card's name is part of the name, not a budget
        ("rtx-3060-12gb", "rtx-3060"),
        ("3060 12GB", "rtx-3060"),
        ("rtx-4060-ti-16gb", "rtx-4060-ti-16gb"),
        ("RTX 4060 Ti 16GB", "rtx-4060-ti-16gb"),
        ("4060ti-16gb", "rtx-4060-ti-16gb"),
        ("4060 Ti 16G", "rtx-4060-ti-16gb"),
        ("4060ti 8GB", "rtx-4060-ti-8gb"),
        ("rtx-4060-ti-8gb", "rtx-4060-ti-8gb"),
        ("RTX 5090", "rtx-5090"),
        ("5090", "rtx-5090"),
        ("NVIDIA GeForce RTX 5090", "rtx-5090"),
        ("rtx5080", "rtx-5080"),
        ("NVIDIA GeForce RTX 5080", "rtx-5080"),
        ("5070 Ti", "rtx-5070-ti"),
        ("5070ti", "rtx-5070-ti"),
        ("RTX 5070", "rtx-5070"),
        ("5060 Ti 16GB", "rtx-5060-ti-16gb"),
        ("rtx-5060-ti-8gb", "rtx-5060-ti-8gb"),
        ("B200", "b200"),
        ("NVIDIA B200", "b200"),
        ("HGX B200", "b200"),
        ("MI300X", "mi300x"),
        ("AMD Instinct MI300X", "mi300x"),
        ("a40", "a40"),
        ("NVIDIA A40", "a40"),
        ("l40", "l40"),
        ("L40S", "l40s"),
        ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
        ("A5000", "rtx-a5000"),
        ("NVIDIA RTX A4000", "rtx-a4000"),
        ("H100 NVL", "h100-nvl"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("GH200", "gh200"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000"),
        ("RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000"),
    ],
)
def test_aliases_resolve(alias: str, expected: str) -> None:
    assert get_gpu(alias).name == expected


@pytest.mark.parametrize(
    ("name", "variants"),
    [
        ("4060 ti", ("rtx-4060-ti-16gb", "rtx-4060-ti-8gb")),
        ("4060ti", ("rtx-4060-ti-16gb", "rtx-4060-ti-8gb")),
        ("rtx-4060-ti", ("rtx-4060-ti-16gb", "rtx-4060-ti-8gb")),
        ("NVIDIA GeForce RTX 4060 Ti", ("rtx-4060-ti-16gb", "rtx-4060-ti-8gb")),
        ("RTX 5060 Ti", ("rtx-5060-ti-16gb", "rtx-5060-ti-8gb")),
    ],
)
def test_a_name_shared_by_memory_variants_lists_them(name: str, variants: tuple[str, ...]) -> None:
    with pytest.raises(BadInputError, match="ambiguous") as info:
        get_gpu(name)
    message = str(info.value)
    assert repr(name) in message
    for variant in variants:
        assert variant in message
        assert f"{get_gpu(variant).total_memory_gib:.2f} GiB" in message


def test_unknown_name_raises_with_suggestion() -> None:
    with pytest.raises(BadInputError) as info:
        get_gpu("a100-90gb")
    message = str(info.value)
    assert "'a100-90gb'" in message
    assert "a100-80gb" in message
    assert "Did you mean" in message


def test_unknown_name_quotes_input_even_without_close_match() -> None:
    with pytest.raises(BadInputError, match="'tpu-v5'"):
        get_gpu("tpu-v5")


def test_empty_name_raises() -> None:
    with pytest.raises(BadInputError):
        get_gpu("  ")


def test_bad_input_error_is_value_error() -> None:
    with pytest.raises(ValueError):
        get_gpu("rtx-9090")


def test_a_bare_number_is_not_a_budget() -> None:
    with pytest.raises(BadInputError, match=r"needs a unit: 12GiB \(binary\) or 12GB \(decimal\)"):
        get_gpu("12")


@pytest.mark.parametrize("gpu", list_gpus(), ids=lambda g: g.name)
def test_flash_and_bf16_follow_the_arch_rules(gpu: GPU) -> None:
    cc = gpu.compute_capability
    if gpu.rocm:
        # AOTriton's gfx targets decide flash on ROCm (gfx942 = (9, 4) is one); CDNA3 has bf16
        assert gpu.architecture == "cdna3" and cc == (9, 4)
        assert gpu.flash_attention and gpu.bf16
    else:
        assert gpu.flash_attention == (FLASH_ATTENTION_MIN_CC <= cc <= FLASH_ATTENTION_MAX_CC)
        assert gpu.bf16 == (cc >= BF16_MIN_CC)
        assert gpu.flash_attention == (cc >= (8, 0))  # every catalog card is <= sm121
    if not gpu.bf16:
        assert gpu.peak_bf16_flops == 0
        assert gpu.peak_tf32_flops == 0
    else:
        assert gpu.peak_bf16_flops > 0


@pytest.mark.parametrize("name", ["t4", "v100-16gb", "v100-32gb", "rtx-2060"])
def test_pre_ampere_has_no_bf16_and_no_flash(name: str) -> None:
    gpu = get_gpu(name)
    assert gpu.bf16 is False
    assert gpu.flash_attention is False
    assert gpu.peak_bf16_flops == 0


@pytest.mark.parametrize("name", ["a10", "a100-80gb", "rtx-3090", "l4", "rtx-4090", "h100-sxm"])
def test_sm80_plus_has_flash_and_bf16(name: str) -> None:
    gpu = get_gpu(name)
    assert gpu.flash_attention is True
    assert gpu.bf16 is True


@pytest.mark.parametrize("gpu", list_gpus(), ids=lambda g: g.name)
def test_fields_are_consistent(gpu: GPU) -> None:
    arch_by_major = {
        7: {"volta", "turing"},
        8: {"ampere", "ada"},
        9: {"hopper", "cdna3"},
        10: {"blackwell"},
        12: {"blackwell"},
    }
    assert gpu.architecture in arch_by_major[gpu.compute_capability[0]]
    assert (gpu.architecture == "turing") == (gpu.compute_capability == (7, 5))
    assert (gpu.architecture == "ada") == (gpu.compute_capability == (8, 9))
    assert (gpu.architecture == "hopper") == (gpu.compute_capability == (9, 0))
    assert gpu.rocm == (gpu.architecture in ROCM_ARCHITECTURES)
    assert gpu.peak_fp16_flops > gpu.peak_fp32_flops > 0
    assert gpu.peak_tf32_flops <= gpu.peak_bf16_flops
    assert 100 * 10**9 < gpu.memory_bandwidth_bytes_per_s < 10 * 10**12
    if gpu.name == "gh200":  # NVLink-C2C to the Grace CPU: 450 GB/s each way
        assert gpu.pcie_bandwidth_bytes_per_s == 450 * 10**9
    else:
        assert 10 * 10**9 < gpu.pcie_bandwidth_bytes_per_s < 70 * 10**9
    assert gpu.sm_count > 0
    assert gpu.memory_source_quality in {"exact", "derived", "uncertain"}
    assert all(a == a.lower() for a in gpu.aliases)


@pytest.mark.parametrize(
    "gpu", [g for g in list_gpus() if "GeForce" in g.display_name], ids=lambda g: g.name
)
def test_geforce_tensor_rates_follow_the_half_rate_rule(gpu: GPU) -> None:
    # GeForce FP16/BF16 tensor math with FP32 accumulate runs at 2x the FP32 rate (Turing:
    # 4x); the pro and datacenter cards are not bound by it.
    factor = 4 if gpu.architecture == "turing" else 2
    assert gpu.peak_fp16_flops == pytest.approx(factor * gpu.peak_fp32_flops, rel=0.01)
    if gpu.bf16:
        assert gpu.peak_tf32_flops == pytest.approx(gpu.peak_fp32_flops, rel=0.01)


def test_rocm_cards() -> None:
    mi300x = get_gpu("mi300x")
    assert mi300x.rocm and not get_gpu("h100-sxm").rocm
    assert mi300x.compute_capability == (9, 4)  # torch's reading of gfx942
    assert mi300x.sm_count == 304  # compute units
    assert mi300x.total_memory_bytes == 192 * GIB - 16 * MIB


def test_hopper_numbers() -> None:
    h100 = get_gpu("h100-sxm")
    assert h100.peak_bf16_flops == int(989.4 * 10**12)
    assert h100.memory_bandwidth_bytes_per_s == 3350 * 10**9
    assert h100.pcie_bandwidth_bytes_per_s > get_gpu("a100-80gb").pcie_bandwidth_bytes_per_s
    assert get_gpu("h200").peak_bf16_flops == h100.peak_bf16_flops
    assert get_gpu("h200").total_memory_bytes > 139 * (1 << 30)


def test_list_gpus_returns_a_copy() -> None:
    gpus = list_gpus()
    gpus.clear()
    assert list_gpus()


def test_budget_limits_a_card():
    from memfit.cuda.target import get_gpu

    g = get_gpu("rtx-4090@12GiB")
    assert g.total_memory_bytes == 12 * 2**30
    assert g.compute_capability == get_gpu("rtx-4090").compute_capability
    assert get_gpu("16GB").total_memory_bytes == 16 * 10**9  # decimal GB, A100 kernels
    assert get_gpu(g.name) == g  # the name round-trips (the planner passes names around)


def test_gb_and_gib_budgets_are_never_confused():
    decimal = get_gpu("rtx-4060-ti-16gb@12GB")
    binary = get_gpu("rtx-4060-ti-16gb@12GiB")
    assert decimal.total_memory_bytes == 12 * 10**9
    assert binary.total_memory_bytes == 12 * 2**30
    assert get_gpu("12 GB").total_memory_bytes == 12 * 10**9
    # the 16 GB card less its driver reserve holds 16 GB but not 16 GiB
    assert get_gpu("rtx-4060-ti-16gb@16GB").total_memory_bytes == 16 * 10**9
    with pytest.raises(BadInputError, match=r"16\.00 GiB = 17\.18 GB") as info:
        get_gpu("rtx-4060-ti-16gb@16GiB")
    assert "nvidia-smi" in str(info.value)
    assert BUDGET_MEANING in str(info.value)


def test_the_meaning_of_a_budget_is_written_down():
    assert "nvidia-smi" in BUDGET_MEANING and "CUDA context" in BUDGET_MEANING
    assert "10^9" in BUDGET_MEANING and "2^30" in BUDGET_MEANING
    assert BUDGET_MEANING in GPU_OPTION_HELP and "NAME@SIZE" in GPU_OPTION_HELP
    doc = get_gpu.__doc__ or ""
    assert "nvidia-smi" in doc and "12GB" in doc and "12GiB" in doc


def test_budget_smaller_than_the_cuda_context_is_named_as_such():
    import pytest

    from memfit.cuda.overhead import device_overhead
    from memfit.cuda.target import get_gpu
    from memfit.errors import BadInputError

    outside = device_overhead(get_gpu("t4")).outside_allocator_bytes()
    with pytest.raises(BadInputError, match=r"smaller than the memory CUDA itself takes") as e:
        get_gpu(f"t4@{outside}")  # exactly the context: nothing left for tensors
    assert f"{outside / 2**30:.2f} GiB" in str(e.value)
    assert get_gpu(f"t4@{outside + 1}").total_memory_bytes == outside + 1
    with pytest.raises(BadInputError, match="more than Tesla T4 has"):
        get_gpu("t4@40GiB")
    with pytest.raises(BadInputError, match="Cannot read the size '12 parsecs'"):
        get_gpu("t4@12 parsecs")


def test_budget_in_the_cli_exit_codes():
    from typer.testing import CliRunner

    from memfit.cli.app import app

    res = CliRunner().invoke(app, ["estimate", "gpt2", "--seq", "64", "--gpu", "t4@100MiB"])
    assert res.exit_code == 2 and "smaller than the memory CUDA itself takes" in res.output
