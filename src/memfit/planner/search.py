"""`memfit.plan`: the fastest configuration that fits a GPU, searched with the estimator.

The goal fixes what the user will not trade: the global batch (samples per optimizer step), the
sequence length, and optionally the precision or the optimizer. The search tries the
techniques allowed (TECHNIQUES; `allow` / `forbid` change the set), prices every configuration
that fits with the step-time cost model (memfit.planner.cost), and returns the fastest. It returns a
Pareto table of memory against predicted step time too.

How the search stays fast:
- Each *shape* (precision, optimizer, checkpointing, LoRA / QLoRA, tied embeddings, and the lean
  techniques: step in backward, offloaded activations, chunked loss, FSDP2 CPU offload) is
  traced once per micro-batch size. Placement variants (optimizer state on the CPU, embedding
  on the CPU) only change where storages live, so they are priced from the same trace.
- The shapes come in stages (memfit.planner.shapes): the lean full fine-tune and then FSDP2's
  CPU offload are searched only when nothing fitted before them, so a job that fits with the
  usual techniques costs no more traces than before.
- For a shape, the micro-batch is the largest divisor of the global batch that fits, guessed
  from the memory at the smallest and the largest (memory grows about linearly with the
  micro-batch) and walked to the boundary; with the step in backward it is the per-GPU batch
  (no accumulation).
- A shape that differs from a traced one only in the optimizer is composed from it
  (memfit.planner.composed), once a composition of that shape has equalled its real trace.
- Traces are cached (memfit.estimator.trace.cache) and a repeated plan is read back
  (memfit.planner.plan_cache); with MEMFIT_JOBS the traces a stage needs in any case are
  made side by side (memfit.estimator.parallel).
- A shape that does not fit at micro-batch 1 rules out every heavier shape: more precise
  weights, a heavier optimizer, no checkpointing (see `memfit.planner.shapes.heavier`). A shape
  whose weights and gradients alone exceed the GPU fails without a trace (memfit.planner.floors).
- During the search the replay of repeated blocks is not re-verified on 4 blocks. The
  recommended plan is estimated again through `memfit.estimate` itself, so its figures are
  exactly what `memfit estimate` prints for that configuration.

Not searched: a choice of which blocks to checkpoint beyond "the first k" (see
memfit.planner.partial_checkpointing), tensor parallelism, and quantization without LoRA (a
quantized base cannot be trained by itself).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

from memfit.cuda.target import get_gpu
from memfit.errors import BadInputError, TraceError
from memfit.estimator import (
    Trace,
    attention_class,
    check_environment,
    estimate_from_trace,
    pack_trace,
    run_all,
    session,
    trace_spec,
    unpack_trace,
    without_full_collections,
    workers,
)
from memfit.models.sources import ModelSpec, resolve_model
from memfit.optimizers import is_paged
from memfit.planner.advice import what_would_fit
from memfit.planner.choice import faster_other_optimizer, pareto, preference
from memfit.planner.composed import Composer
from memfit.planner.cost import step_cost
from memfit.planner.floors import Floors, Skipped
from memfit.planner.partial_checkpointing import fewest_checkpointed
from memfit.planner.plan_cache import cached_plan, plan_key
from memfit.planner.results import Candidate, Goal, Plan
from memfit.planner.shapes import (
    PLAN_LORA_RANK,
    WIDEN_WHEN_NOTHING_FITS,
    Shape,
    allowed_techniques,
    divisors,
    heavier,
    is_lean,
    is_plain,
    lean_shapes,
    offload_shapes,
    placements,
    shape_of,
    shapes,
    with_ddp,
)
from memfit.planner.work import work_of
from memfit.precision import precision_of
from memfit.workload import LoraConfig, Workload

#: A shape traced at a micro-batch: (trace, blocks, replayed), as `trace_spec` returns it.
_Traced = tuple[Trace, int, bool]


class _Search:
    def __init__(self, spec: ModelSpec, goal: Goal, gpu: Any, n_gpus: int = 1,
                 traces: dict[tuple[Shape, int], _Traced] | None = None,
                 host_memory: str | None = None,
                 composer: Composer | None = None) -> None:  # fmt: skip
        self.host_memory = host_memory
        self.spec = spec
        self.goal = goal
        self.gpu = gpu
        self.n_gpus = n_gpus
        self.per_gpu = goal.global_batch // n_gpus  # samples per GPU per step
        # Shared by plans of one model and goal on GPUs whose kernels trace alike, with what
        # their composer learnt: which traces are real, which checks passed, the micro-batch
        # lines (all of them about traces, none about the GPU's memory).
        self.traces = traces if traces is not None else {}
        self.candidates: list[Candidate] = []
        self.composer = composer or Composer(spec, gpu.compute_capability)
        self.untraceable: dict[Shape, str] = {}
        self.floors = Floors(spec, gpu.fit_limit)

    def beyond_floor(self, shape: Shape, mb: int, places: list[tuple[bool, bool]], *,
                     every_gradient: bool = False) -> bool:  # fmt: skip
        """Whether `shape` cannot fit at any micro-batch, known without a trace (memfit.
        planner.floors); never for the shape the plan shows as its baseline. With
        `every_gradient`: whether it may be known so after more traces."""
        if is_plain(shape, self.goal) or shape in self.untraceable:
            return False
        try:
            w = self.workload(shape, mb, False, False)
            if not self.floors.above(shape, w, places, self.traces, every_gradient=every_gradient):
                return False
        except (TraceError, BadInputError):  # refused: `evaluate` says why
            return False
        return True

    def skip(self, shape: Shape, micro: list[int], places: list[tuple[bool, bool]]) -> None:
        """Leave `shape` untraced (it is `beyond_floor`), as it would have been evaluated."""
        self.floors.skipped.append(Skipped(shape, micro, places, len(self.candidates)))

    def workload(self, shape: Shape, mb: int, offload: bool, emb: bool) -> Workload:
        return Workload(
            batch_size=mb,
            seq_len=self.goal.seq_len,
            image_size=self.goal.image_size,
            precision=shape.precision,
            optimizer=shape.optimizer,
            grad_accum=self.per_gpu // mb,
            gpus=self.n_gpus,
            checkpointing=shape.checkpointing,
            lora=LoraConfig(rank=PLAN_LORA_RANK) if shape.lora else None,
            tie_embeddings=shape.tie_embeddings,
            offload_optimizer=offload,
            embedding_on_cpu=emb,
            gpu=self.gpu.name,
            quantize=shape.quantize,
            optimizer_in_backward=shape.optimizer_in_backward,
            offload_activations=shape.offload_activations,
            chunked_loss=shape.chunked_loss,
            fsdp_cpu_offload=shape.fsdp_cpu_offload,
            ddp=shape.ddp,
            fsdp_mixed=self.fsdp_mixed(shape),
            host_memory=self.host_memory,
            **shape.distillation(self.goal),
        )

    def fsdp_mixed(self, shape: Shape) -> str:
        """The goal's FSDP2 mixed precision, where it applies (FSDP over several GPUs)."""
        sharded = self.n_gpus > 1 and not shape.ddp and precision_of(shape.precision).mixed
        return self.goal.fsdp_mixed if sharded else "policy"

    def prefetch(self, pairs: list[tuple[Shape, int]]) -> None:
        """Trace (shape, micro-batch) pairs the search is about to evaluate, side by side
        (memfit.estimator.parallel); a pair that fails is left for `evaluate` to report.
        Nothing without children: one after another, `evaluate` traces only what it needs."""
        if workers() <= 1:
            return
        todo, jobs = [], []
        for s, mb in dict.fromkeys(pairs):
            if (s, mb) in self.traces or s in self.untraceable:
                continue
            try:
                w = self.workload(s, mb, False, False)
            except BadInputError:  # a combination the Workload refuses: `evaluate` says why
                continue
            todo.append((s, mb))
            jobs.append(functools.partial(_trace_or_none, self.spec, w,
                                          self.gpu.compute_capability))  # fmt: skip
        for pair, traced in zip(todo, run_all(jobs, pack=_pack, unpack=_unpack), strict=True):
            if traced is not None:
                self.traces[pair] = traced
                self.composer.real.append(pair)  # a real trace: a composition's check

    def evaluate(self, shape: Shape, mb: int, placements: list[tuple[bool, bool]]) -> list[
        Candidate
    ]:  # fmt: skip
        key = (shape, mb)
        if shape in self.untraceable:
            return []
        # A lean technique the model or the Workload refuses (a chunked loss on a model
        # without an LM head, QLoRA over several GPUs) rules out the shape, not the plan.
        refused = (TraceError, BadInputError) if is_lean(shape) else (TraceError,)
        try:
            base = self.workload(shape, mb, False, False)
            if key not in self.traces:
                self.traces[key] = self.composer.trace(
                    shape, mb, base, self.traces, lambda s, m: self.workload(s, m, False, False)
                )
        except refused as e:
            # This combination cannot run (e.g. Adafactor's factored state on FSDP2
            # shards): it is not a candidate; the others still are.
            self.untraceable[shape] = str(e).splitlines()[0]
            return []
        tr, n_blocks, replayed = self.traces[key]
        out: list[Candidate] = []
        # Placements only move memory to the CPU, at a cost: when everything on the GPU fits,
        # they cannot be faster; when the lightest placement does not fit, none does.
        usable = [(o, e) for o, e in placements if not (shape.tie_embeddings and e)]
        order = sorted(usable, key=lambda oe: (oe != (False, False), -(oe[0] + oe[1])))
        for offload, emb in order:
            if out and out[0].fits and (offload or emb):
                break
            if len(out) == 2 and not out[1].fits:
                break
            w = self.workload(shape, mb, offload, emb)
            try:
                est = estimate_from_trace(
                    self.spec, w, tr, n_blocks=n_blocks, replayed=replayed, gpu=self.gpu
                )
            except BadInputError:
                continue  # e.g. no input embedding to move to the CPU
            cand = Candidate(workload=w, estimate=est, cost=step_cost(work_of(est), self.gpu,
                                                                       tf32=False))  # fmt: skip
            self.candidates.append(cand)
            out.append(cand)
        return out


def _trace_or_none(spec: ModelSpec, w: Workload, capability: Any) -> _Traced | None:
    try:
        return trace_spec(spec, w, capability, verify=False)
    except (TraceError, BadInputError):
        return None


def _pack(traced: _Traced | None) -> Any:
    return None if traced is None else pack_trace(traced)


def _unpack(packed: Any) -> _Traced | None:
    return None if packed is None else unpack_trace(packed)


def _explore(
    search: _Search,
    spec: ModelSpec,
    goal: Goal,
    gpu_obj: Any,
    allowed: set[str],
    n_gpus: int,
    *,
    stage: Any = shapes,
    skip: frozenset[Shape] | set[Shape] = frozenset(),
) -> set[Shape]:
    """Evaluate the shapes of `stage` and the micro-batches that can win, pruning what cannot:
    a light shape that does not fit rules out every heavier one, and a shape whose largest
    micro-batch is already slower than the best fit is not searched further."""
    # FSDP2 has its own CPU offload; memfit models neither placement with sharding.
    places = placements(allowed) if n_gpus == 1 else [(False, False)]
    per_gpu = search.per_gpu
    micro_all = divisors(per_gpu) if "micro-batch" in allowed else [per_gpu]
    failed: list[Shape] = []
    best_seconds = float("inf")
    todo = [s for s in with_ddp(stage(goal, allowed, gpu_obj, spec), allowed, n_gpus)
            if s not in skip]  # fmt: skip

    def micro_of(shape: Shape) -> list[int]:
        # The step in backward cannot accumulate: the micro-batch is the per-GPU batch.
        return [per_gpu] if shape.optimizer_in_backward else micro_all

    def places_of(shape: Shape) -> list[tuple[bool, bool]]:
        # The optimizer on the CPU and the step in backward exclude each other; FSDP2's CPU
        # offload places everything itself.
        if shape.fsdp_cpu_offload:
            return [(False, False)]
        # A paged optimizer pages its state to the host by itself.
        lean = shape.optimizer_in_backward or is_paged(shape.optimizer)
        return [(o, e) for o, e in places if not (o and lean)]

    # Probe the lightest shapes at the smallest micro-batch first: a light shape that does not
    # fit rules out every heavier one before any of them is traced.
    lightest = [s for s in todo if not any(heavier(s, t) and s != t for t in todo)]

    def floored(shape: Shape, *, every_gradient: bool = False) -> bool:
        # Its weights and gradients alone exceed the GPU.
        return search.beyond_floor(shape, micro_of(shape)[0], places_of(shape),
                                   every_gradient=every_gradient)  # fmt: skip

    def traced_anyway(shape: Shape) -> bool:
        # Evaluated whatever the traces before it say: prefetched (side by side) only then;
        # one after another nothing is (no floor is built for it).
        return (
            workers() > 1
            and not any(k[0] == shape for k in search.traces)
            and not floored(shape, every_gradient=True)
        )

    search.prefetch([(s, micro_of(s)[0]) for s in lightest if traced_anyway(s)])
    for shape in lightest:
        if floored(shape):  # fails without a trace
            search.skip(shape, micro_of(shape)[:1], places_of(shape))
            failed.append(shape)
            continue
        probe = search.evaluate(shape, micro_of(shape)[0], places_of(shape))
        # An untraceable shape (no candidates) rules out nothing heavier.
        if probe and not any(c.fits for c in probe):
            failed.append(shape)
    left = [s for s in todo if not any(heavier(s, f) for f in failed)]
    # Side by side, only what the loop below traces for real in any case: the largest
    # micro-batch of a shape not evaluated yet (a probed shape's may be composed instead;
    # a smaller micro-batch is searched only if the largest does not fit).
    search.prefetch([(s, micro_of(s)[-1]) for s in left if traced_anyway(s)])
    for shape in left:
        micro = micro_of(shape)
        if floored(shape):  # as evaluated when nothing fits: the largest, then the smallest
            search.skip(shape, [micro[-1], micro[0]], places_of(shape))
            continue
        # The largest micro-batch first: if it fits, nothing of this shape is faster; if not,
        # its cost bounds every smaller micro-batch from below (less efficient, more launches;
        # placements only add transfers), so a shape that cannot win is not searched.
        top = search.evaluate(shape, micro[-1], places_of(shape))
        if any(c.fits for c in top):
            best_seconds = min(best_seconds, *(c.cost.seconds for c in top if c.fits))
            continue
        if not top or min(c.cost.seconds for c in top) >= best_seconds:
            continue
        best_i, seconds = _largest_fitting(search, shape, micro, places_of(shape), top)
        best_seconds = min([best_seconds, *seconds])
        if best_i < 0 and micro[0] == 1 and shape not in search.untraceable:
            failed.append(shape)
    return set(todo)


def _largest_fitting(
    search: _Search, shape: Shape, micro: list[int], places: list[tuple[bool, bool]],
    top: list[Candidate],
) -> tuple[int, list[float]]:  # fmt: skip
    """The index of the largest micro-batch below the top one (which does not fit) at which
    some placement fits, or -1; and the step seconds of what fitted on the way.

    Device memory grows about linearly with the micro-batch, so the smallest and the top one
    give a guess; the guess is traced, then its neighbours, walking up or down to the
    boundary: as exact as a bisection under the same monotonicity, in fewer traces.
    """
    seconds: list[float] = []

    def fits_at(i: int) -> list[Candidate] | None:
        cands = search.evaluate(shape, micro[i], places)
        fit = [c.cost.seconds for c in cands if c.fits]
        seconds.extend(fit)
        return cands if fit else None

    first = fits_at(0)
    if first is None:
        return -1, seconds
    m0 = min(c.device_total_bytes for c in first)
    mt = min((c.device_total_bytes for c in top), default=m0)
    limit = search.gpu.fit_limit
    guess = 0
    if mt > m0:
        want = micro[0] + (limit - m0) * (micro[-1] - micro[0]) / (mt - m0)
        guess = max((i for i in range(len(micro) - 1) if micro[i] <= want), default=0)
    i = guess
    if i == 0 or fits_at(i) is not None:
        while i + 1 < len(micro) - 1 and fits_at(i + 1) is not None:
            i += 1
        return i, seconds
    while i > 1 and fits_at(i - 1) is None:
        i -= 1
    return i - 1, seconds


def plan(
    model: Any,
    *,
    gpu: str,
    goal: Goal,
    n_gpus: int = 1,
    allow: tuple[str, ...] = (),
    forbid: tuple[str, ...] = (),
    task: str | None = None,
    trace_cache: dict[Any, Any] | None = None,
    host_memory: str | None = None,
) -> Plan:
    """The fastest configuration of `model` that reaches `goal` on `gpu`.

    `host_memory` ("64GiB") is the RAM of the machine that trains, for what offloading keeps
    on the CPU; None: this machine's.

    `trace_cache` (a dict the caller keeps) shares traces between plans of the same model,
    goal and `n_gpus` on several GPUs: a trace depends on the GPU only through the attention
    kernels its compute capability picks (memfit.estimator.trace.attention.attention_class;
    memfit.planner.gpus.ranking plans every GPU of the catalog).

    Example:
        >>> p = memfit.plan("llama-2-7b", gpu="rtx-4090", goal=Goal(global_batch=32, seq_len=2048))
        >>> p.best.workload, p.best.cost.seconds
    """

    t0 = time.perf_counter()
    check_environment()
    if not isinstance(goal, Goal):
        raise BadInputError(
            f"plan needs goal=Goal(global_batch=..., seq_len=...), got {type(goal).__name__} "
            f"{goal!r}."
        )
    if isinstance(n_gpus, bool) or not isinstance(n_gpus, int) or n_gpus < 1:
        raise BadInputError(f"n_gpus must be a positive integer, got {n_gpus!r}.")
    if goal.global_batch % n_gpus:
        raise BadInputError(
            f"The global batch ({goal.global_batch}) must split evenly over --gpus {n_gpus}: "
            f"give a multiple of {n_gpus}."
        )
    gpu_obj = get_gpu(gpu)
    allowed = allowed_techniques(allow, forbid)
    spec = resolve_model(model, task=task)
    if goal.seq_len and spec.max_positions and goal.seq_len > spec.max_positions:
        raise BadInputError(
            f"Sequence length {goal.seq_len} is longer than {spec.name!r} supports "
            f"({spec.max_positions} positions)."
        )
    key = plan_key(spec, gpu_obj.name, goal, n_gpus, sorted(allowed), sorted(forbid),
                   host_memory=host_memory, teacher=goal.teacher)  # fmt: skip
    return cached_plan(
        key,
        lambda: _in_session(
            _search_plan,
            spec,
            gpu_obj,
            goal,
            n_gpus,
            allowed,
            set(forbid),
            trace_cache,
            host_memory,
            t0,
        ),
    )


def _in_session(search: Any, *args: Any) -> Plan:
    # The plan's own traces stay in memory even with the cache off; the collector is kept off
    # them (memfit.estimator.trace.collector).
    with session(), without_full_collections():
        return search(*args)


def _search_plan(spec: ModelSpec, gpu_obj: Any, goal: Goal, n_gpus: int, allowed: set[str],
                 forbid: set[str], trace_cache: dict[Any, Any] | None, host_memory: str | None,
                 t0: float) -> Plan:  # fmt: skip
    shared = attention_class(gpu_obj.compute_capability)  # GPUs that trace alike
    composer = _cached(trace_cache, (shared, "composer"),
                       lambda: Composer(spec, gpu_obj.compute_capability))  # fmt: skip
    search = _Search(spec, goal, gpu_obj, n_gpus, _cached(trace_cache, shared), host_memory,
                     composer)  # fmt: skip
    widened = _staged_search(search, spec, goal, gpu_obj, allowed, forbid, n_gpus)
    fitting = [c for c in search.candidates if c.fits]
    best = min(fitting, key=lambda c: preference(c, goal)) if fitting else None
    if best is not None and best.workload.checkpointing == "blocks" and spec.num_layers:
        best = fewest_checkpointed(spec, best, gpu_obj, spec.num_layers)
        fitting.append(best)
    if best is not None:
        best = _confirm(spec, best, gpu_obj, _cached(trace_cache, (shared, "confirmed")))
    baseline = _baseline(search, search.per_gpu, goal)
    same_optimizer = [
        c for c in fitting if best is None or preference(c, goal)[0] == preference(best, goal)[0]
    ]
    closest_miss = None
    suggestions: list[str] = []
    if best is None:
        search.floors.trace_skipped(search.evaluate, search.candidates)  # the closest miss
        closest_miss = min(search.candidates, key=lambda c: c.device_total_bytes, default=None)
        decided = allowed | forbid | WIDEN_WHEN_NOTHING_FITS  # widened: searched
        suggestions = what_would_fit(spec, goal.seq_len, gpu_obj, closest_miss, decided, n_gpus)
    other = faster_other_optimizer(fitting, best, goal)
    return Plan(
        model=spec.name,
        gpu=gpu_obj,
        goal=goal,
        best=best,
        pareto=[c if c is best else _summary(c) for c in pareto(same_optimizer)],
        other_optimizer=None if other is None else _summary(other),
        baseline=None if baseline is None or baseline is best else _summary(baseline),
        closest_miss=None if closest_miss is None else _summary(closest_miss),
        suggestions=suggestions,
        evaluated=len(search.candidates),
        traces=len(search.traces),
        seconds=time.perf_counter() - t0,
        widened=widened,
    )


def _summary(c: Candidate) -> Candidate:
    """`c` without its event stream (`profile.records` and `.events`): a plan keeps the stream
    of its recommendation only (the others' peaks, breakdowns and timelines stay). A 7B plan
    read back from the cache loads 5 streams of 50k events otherwise."""
    profile = dataclasses.replace(c.estimate.profile, records={}, events=[])
    return dataclasses.replace(c, estimate=dataclasses.replace(c.estimate, profile=profile))


def _staged_search(
    search: _Search,
    spec: ModelSpec,
    goal: Goal,
    gpu_obj: Any,
    allowed: set[str],
    forbid: set[str],
    n_gpus: int,
) -> tuple[str, ...]:
    """Search stage by stage (memfit.planner.shapes), each only when nothing fitted before it;
    returns the opt-in techniques added because nothing fitted without them.

    Opt-in techniques that may be widened (pure precision) are searched only after every stage
    failed without them: a lean mixed-precision configuration (a paged optimizer, the step in
    backward, FSDP2's CPU offload) that fits is preferred to changing the numerics."""

    def fits() -> bool:
        return any(c.fits for c in search.candidates)

    def staged(allowed_now: set[str], skip: set[Shape]) -> set[Shape]:
        done = _explore(search, spec, goal, gpu_obj, allowed_now, n_gpus, skip=skip)
        for stage in (lean_shapes, offload_shapes):
            if fits():
                break
            done |= _explore(search, spec, goal, gpu_obj, allowed_now, n_gpus, stage=stage,
                             skip=done)  # fmt: skip
        return done

    explored = staged(allowed, set())
    extra = WIDEN_WHEN_NOTHING_FITS - allowed - forbid
    if not extra or fits():
        return ()
    staged(allowed | extra, explored)
    return tuple(sorted(extra)) if fits() else ()


def _cached(cache: dict[Any, Any] | None, key: Any, make: Any = dict) -> Any:
    """`cache[key]`, made by `make()` the first time; None without a cache."""
    if cache is None:
        return None
    if key not in cache:
        cache[key] = make()
    return cache[key]


def _confirm(spec: ModelSpec, cand: Candidate, gpu: Any,
             kept: dict[Any, _Traced] | None) -> Candidate:  # fmt: skip
    """Estimate the recommendation as `memfit.estimate` does (the replay verified); its trace
    is `kept` for plans on other GPUs of the same attention class."""
    key, kept = cand.workload.with_(gpu=None), {} if kept is None else kept
    if key not in kept:
        kept[key] = trace_spec(spec, cand.workload, gpu.compute_capability)
    tr, n_blocks, replayed = kept[key]
    est = estimate_from_trace(spec, cand.workload, tr, n_blocks=n_blocks, replayed=replayed,
                              gpu=gpu)  # fmt: skip
    return Candidate(workload=cand.workload, estimate=est,
                     cost=step_cost(work_of(est), gpu, tf32=False))  # fmt: skip


def _baseline(search: _Search, per_gpu: int, goal: Goal) -> Candidate | None:
    """The plain configuration (whole batch at once, the goal's or AdamW optimizer, no
    techniques), when the search estimated it: what dominated memory before the plan."""
    for c in search.candidates:
        w = c.workload
        if (
            w.batch_size == per_gpu
            and not w.offload_optimizer
            and not w.embedding_on_cpu
            and is_plain(shape_of(w), goal)
        ):
            return c
    return None
