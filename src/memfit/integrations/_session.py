"""What both trainer callbacks do, whichever trainer calls them: estimate the run read from the
trainer, print the report and the verdict, plan when it will not fit, measure the first steps
and compare them with the estimate.

The trainer-specific modules (`memfit.integrations.transformers`, `.lightning`) only read
their trainer into a `RunReading` and turn a plan into their trainer's settings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from memfit.cuda.gpus import FIT_MARGIN_FRACTION
from memfit.errors import BadInputError, Failsafe, MemfitError
from memfit.estimator import Estimate, estimate
from memfit.measurement.measure import Measurement, measure
from memfit.models.sources import ModelSpec
from memfit.planner.search import Goal, Plan, plan
from memfit.report.text import render_text
from memfit.units import format_bytes
from memfit.workload import Workload

__all__ = ["Comparison", "RunReading", "Session", "WontFitError", "callback_hook"]

F = TypeVar("F", bound=Callable[..., Any])

#: Planner techniques a trainer's own settings cannot express (they need memfit.apply_ or
#: code changes): the plan a callback suggests leaves them out, so that every change it names
#: is a setting of the trainer.
NOT_TRAINER_SETTINGS = (
    "offload",
    "cpu-embedding",
    "optimizer-in-backward",
    "activation-offload",
    "chunked-loss",
    "fsdp-offload",
    "pure-precision",
)

#: Relative difference between the measured peak and the estimate that the callbacks report as
#: agreement: docs/accuracy.md's target for `max_memory_allocated` (median within 2 %).
AGREEMENT = 0.02


class WontFitError(MemfitError):
    """The run will not fit the GPU: raised by a callback before the first step, with the
    settings to change in its message (and on `changes`)."""

    def __init__(self, message: str, changes: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.changes = changes or {}


@dataclass(frozen=True)
class RunReading:
    """A run read from a trainer: what to estimate, and what the reading assumed."""

    spec: ModelSpec
    workload: Workload
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Comparison:
    """Estimate against measurement of the first steps.

    Attributes:
        device: where the steps ran ("cpu" or "cuda:N").
        estimated: the estimate's peak allocated bytes, less the cuBLAS workspaces on a CPU
            (a CPU has none).
        measured: the measured peak allocated bytes (on CUDA, `max_memory_allocated`).
        relative: (measured - estimated) / estimated.
        dropout: on a CPU, the model trains with dropout: the CPU keeps each dropout's mask
            in the activation dtype where CUDA keeps a bool (1 B per element), so the CPU
            measurement is larger than the CUDA estimate by design; the report says so
            instead of calling it a miss.
    """

    device: str
    estimated: int
    measured: int
    steps: int
    dropout: bool = False

    @property
    def relative(self) -> float:
        return (self.measured - self.estimated) / self.estimated if self.estimated else 0.0

    @property
    def agrees(self) -> bool:
        return abs(self.relative) <= AGREEMENT

    def __str__(self) -> str:
        where = "CPU tracker, no CUDA workspaces" if self.device == "cpu" else self.device
        if self.agrees:
            verdict = ""
        elif self.dropout and self.measured > self.estimated:
            verdict = (
                " (not like with like: on a CPU dropout keeps its mask in the activation dtype, "
                "on CUDA as 1-byte bools, which the estimate counts; set dropout to 0 or "
                "measure on the GPU to check the estimate)"
            )
        else:
            verdict = f" (beyond the {AGREEMENT:.0%} of docs/accuracy.md)"
        return (
            f"memfit: measured {self.steps} step(s) on {where}: peak allocated "
            f"{format_bytes(self.measured)} ({self.measured:,} B) against the estimate's "
            f"{format_bytes(self.estimated)} ({self.estimated:,} B): {self.relative:+.2%}"
            f"{verdict}."
        )


@dataclass
class Session:
    """One run's estimate, plan and measurement (see the module docstring)."""

    gpu: str | None
    measure_steps: int
    stop: bool
    print_fn: Callable[[str], None]
    estimate: Estimate | None = None
    plan: Plan | None = None
    comparison: Comparison | None = None
    reading: RunReading | None = None
    #: The measurement of the first steps, once they ran.
    measurement: Measurement | None = None
    _measurement: Measurement | None = field(default=None, repr=False)
    _dropout: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        if (
            isinstance(self.measure_steps, bool)
            or not isinstance(self.measure_steps, int)
            or (self.measure_steps < 0)
        ):
            raise BadInputError(
                f"measure_steps must be a number of steps >= 0, got {self.measure_steps!r}."
            )

    def run_estimate(self, reading: RunReading, device: torch.device | str | None) -> Estimate:
        """Estimate the run for the named GPU, else the CUDA device in use; print it."""
        self.reading = reading
        gpu = self.gpu or _gpu_of(device, self.print_fn)
        est = estimate(reading.spec, reading.workload.with_(gpu=gpu))
        self.estimate = dataclasses.replace(est, notes=[*est.notes, *reading.notes])
        self.print_fn("memfit: estimate of this run\n" + render_text(self.estimate))
        return self.estimate

    def check_fit(
        self,
        describe: Callable[[Workload], tuple[dict[str, Any], list[str], list[str]]],
        current: Callable[[], dict[str, Any]],
        fsdp_mixed: str = "policy",
    ) -> None:
        """When the estimate does not fit its GPU: plan, and raise WontFitError naming the
        trainer settings to change (`describe(workload)` gives them, notes on them, and what
        the settings cannot express; `current()` the settings now), or only print it when
        `stop` is False. `fsdp_mixed`: how the trainer's FSDP2 runs a "-mixed" precision
        (the Trainer's, through accelerate: "accelerate")."""
        est = self.estimate
        if est is None or est.fits is not False:
            return
        assert self.reading is not None
        w = self.reading.workload
        per_gpu = w.batch_size * w.grad_accum

        def plan_keeping(optimizer: str | None) -> Plan:
            goal = Goal(global_batch=per_gpu * w.gpus, seq_len=w.seq_len, optimizer=optimizer,
                        fsdp_mixed=fsdp_mixed)  # fmt: skip
            assert self.reading is not None
            return plan(self.reading.spec, gpu=est.gpu.name, goal=goal, n_gpus=w.gpus,
                        forbid=NOT_TRAINER_SETTINGS)  # fmt: skip

        # The run's own optimizer first (another one changes the training), then any.
        p = plan_keeping(w.optimizer)
        if p.best is None:
            p = plan_keeping(None)
        self.plan = p
        need = format_bytes(est.profile.device_total_bytes)
        limit = est.gpu.fit_limit
        head = (
            f"memfit: this run will not fit {est.gpu.display_name}: one step needs {need} "
            f"(nvidia-smi's count), and memfit allows {format_bytes(limit)}, the card's "
            f"{format_bytes(est.gpu.total_memory_bytes)} less a {FIT_MARGIN_FRACTION:.0%} margin."
        )
        changes: dict[str, Any] = {}
        if p.best is None:
            tips = _sentences(_trainer_wording(t) for t in p.suggestions)
            message = (
                f"{head} No setting of the trainer makes it fit: "
                f"{tips or 'no configuration memfit searches fits.'}"
            )
        else:
            changes, notes, other = describe(p.best.workload)
            now = current()
            listed = ", ".join(f"{k}={v!r} (now {now.get(k)!r})" for k, v in changes.items())
            fit = format_bytes(p.best.estimate.profile.device_total_bytes)
            message = f"{head} Change: {listed}; then one step needs {fit}."
            if notes or other:
                message += " Note: " + _sentences(notes + other)
        if self.stop:
            raise WontFitError(message + " Stopped before the first step.", changes)
        self.print_fn(message)

    # ------------------------------------------------------------------ measurement

    def start_measuring(self, model: torch.nn.Module, optimizer: Any) -> None:
        if self.measure_steps == 0 or self._measurement is not None or self.comparison:
            return
        inner = optimizer
        while isinstance(getattr(inner, "optimizer", None), torch.optim.Optimizer):
            inner = inner.optimizer
        opt = inner if isinstance(inner, torch.optim.Optimizer) else None
        self._dropout = _trains_with_dropout(model)
        self._measurement = measure(model, opt)
        self._measurement._report = self.print_fn  # its own failure, said once, as ours
        self._measurement.__enter__()

    def abandon_measuring(self) -> None:
        """End a running measurement without comparing (the callback stopped)."""
        m, self._measurement = self._measurement, None
        if m is not None:
            self.measurement = m
            m.__exit__(None, None, None)

    @property
    def measuring(self) -> bool:
        return self._measurement is not None

    def stop_measuring(self, error: BaseException | None = None) -> Comparison | None:
        """End the measurement; compare it with the estimate (and print both), or with an
        out-of-memory `error`, print what held the memory."""
        m = self._measurement
        if m is None:
            return None
        self._measurement = None
        self.measurement = m
        if isinstance(error, torch.OutOfMemoryError):
            # The block re-raises the same error, with the report attached.
            with contextlib.suppress(torch.OutOfMemoryError):
                m.__exit__(type(error), error, error.__traceback__)
            if m.failed is None:  # else the measurement said why it has no report
                self.print_fn(
                    "memfit: out of memory during the measured steps\n" + (m.oom_report or "")
                )
            return None
        m.__exit__(None, None, None)
        if self.estimate is None or m.profile is None:  # m.failed: it said why already
            return None
        est = self.estimate.profile
        cuda = m.device.startswith("cuda")
        if cuda and m.cuda_max_allocated is not None:
            measured, estimated = m.cuda_max_allocated, est.peak_allocated_bytes
        else:  # a CPU has no cuBLAS workspace; the tracker counts what the estimate does
            measured = m.profile.peak_allocated_bytes
            estimated = est.peak_allocated_bytes - est.breakdown.get("workspaces", 0)
        self.comparison = Comparison(m.device, estimated, measured, m.steps,
                                     dropout=not cuda and self._dropout)  # fmt: skip
        self.print_fn(str(self.comparison))
        return self.comparison


def _sentences(parts: Iterable[str]) -> str:
    """Parts joined as one sentence ("a; b; c."), whatever punctuation each part ends with."""
    cleaned = [p.strip().rstrip(".;").strip() for p in parts]
    return "; ".join(p for p in cleaned if p) + "." if any(cleaned) else ""


def _trainer_wording(tip: str) -> str:
    """A plan's suggestion as a trainer's user acts on it: the planner's `--allow NAME` and
    `--forbid NAME` are options of `memfit plan`, not of a Trainer."""
    return re.sub(r"--(?:allow|forbid) ([\w-]+)", r"\1", tip)


#: Config fields transformers models read as dropout probabilities (functional dropout, e.g.
#: SDPA's dropout_p), beside the nn.Dropout modules.
_DROPOUT_FIELDS = ("attention_dropout", "attn_pdrop", "hidden_dropout", "dropout",
                   "attention_probs_dropout_prob", "hidden_dropout_prob", "resid_pdrop",
                   "embd_pdrop")  # fmt: skip


def _trains_with_dropout(model: torch.nn.Module) -> bool:
    """Whether a training step of `model` drops anything: a Dropout module with p > 0, or a
    dropout probability in a transformers config."""
    from torch.nn.modules.dropout import _DropoutNd

    if any(isinstance(m, _DropoutNd) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    return any(
        isinstance(p := getattr(config, f, 0), (int, float)) and p > 0 for f in _DROPOUT_FIELDS
    )


def _gpu_of(device: torch.device | str | None, print_fn: Callable[[str], None]) -> str | None:
    """The catalog name of the CUDA device in use, or None (no verdict) on another device."""
    if device is None or torch.device(device).type != "cuda":
        return None
    name = torch.cuda.get_device_name(torch.device(device))
    from memfit.cuda.target import get_gpu

    try:
        return get_gpu(name).name
    except BadInputError as e:
        print_fn(f"memfit: {e} Pass gpu=... to the callback for a verdict.")
        return None


def callback_hook(where: str) -> Callable[[F], F]:
    """A callback hook (a method of a `SessionResults`) that never breaks the training: an
    unexpected exception in memfit's own work is reported once (the session's print_fn) and
    stops the callback, and training goes on (memfit.errors.Failsafe). `WontFitError` (the intended
    stop) and, with `strict=True`, every exception are raised."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def hook(self: SessionResults, *args: Any, **kwargs: Any) -> Any:
            if self.failsafe.failed is not None:
                return None
            try:
                return method(self, *args, **kwargs)
            except WontFitError:
                raise
            except Exception as e:
                if self.strict:
                    raise
                self.failsafe.trip(where, e)
                return None

        return hook  # type: ignore[return-value]

    return wrap


class SessionResults:
    """A callback's session and what it found: the estimate, the plan when the run did not
    fit, and the estimate-against-measured comparison of the first steps. The arguments are
    the callbacks' (memfit.integrations.transformers.MemfitCallback documents them).

    `failed` says where and why memfit's own work failed during the run, if it did (said once
    through print_fn; the callback then stopped and training went on)."""

    session: Session
    failsafe: Failsafe

    def __init__(
        self,
        gpu: str | None = None,
        *,
        measure_steps: int = 2,
        stop: bool = True,
        strict: bool = False,
        print_fn: Callable[[str], None] = print,
    ) -> None:
        super().__init__()
        self.session = Session(gpu=gpu, measure_steps=measure_steps, stop=stop, print_fn=print_fn)
        self.strict = strict
        self._measure_until = 0
        self.failsafe = Failsafe("memfit's callback", print_fn)
        self.failsafe.on_trip(self.session.abandon_measuring)

    @property
    def failed(self) -> str | None:
        """Where and why memfit failed during the run (the callback, or its measurement), or
        None."""
        m = self.session.measurement or self.session._measurement
        return self.failsafe.failed or (m.failed if m is not None else None)

    @property
    def estimate(self) -> Any:
        return self.session.estimate

    @property
    def plan(self) -> Any:
        return self.session.plan

    @property
    def comparison(self) -> Comparison | None:
        return self.session.comparison
