"""Each OptimizerSpec row's state bytes equal the real optimizer's state on CPU, and the layout
the trace runs keeps the same state."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from memfit.errors import BadInputError
from memfit.optimizers import (
    OPTIMIZERS,
    SPECS,
    StateLayout,
    build,
    hf_optim_of,
    host_state_keys,
    name_of_instance,
    spec_of,
    spec_of_hf_optim,
)

#: Shapes that take every branch: under bitsandbytes' and torchao's 4096-element floor, a size
#: neither block divides, one both divide, 3-D (Adafactor's factored rows), and over the
#: 1e5-element paging floor.
SHAPES = [(10,), (300, 100), (64, 64), (3, 40, 50), (512, 256)]


def _params(dtype: torch.dtype = torch.float32) -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    out = []
    for shape in SHAPES:
        p = torch.nn.Parameter(torch.randn(shape, dtype=dtype))
        p.grad = torch.randn_like(p)
        out.append(p)
    return out


def _inner(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors behind `t` (torchao's state subclasses hold codes, scale, qmap)."""
    flatten = getattr(type(t), "__tensor_flatten__", None)
    if flatten is None or type(t) is torch.Tensor or isinstance(t, torch.nn.Parameter):
        return [t]
    names, _ = t.__tensor_flatten__()
    return [x for n in names for x in _inner(getattr(t, n))]


def _state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's device state: host entries left out, shared tensors once."""
    host = host_state_keys(opt)
    seen: dict[int, int] = {}
    for state in opt.state.values():
        for key, v in state.items():
            if key in host or not isinstance(v, torch.Tensor):
                continue
            for t in _inner(v):
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _expected(name: str, params: list[torch.nn.Parameter]) -> int:
    spec = SPECS[name]
    shapes = [tuple(p.shape) for p in params]
    dtype = params[0].dtype
    return sum(spec.state_bytes(s, dtype) for s in shapes) + spec.shared_bytes(shapes, dtype)


def _torchao_state(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> None:
    # torchao's step compiles its update; its state is made first, as adam.py `step` makes it.
    for p in params:
        opt.state[p]["step"] = torch.tensor(0.0)
        opt.state[p]["exp_avg"] = opt._new_buffer(p, True)
        opt.state[p]["exp_avg_sq"] = opt._new_buffer(p, False)


def _real(name: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    library = SPECS[name].library
    if library is not None and importlib.util.find_spec(library) is None:
        pytest.skip(f"{library} is not installed")
    opt = build(name, params, lr=1e-3, weight_decay=0.0, for_trace=False)
    if library == "torchao":
        _torchao_state(opt, params)
    else:
        if hasattr(opt, "train"):  # schedule-free optimizers step only in train mode
            opt.train()
        opt.step()
    return opt


#: Rows whose real optimizer cannot run on a CPU: paged states are cudaMallocManaged memory
#: (bitsandbytes functional.get_paged). Their bytes equal the unpaged row's, checked below.
CUDA_ONLY = {name for name, spec in SPECS.items() if spec.paged}


@pytest.mark.parametrize("name", [n for n in SPECS if n not in CUDA_ONLY])
def test_state_bytes_equal_the_real_optimizers(name: str) -> None:
    params = _params()
    assert _state_bytes(_real(name, params)) == _expected(name, params)


@pytest.mark.parametrize("name", ["adamw", "adafactor", "rmsprop", "adagrad", "sgd-momentum"])
def test_torch_state_follows_16_bit_weights(name: str) -> None:
    params = _params(torch.bfloat16)
    assert _state_bytes(_real(name, params)) == _expected(name, params)


@pytest.mark.parametrize("name", list(SPECS))
def test_the_trace_keeps_the_same_state(name: str) -> None:
    params = _params()
    opt = build(name, params, lr=1e-3, weight_decay=0.0, for_trace=True)
    opt.step()
    assert _state_bytes(opt) == _expected(name, params)


def test_paged_rows_keep_the_unpaged_bytes_and_page_the_large_states() -> None:
    pairs = [("paged-adamw", "adamw"), ("paged-adamw-8bit", "adamw-8bit"),
             ("paged-lion", "lion-32bit"), ("paged-lion-8bit", "lion-8bit"),
             ("paged-ademamix", "ademamix"), ("paged-ademamix-8bit", "ademamix-8bit")]  # fmt: skip
    assert {p for p, _ in pairs} == CUDA_ONLY
    for paged, plain in pairs:
        for shape in SHAPES:
            assert SPECS[paged].state_bytes(shape, torch.float32) == SPECS[plain].state_bytes(
                shape, torch.float32
            )
    params = _params()
    opt = build("paged-adamw", params, lr=1e-3, weight_decay=0.0, for_trace=True)
    opt.step()
    assert isinstance(opt, StateLayout)
    paged = [opt.is_paged(opt.state[p]["state1"]) for p in params]
    assert paged == [False, False, False, False, True]  # only 512 x 256 >= 1e5 elements
    # bitsandbytes decides by the parameter's size and pages the moments only: absmax stays.
    opt = build("paged-adamw-8bit", params, lr=1e-3, weight_decay=0.0, for_trace=True)
    opt.step()
    big = opt.state[params[-1]]
    assert opt.is_paged(big["state1"]) and not opt.is_paged(big["absmax1"])
    small = torch.nn.Parameter(torch.zeros(300, 200))  # 60,000 elements: (2, 300, 200) state1
    small.grad = torch.zeros_like(small)
    opt = build("paged-ademamix", [small], lr=1e-3, weight_decay=0.0, for_trace=True)
    opt.step()
    assert not opt.is_paged(opt.state[small]["state1"])


def test_hand_counted_bytes() -> None:
    # 300 x 100 = 30,000 elements: 118 blocks of 256.
    n, blocks = 30_000, 118
    assert spec_of("adamw-8bit").state_bytes((300, 100), torch.float32) == 2 * n + 2 * 4 * blocks
    assert spec_of("ademamix-8bit").state_bytes((300, 100), torch.float32) == 3 * n + 3 * 4 * blocks
    assert spec_of("ademamix").state_bytes((300, 100), torch.bfloat16) == 3 * 4 * n
    # torchao: 64 x 64 = 4096 elements, 16 blocks of 256 (8-bit) or 32 of 128 (4-bit); each
    # moment has its own map of 256 / 16 fp32 entries.
    assert spec_of("torchao-adamw-8bit").state_bytes((64, 64), torch.float32) == 2 * (
        4096 + 16 * 4 + 256 * 4
    )
    assert spec_of("torchao-adamw-4bit").state_bytes((64, 64), torch.float32) == 2 * (
        2048 + 32 * 4 + 16 * 4
    )
    # 300 x 100 is not a multiple of torchao's block: plain zeros_like(p).
    assert spec_of("torchao-adamw-8bit").state_bytes((300, 100), torch.bfloat16) == 2 * 2 * n
    assert spec_of("adafactor").state_bytes((3, 40, 50), torch.float32) == 4 * (120 + 150)
    assert spec_of("adamw-fused").state_bytes((10,), torch.float32) == 4 + 2 * 40
    assert spec_of("adamw-8bit").shared_bytes([(300, 100)], torch.float32) == 2 * 256 * 4


def test_names_hf_and_instances_round_trip() -> None:
    assert OPTIMIZERS[-1] == "none" and set(OPTIMIZERS[:-1]) == set(SPECS)
    for name, spec in SPECS.items():
        for optim in spec.hf_optim:
            built = spec_of_hf_optim(optim)
            assert built is not None
            if spec.hf_optim_args is None and optim == spec.hf_optim[0]:
                # Adam is written back as adamw_torch (weight decay 0): the same state.
                assert built.name == name or built.rule in ("adamw",), (name, optim)
        if spec.hf_optim:
            assert hf_optim_of(name)[0] == spec.hf_optim[0]
    params = _params()
    for name, spec in SPECS.items():
        if name in CUDA_ONLY or (
            spec.library is not None and importlib.util.find_spec(spec.library) is None
        ):
            continue
        assert name_of_instance(
            build(name, params, lr=1e-3, weight_decay=0.0, for_trace=False)
        ) == (name)


def test_unknown_names_and_settings_are_refused_by_name() -> None:
    with pytest.raises(BadInputError, match=r"'adamx'.*adamw"):
        spec_of("adamx")
    params = _params()
    with pytest.raises(BadInputError, match="RMSprop"):
        name_of_instance(torch.optim.RMSprop(params, centered=True))
    assert math.isfinite(1.0)
