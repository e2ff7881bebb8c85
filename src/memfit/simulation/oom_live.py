"""What held the memory when a measured loop ran out of it.

Under `memfit.simulate` the error carries the simulated allocator's state, and
`memfit.simulation.oom.explain_oom` says which change would have fitted. On a real GPU the error
carries nothing but a message (which memfit does not parse); what the tracker of
`memfit.measure` saw alive at that moment is reported instead: by category, by module, the
largest tensors, and how to find a configuration that fits.
"""

from __future__ import annotations

from collections import defaultdict

from memfit.cuda.allocator_config import cuda_block_size
from memfit.events import Event, StorageRecord
from memfit.profile import live_sids
from memfit.report.text import grouped_modules
from memfit.simulation.oom import explain_oom, render_oom
from memfit.units import format_bytes


def explain_live(
    error: BaseException, records: dict[int, StorageRecord], events: list[Event], *, top_n: int = 8
) -> str:
    """A report of the OOM `error`: explain_oom's when simulated, else the tracker's live set."""
    if getattr(error, "memfit_oom", None) is not None:
        return render_oom(explain_oom(error))

    recs = [records[s] for s in live_sids(events) if not records[s].host]
    by_cat: dict[str, int] = defaultdict(int)
    by_mod: dict[str, int] = defaultdict(int)
    for r in recs:
        by_cat[r.category] += cuda_block_size(r.nbytes)
        by_mod[r.module or "<top>"] += cuda_block_size(r.nbytes)
    total = sum(by_cat.values())
    where = events[-1] if events else None
    lines = [f"memfit: out of memory with {format_bytes(total)} of tensors alive"]
    if where is not None:
        lines[0] += f" (last seen: {where[2]} of step {where[3]}, op {where[4]})"
    lines.append("by category:")
    for cat, b in sorted(by_cat.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {cat:<20}{format_bytes(b):>14}")
    lines.append("by module:")
    for mod, b in list(grouped_modules(dict(by_mod)).items())[:top_n]:
        lines.append(f"  {mod:<40}{format_bytes(b):>14}")
    lines.append("largest tensors:")
    for r in sorted(recs, key=lambda r: -r.nbytes)[:top_n]:
        lines.append(
            f"  {format_bytes(cuda_block_size(r.nbytes)):>12}  {r.category:<16} "
            f"{r.module or '<top>'}  ({r.op}, {r.phase})"
        )
    lines.append(
        "to find what fits: `memfit plan MODEL --gpu NAME` (or rerun the loop under "
        "memfit.simulate(gpu=...) on a CPU for the smallest change)."
    )
    return "\n".join(lines)
