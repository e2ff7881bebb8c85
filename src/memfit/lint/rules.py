"""The rule table: each rule's stable code, name, one-line summary and check, and the
resolution of `select`/`ignore` lists (codes or prefixes: `MF001`, `MF00`, `MF`, `ALL`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from memfit.errors import BadInputError, closest
from memfit.lint import checkpointing, data, evaluation, loops
from memfit.lint.finding import FileContext, LintFinding

Check = Callable[[FileContext], list[LintFinding]]


@dataclass(frozen=True, kw_only=True)
class Rule:
    """A lint rule. `name` matches the doctor's finding kinds where one exists."""

    code: str
    name: str
    summary: str
    check: Check


RULES: tuple[Rule, ...] = (
    Rule(code="MF001", name="graph-kept-alive", check=loops.check_kept,
         summary="a loss or output tensor outlives its training-loop iteration"),
    Rule(code="MF002", name="eval-without-no-grad", check=evaluation.check_eval,
         summary="a model runs in eval mode without torch.no_grad()/inference_mode()"),
    Rule(code="MF003", name="retain-graph-in-loop", check=loops.check_retain,
         summary="backward(retain_graph=True) in a loop with no second backward"),
    Rule(code="MF004", name="checkpoint-without-use-reentrant",
         check=checkpointing.check_use_reentrant,
         summary="torch.utils.checkpoint without use_reentrant"),
    Rule(code="MF005", name="checkpoint-none-input", check=checkpointing.check_none_input,
         summary="a None input to a reentrant torch.utils.checkpoint"),
    Rule(code="MF006", name="dataset-on-gpu", check=data.check_dataset_on_gpu,
         summary="a whole dataset moved to the GPU before the loop"),
    Rule(code="MF007", name="zero-grad-keeps-gradients", check=loops.check_zero_grad,
         summary="zero_grad(set_to_none=False)"),
    Rule(code="MF008", name="padding-without-truncation", check=data.check_tokenizer_padding,
         summary="a tokenizer call that pads without truncation or max_length"),
    Rule(code="MF009", name="pin-memory-on-gpu-tensors", check=data.check_pin_memory,
         summary="DataLoader(pin_memory=True) over tensors already on the GPU"),
)  # fmt: skip

CODES: tuple[str, ...] = tuple(r.code for r in RULES)
BY_CODE = {r.code: r for r in RULES}


def expand(values: Iterable[str], option: str) -> set[str]:
    """The codes a list of codes or prefixes names; an unknown one raises with the fix."""
    out: set[str] = set()
    for raw in values:
        value = raw.strip().upper()
        if not value:
            continue
        hit = set(CODES) if value == "ALL" else {c for c in CODES if c.startswith(value)}
        if not hit:
            raise BadInputError(
                f"{option} got an unknown rule code {raw!r}.{closest(value, list(CODES))} "
                f"Known codes: {', '.join(CODES)} (a prefix such as MF00, or ALL, also works)."
            )
        out |= hit
    return out


def selected(
    select: Iterable[str] | None,
    ignore: Iterable[str] | None,
    options: tuple[str, str] = ("select", "ignore"),
) -> tuple[Rule, ...]:
    """The rules `select` (all when None) names, less those `ignore` names, in code order.
    `options` names the two in an error message (`--select` for the CLI)."""
    chosen = expand(select, options[0]) if select is not None else set(CODES)
    chosen -= expand(ignore or (), options[1])
    return tuple(r for r in RULES if r.code in chosen)
