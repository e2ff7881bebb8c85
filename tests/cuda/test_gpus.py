"""The GPU catalog: cited figures, lookups, and the architecture rules."""

from __future__ import annotations

import pytest

from memfit.cuda.gpus import BF16_MIN_CC, FLASH_ATTENTION_MAX_CC, FLASH_ATTENTION_MIN_CC, GPU
from memfit.cuda.target import get_gpu, list_gpus
from memfit.errors import BadInputError

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
]


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


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # deviceQuery "81051 MBytes (84987740160 bytes)" (driver 12.2) = OOM "79.15 GiB"
        ("a100-80gb", 84987740160),
        # deviceQuery "15110 MBytes (15843721216 bytes)"
        ("t4", 15843721216),
        # deviceQuery "16144 MBytes (16928342016 bytes)" = OOM "15.77 GiB"
        ("v100-16gb", 16928342016),
        # deviceQuery "81090 MBytes (85028896768 bytes)" (driver 12.8)
        ("h100-sxm", 85028896768),
        # unsloth-zoo PR #1053: "exactly 50,865,307,648 bytes"
        ("rtx-6000-ada", 50865307648),
        # torch repr total_memory=143156MB, MiB-derived
        ("h200", 143156 * (1 << 20)),
        # deviceQuery "24238 MBytes (25414860800 bytes)"
        ("rtx-3090", 25414860800),
    ],
)
def test_total_memory_is_the_cited_figure(name: str, expected: int) -> None:
    assert get_gpu(name).total_memory_bytes == expected


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
    }
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
    ],
)
def test_aliases_resolve(alias: str, expected: str) -> None:
    assert get_gpu(alias).name == expected


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
        get_gpu("rtx-5090")


@pytest.mark.parametrize("gpu", list_gpus(), ids=lambda g: g.name)
def test_flash_and_bf16_follow_the_arch_rules(gpu: GPU) -> None:
    cc = gpu.compute_capability
    assert gpu.flash_attention == (FLASH_ATTENTION_MIN_CC <= cc <= FLASH_ATTENTION_MAX_CC)
    assert gpu.bf16 == (cc >= BF16_MIN_CC)
    assert gpu.flash_attention == (cc >= (8, 0))  # every catalog card is <= sm90
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
    arch_by_major = {7: {"volta", "turing"}, 8: {"ampere", "ada"}, 9: {"hopper"}}
    assert gpu.architecture in arch_by_major[gpu.compute_capability[0]]
    assert (gpu.architecture == "turing") == (gpu.compute_capability == (7, 5))
    assert (gpu.architecture == "ada") == (gpu.compute_capability == (8, 9))
    assert gpu.peak_fp16_flops > gpu.peak_fp32_flops > 0
    assert 100 * 10**9 < gpu.memory_bandwidth_bytes_per_s < 10 * 10**12
    assert 10 * 10**9 < gpu.pcie_bandwidth_bytes_per_s < 70 * 10**9
    assert gpu.sm_count > 0
    assert gpu.memory_source_quality in {"exact", "derived", "uncertain"}
    assert all(a == a.lower() for a in gpu.aliases)


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
