"""`max_batch` and `max_seq`: the largest micro-batch or sequence that fits a GPU, searched over
the estimator (doubling, then bisection), with the memory curve of the values tried.

Two answers are not numbers, and say so: a search that fits all the way to its cap found a
lower bound ("at least 4096", `Limit.capped`), and a model whose memory does not change with the
value searched (a flat curve: its inputs do not depend on it) has no largest value at all, which
is an error rather than the cap.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memfit.cuda.allocator_config import AllocatorConfig
from memfit.cuda.target import get_gpu
from memfit.errors import BadInputError
from memfit.estimator import (
    MicroBatchLine,
    check_environment,
    estimate_from_trace,
    resolve_precision,
    trace_spec,
)
from memfit.guard.batch_search import largest_passing
from memfit.models.sources import ModelSpec, resolve_model
from memfit.units import format_bytes
from memfit.workload import Workload

#: The largest micro-batch `max_batch` tries.
MAX_BATCH_UPPER = 4096
#: The longest sequence `max_seq` tries for a model that declares no maximum of its own.
MAX_SEQ_UPPER = 131072
#: `max_seq` answers to within this fraction of its answer (1/128: under 0.8 %, 32 tokens at
#: 4096): a sequence length is chosen in round numbers, and every token more is a trace more.
#: Below `SEQ_EXACT_BELOW` tokens it answers to the token.
SEQ_RESOLUTION_DIVISOR = 128
SEQ_EXACT_BELOW = 512


@dataclass(kw_only=True)
class Limit:
    """The largest micro-batch (or sequence) that fits, and the memory curve on the way.

    Attributes:
        largest: the largest value that fits, or None when even 1 does not.
        upper: the largest value the search tried: its cap, or the model's positions.
        capped: `largest` is memfit's search cap, so more may fit: the answer is "at least
            `largest`". False when the search stopped below the cap, or at the model's own
            limit (`max_seq` up to the positions the model has).
        curve: (value, device total bytes, fits) for every value tried, by value.
        new_tokens: with mode="generate", the tokens generated after the prompt; `max_seq`
            then searches the prompt (`what` "prompt_len"), and the context is prompt_len +
            new_tokens. 0 otherwise.
        workload: the workload searched (the value searched left as given), its precision
            resolved: "auto" is the checkpoint's (memfit.estimator.auto_precision).
    """

    model: str
    gpu: Any
    what: str  # "batch_size", "seq_len" or "prompt_len" (max_seq of a generation)
    largest: int | None
    curve: list[tuple[int, int, bool]]
    upper: int = 0
    capped: bool = False
    seconds: float = 0.0
    new_tokens: int = 0
    workload: Workload | None = None
    #: The answer is exact to this many: `largest` fits and `largest + resolution` does not
    #: (1 for micro-batches; coarser for long sequences, see SEQ_RESOLUTION_DIVISOR).
    resolution: int = 1
    #: When nothing fits: the smallest value tried and what its peak holds (the phase and the
    #: largest categories), which says whether the searched value could help at all.
    smallest_peak: tuple[int, str] | None = None


def _limit(
    spec: ModelSpec,
    w: Workload,
    gpu: str,
    what: str,
    upper: int,
    *,
    model_limit: bool = False,
    alloc_conf: str | None = None,
    progress: Callable[[int, int, bool], None] | None = None,
) -> Limit:
    """Exponential growth, then binary search, over the estimator. Micro-batches are predicted
    from two traced ones once a prediction has equalled a real trace (MicroBatchLine); the
    answer and the next micro-batch are traced for real, and the search runs again on real
    traces if either differs from its prediction."""

    check_environment()
    if not isinstance(w, Workload):
        raise BadInputError(
            f"The workload must be a memfit.Workload, got {type(w).__name__} {w!r}. Pass e.g. "
            "memfit.Workload(seq_len=1024)."
        )
    t0 = time.perf_counter()
    spec, w = resolve_precision(spec, w)
    gpu_obj = get_gpu(gpu)
    cfg = AllocatorConfig.from_string(alloc_conf) if alloc_conf else None
    seen: dict[int, tuple[int, int, bool]] = {}  # value -> (allocated, device total, fits)
    peaks: dict[int, str] = {}  # the smallest value tried -> what its peak holds

    def traced(value: int) -> Any:
        wv = w.with_(gpu=gpu_obj.name, **{what: value})
        return trace_spec(spec, wv, gpu_obj.compute_capability, verify=False)

    # Memory is a line in the micro-batch (memfit.estimator.predict): traced for real until
    # a prediction equals a real trace, then predicted; the answer is confirmed below.
    line = MicroBatchLine(traced) if what == "batch_size" and w.mode != "generate" else None

    def fits(value: int) -> bool:
        if value not in seen:
            wv = w.with_(gpu=gpu_obj.name, **{what: value})
            tr, n, rep = line.at(value) if line is not None else traced(value)
            est = estimate_from_trace(
                spec, wv, tr, n_blocks=n, replayed=rep, gpu=gpu_obj, alloc_conf=cfg
            )
            p = est.profile
            seen[value] = (p.peak_allocated_bytes, p.device_total_bytes or 0, bool(est.fits))
            if not peaks or value < min(peaks):  # what holds the memory at the smallest value
                peaks.clear()
                peaks[value] = _peak_summary(p)
            if progress is not None:
                progress(value, seen[value][1], seen[value][2])
        return seen[value][2]

    resolution = 1
    if what == "batch_size":
        good = largest_passing(fits, start=1, upper=upper)
    else:
        limit = gpu_obj.fit_limit
        good, resolution = _longest(fits, lambda v: seen[v][1], limit, upper)
    if line is not None and not all(line.confirm(v) for v in (good, good + 1)
                                    if v in line.predicted):  # fmt: skip
        # A prediction differed from the real trace: search again, on real traces only.
        for v in set(seen) - set(line.real):
            del seen[v]
        good = largest_passing(fits, start=1, upper=upper)
    _refuse_flat(spec.name, what, seen)
    return Limit(
        model=spec.name, gpu=gpu_obj, what=what, largest=good or None,
        curve=sorted((v, total, ok) for v, (_, total, ok) in seen.items()), upper=upper,
        capped=good == upper and not model_limit, seconds=time.perf_counter() - t0,
        new_tokens=w.new_tokens if w.mode == "generate" else 0, workload=w,
        resolution=resolution,
        smallest_peak=None if good else next(iter(peaks.items()), None),
    )  # fmt: skip


def _peak_summary(p: Any) -> str:
    """The peak's phase and its two largest categories, e.g. "the optimizer step (optimizer_state
    25.10 GiB, parameters 12.55 GiB)"."""
    phase = {"optimizer": "the optimizer step", "zero_grad": "zero_grad"}.get(
        p.peak_phase, f"the {p.peak_phase}"
    )
    top = sorted(p.breakdown.items(), key=lambda kv: -kv[1])[:2]
    return f"{phase} ({', '.join(f'{k} {format_bytes(v)}' for k, v in top if v)})"


def _longest(
    fits: Callable[[int], bool], total: Callable[[int], int], limit: int, upper: int
) -> tuple[int, int]:
    """The longest sequence in [1, upper] that fits, and the resolution it is exact to.

    Device memory grows smoothly with the sequence (linearly with flash attention and the KV
    cache, quadratically with an eager score matrix), so the crossing of `limit` is predicted
    from the bracket's two ends (regula falsi, Illinois variant: an end kept twice has its
    distance to the limit halved, so a curved side cannot stall it) instead of halving down to
    single tokens. A predicted crossing is tried, then the value one resolution past it, which
    usually closes the bracket. Every step is a real trace, and the answer is bracketed by real
    traces: `good` fits and `good + resolution` does not.
    """
    start = min(upper, SEQ_EXACT_BELOW)
    if fits(start):
        if start == upper or fits(upper):
            return upper, 1
        good, bad = start, upper
    elif start == 1 or not fits(1):
        return 0, 1
    else:
        good, bad = 1, start
    f_good, f_bad = float(total(good) - limit), float(total(bad) - limit)
    side = 0  # +1: the last step moved `good`; -1: it moved `bad`
    while True:
        resolution = max(1, good // SEQ_RESOLUTION_DIVISOR) if good >= SEQ_EXACT_BELOW else 1
        if bad - good <= resolution:
            return good, bad - good
        if side == 1 and good + resolution < bad and f_bad > 0:
            # Just below the crossing: one resolution up usually closes the bracket.
            crossing = good + (bad - good) * -f_good / (f_bad - f_good)
            guess = good + resolution if crossing < good + resolution else int(crossing)
        else:
            guess = int(good + (bad - good) * -f_good / (f_bad - f_good))
        guess = min(max(guess, good + 1), bad - 1)
        if fits(guess):
            good, f_good = guess, float(total(guess) - limit)
            if side == 1:
                f_bad /= 2
            side = 1
        else:
            bad, f_bad = guess, float(total(guess) - limit)
            if side == -1:
                f_good /= 2
            side = -1


def _refuse_flat(model: str, what: str, seen: dict[int, tuple[int, int, bool]]) -> None:
    """A curve on which every value tried takes the same memory answers nothing: the model's
    inputs do not depend on `what`, so "the largest that fits" would be the search's cap.
    Same memory means the same peak allocated and the same device total: a peak in the
    optimizer step is the same at every sequence length, while the reserved memory the
    activations leave behind is not (the case where nothing fits because of the optimizer)."""
    if len(seen) < 2 or len({(a, total) for a, total, _ in seen.values()}) > 1:
        return
    lo, hi = min(seen), max(seen)
    total = format_bytes(seen[lo][1])
    raise BadInputError(
        f"The memory of {model!r} does not change with {what}: from {what}={lo} to "
        f"{what}={hi} every step takes the same memory ({total} on the device), so there is no "
        f"largest {what} to report. Its inputs do not depend on {what} (a model's own "
        "make_batch decides them); estimate the shapes you will run instead."
    )


def max_batch(
    model: Any, w: Workload, *, gpu: str, task: str | None = None, alloc_conf: str | None = None
) -> Limit:
    """The largest micro-batch of `w` that fits `gpu`, by search over the estimator, up to
    MAX_BATCH_UPPER (then `Limit.capped`: at least that many fit).

    Example:
        >>> limit = memfit.max_batch("gpt2", memfit.Workload(seq_len=1024), gpu="rtx-4090")
        >>> limit.largest, limit.capped
    """
    spec = resolve_model(model, task=task)
    return _limit(spec, w, gpu, "batch_size", MAX_BATCH_UPPER, alloc_conf=alloc_conf)


def max_seq(
    model: Any,
    w: Workload,
    *,
    gpu: str,
    task: str | None = None,
    alloc_conf: str | None = None,
    progress: Callable[[int, int, bool], None] | None = None,
) -> Limit:
    """The longest sequence (up to the model's positions, else MAX_SEQ_UPPER) for `w` that
    fits `gpu`. Only for models whose input is tokens that memfit makes: for an image model, or
    a model with its own make_batch, the sequence is not memfit's to choose (BadInputError).

    Long sequences are answered to within 1/SEQ_RESOLUTION_DIVISOR of the answer
    (`Limit.resolution`: `largest` fits, `largest + resolution` does not), the crossing
    predicted from the values traced (see `_longest`). `progress(value, device total, fits)`
    is called after each value traced.

    With mode="generate" the prompt is searched (`Limit.what` "prompt_len"): the longest prompt
    that, with `w.new_tokens` generated after it, fits; the context is the prompt plus the new
    tokens, up to the model's positions.

    Example:
        >>> w = memfit.Workload(mode="generate", new_tokens=128, precision="bf16-true")
        >>> limit = memfit.max_seq("llama-3.1-8b", w, gpu="l4")
        >>> limit.largest + limit.new_tokens  # the longest context
    """
    spec = resolve_model(model, task=task)
    if isinstance(w, Workload) and w.mode == "generate":
        return _max_prompt(spec, w, gpu, alloc_conf, progress)
    if isinstance(w, Workload) and w.seq_len is not None:
        raise BadInputError(
            f"max_seq searches seq_len itself; the workload has seq_len={w.seq_len}. "
            "Leave seq_len out of it."
        )
    if spec.make_batch is not None or spec.input_kind not in ("tokens", "seq2seq-tokens", "audio"):
        why = (
            f"{spec.name!r} makes its own inputs (make_batch)"
            if spec.make_batch is not None
            else f"the input of {spec.name!r} is {spec.input_kind}, not tokens"
        )
        raise BadInputError(
            f"max_seq searches the sequence length of a model whose input is tokens, and {why}: "
            "no sequence length reaches the model. Search the micro-batch instead (memfit "
            "max-batch), or estimate the shapes you will run."
        )
    upper = spec.max_positions or MAX_SEQ_UPPER
    return _limit(
        spec, w, gpu, "seq_len", upper, model_limit=spec.max_positions is not None,
        alloc_conf=alloc_conf, progress=progress,
    )  # fmt: skip


def _max_prompt(
    spec: ModelSpec,
    w: Workload,
    gpu: str,
    alloc_conf: str | None,
    progress: Callable[[int, int, bool], None] | None,
) -> Limit:
    """`max_seq` of a generation: the longest prompt_len that fits with w.new_tokens after it."""
    if w.prompt_len is not None:
        raise BadInputError(
            f"max_seq searches prompt_len itself with mode='generate'; the workload has "
            f"prompt_len={w.prompt_len}. Leave prompt_len out of it."
        )
    positions = spec.max_positions
    if positions is not None and w.new_tokens >= positions:
        raise BadInputError(
            f"new_tokens={w.new_tokens} leaves no room for a prompt: {spec.name!r} has "
            f"{positions} positions. Use new_tokens={positions - 1} or fewer."
        )
    upper = positions - w.new_tokens if positions is not None else MAX_SEQ_UPPER
    return _limit(
        spec, w, gpu, "prompt_len", upper, model_limit=positions is not None,
        alloc_conf=alloc_conf, progress=progress,
    )  # fmt: skip
