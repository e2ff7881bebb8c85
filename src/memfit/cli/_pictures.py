"""`--timeline` and `--snapshot`: the pictures `estimate` and `profile` both draw of a profile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memfit.errors import BadInputError
from memfit.report.memory_viz import to_memory_viz
from memfit.report.timeline import render_png


def check_timeline_path(timeline: Path | None) -> None:
    """A timeline is drawn as PNG or HTML; say so before any work is done."""
    if timeline is not None and timeline.suffix.lower() not in (".png", ".html", ".htm"):
        raise BadInputError(f"--timeline {str(timeline)!r}: the file must end in .png or .html.")


def write_pictures(
    profile: Any, timeline: Path | None, snapshot: Path | None, *, config: Any = None
) -> None:
    """Render the timeline (.png or .html) and the memory_viz snapshot when asked (`config`:
    the AllocatorConfig the estimate simulated, for the snapshot's segments)."""
    check_timeline_path(timeline)
    if timeline is not None:
        suffix = timeline.suffix.lower()
        if suffix == ".png":
            render_png(profile, timeline)
        elif suffix in (".html", ".htm"):
            # Here, not at the top: this module imports torch, which `memfit --help` must not.
            from memfit.report.timeline_html import render_html

            render_html(profile, timeline)
    if snapshot is not None:
        to_memory_viz(profile, snapshot, config=config)
