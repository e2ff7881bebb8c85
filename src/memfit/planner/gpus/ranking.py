"""`choose_gpu`: which GPU of the catalog (and how many) fits a job, the fastest plan on each,
its predicted throughput, and its cost from the user's own price list (`memfit gpus --for`).

Every catalog GPU is planned with `memfit.plan` for the same model and goal, at each GPU count
asked for. Traces are shared between GPUs whose compute capabilities pick the same attention
kernels (a trace depends on the GPU only through that choice: memfit.estimator.trace.attention.
attention_class), so the catalog's 40 cards and 9 capabilities cost the traces of 3 classes
(before 8.0, sm86/sm89, the other 8.0 and later). AMD cards (PyTorch's ROCm build) are
skipped with a note: memfit models CUDA's context and library workspaces, not ROCm's
(memfit.cuda.overhead refuses them).

Prices are never built in: `prices` is a CSV of `gpu,usd_per_hour` (a GPU name as `memfit
gpus` lists it, or an alias; the price of one GPU for one hour), read by `read_prices`. The cost
of a million tokens is `n_gpus * price / 3600 / tokens_per_second * 1e6`.

Example:
    >>> from memfit.planner.gpus.ranking import choose_gpu
    >>> for c in choose_gpu("gpt2", memfit.Goal(global_batch=8, seq_len=512)):
    ...     print(c.gpu.name, c.fits, c.tokens_per_second)
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memfit.cuda.allocator_replay import shared_runs
from memfit.cuda.gpus import GPU
from memfit.cuda.target import get_gpu, list_gpus
from memfit.errors import BadInputError
from memfit.planner.search import Goal, Plan, plan

#: Seconds in an hour (prices are per GPU-hour).
_HOUR = 3600


@dataclass(frozen=True, kw_only=True)
class GpuChoice:
    """One GPU (at one count) for the job.

    Attributes:
        gpu: the catalog entry.
        n_gpus: GPUs of that kind (data parallel, FSDP2 above 1).
        fits: whether a plan fits; None when the GPU was not planned (`note` says why).
        plan: the plan (its `best` is the fastest fitting configuration), or None.
        tokens_per_second: predicted throughput of the best plan, all GPUs together.
        usd_per_hour: the price of the `n_gpus` GPUs for an hour, when prices are given.
        usd_per_million_tokens: what a million tokens cost at that throughput and price.
        note: why the GPU was not planned (ROCm, a goal it cannot split), else "".
    """

    gpu: GPU
    n_gpus: int
    fits: bool | None
    plan: Plan | None
    tokens_per_second: float | None = None
    usd_per_hour: float | None = None
    usd_per_million_tokens: float | None = None
    note: str = ""


def choose_gpu(
    model: Any,
    goal: Goal,
    *,
    allow: tuple[str, ...] = (),
    forbid: tuple[str, ...] = (),
    n_gpus: int | Sequence[int] = 1,
    prices: str | Path | dict[str, float] | None = None,
    task: str | None = None,
    among: Sequence[str] | None = None,
) -> list[GpuChoice]:
    """Plan `model` for `goal` on every catalog GPU, at each count in `n_gpus`.

    Sorted: fitting choices first, fastest (tokens per second) first; then the GPUs where
    nothing fits, most memory first; then those not planned. `prices` is a CSV path (see
    `read_prices`) or a dict of GPU name to USD per GPU-hour. `among` limits the GPUs to
    those named (default: the whole catalog).
    """
    counts = _counts(n_gpus)
    price = read_prices(prices) if isinstance(prices, (str, Path)) else _checked(prices)
    gpus = list_gpus() if among is None else [get_gpu(name) for name in among]
    out: list[GpuChoice] = []
    # GPUs whose kernels trace alike share traces, and their allocators replay the same
    # streams (memfit.cuda.allocator_replay.shared_runs).
    with shared_runs():
        for n in counts:
            cache: dict[Any, Any] = {}  # traces by compute capability, for this GPU count
            for gpu in gpus:
                if gpu.rocm:
                    note = "ROCm: memfit models CUDA's context and workspaces, not ROCm's"
                    out.append(GpuChoice(gpu=gpu, n_gpus=n, fits=None, plan=None, note=note))
                    continue
                p = plan(model, gpu=gpu.name, goal=goal, n_gpus=n, allow=allow,
                         forbid=forbid, task=task, trace_cache=cache)  # fmt: skip
                out.append(_choice(gpu, n, p, price))
    return sorted(out, key=_order)


def _choice(gpu: GPU, n: int, p: Plan, price: dict[str, float] | None) -> GpuChoice:
    if p.best is None:
        return GpuChoice(gpu=gpu, n_gpus=n, fits=False, plan=p)
    tps = p.best.cost.tokens_per_second
    hourly = per_million = None
    if price is not None and gpu.name in price:
        hourly = n * price[gpu.name]
        per_million = hourly / _HOUR / tps * 1e6
    return GpuChoice(gpu=gpu, n_gpus=n, fits=True, plan=p, tokens_per_second=tps,
                     usd_per_hour=hourly, usd_per_million_tokens=per_million)  # fmt: skip


def _order(c: GpuChoice) -> tuple[int, float, str, int]:
    if c.fits:
        return (0, -(c.tokens_per_second or 0.0), c.gpu.name, c.n_gpus)
    if c.fits is False:
        return (1, -float(c.gpu.total_memory_bytes * c.n_gpus), c.gpu.name, c.n_gpus)
    return (2, 0.0, c.gpu.name, c.n_gpus)


def _counts(n_gpus: int | Sequence[int]) -> list[int]:
    values = [n_gpus] if isinstance(n_gpus, int) else list(n_gpus)
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
        raise BadInputError(
            f"n_gpus must be a positive integer or a list of them, got {n_gpus!r}. Pass e.g. "
            "n_gpus=(1, 2, 4)."
        )
    return sorted(set(values))


def read_prices(path: str | Path) -> dict[str, float]:
    """GPU name -> USD per GPU-hour, from a CSV of `gpu,usd_per_hour` rows.

    A header row (a first row whose name is no GPU and whose price is not a number) and rows
    starting with `#` are skipped. A GPU name may be any name `memfit gpus` accepts (an alias
    such as "4090"); it is stored under the catalog's name. An unknown name (the error names
    the closest), a budget ("rtx-4090@12GiB"), a price that is not a non-negative number, a
    row without two fields and a GPU priced twice are errors naming the file and line.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise BadInputError(f"Cannot read the price list {str(p)!r}: {e.strerror}.") from None
    out: dict[str, float] = {}
    for i, row in enumerate(csv.reader(text.splitlines()), start=1):
        if not row or not "".join(row).strip() or row[0].strip().startswith("#"):
            continue
        where = f"{p.name}, line {i}"
        if len(row) != 2:
            raise BadInputError(
                f"{where}: expected two fields, gpu,usd_per_hour (e.g. 'h100-sxm,2.49'), got "
                f"{','.join(row)!r}."
            )
        name, value = row[0].strip(), row[1].strip()
        try:
            price = float(value)
        except ValueError:
            if not out and i == _first_row(text) and not _is_gpu(name):
                continue  # a header
            raise BadInputError(
                f"{where}: the price of {name!r} is {value!r}, not a number. Give USD per "
                "GPU-hour, e.g. 2.49."
            ) from None
        if not math.isfinite(price) or price < 0:
            raise BadInputError(
                f"{where}: the price of {name!r} is {value}; give a non-negative USD per GPU-hour."
            )
        gpu = _priced_gpu(name, where)
        if gpu.name in out:
            raise BadInputError(f"{where}: {gpu.name} is priced twice; keep one row.")
        out[gpu.name] = price
    if not out:
        raise BadInputError(
            f"The price list {str(p)!r} has no prices. Write rows of gpu,usd_per_hour, e.g. "
            "'h100-sxm,2.49'."
        )
    return out


def _first_row(text: str) -> int:
    for i, line in enumerate(text.splitlines(), start=1):
        if line.strip() and not line.strip().startswith("#"):
            return i
    return 0


def _is_gpu(name: str) -> bool:
    try:
        get_gpu(name)
    except BadInputError:
        return False
    return True


def _priced_gpu(name: str, where: str) -> GPU:
    if "@" in name:
        raise BadInputError(
            f"{where}: {name!r} is a budget, not a GPU; price the card itself (e.g. "
            f"{name.split('@')[0]!r})."
        )
    try:
        gpu = get_gpu(name)
    except BadInputError as e:
        raise BadInputError(f"{where}: {e}") from None
    if gpu.name not in {g.name for g in list_gpus()}:  # a bare budget such as "12GiB"
        raise BadInputError(f"{where}: {name!r} is a memory budget, not a GPU of the catalog.")
    return gpu


def _checked(prices: dict[str, float] | None) -> dict[str, float] | None:
    if prices is None:
        return None
    if not isinstance(prices, dict):
        raise BadInputError(
            f"prices must be a CSV path or a dict of GPU name to USD per hour, got "
            f"{type(prices).__name__}."
        )
    out = {}
    for name, price in prices.items():
        if isinstance(price, bool) or not isinstance(price, (int, float)) or price < 0:
            raise BadInputError(f"The price of {name!r} is {price!r}; give USD per GPU-hour.")
        out[_priced_gpu(str(name), "prices").name] = float(price)
    return out
