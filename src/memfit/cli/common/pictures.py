"""`--timeline` and `--snapshot`: the pictures `estimate` and `profile` both draw of a profile."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import typer

from memfit.errors import BadInputError
from memfit.report.memory_viz import to_memory_viz
from memfit.report.timeline import render_png


def check_picture_paths(timeline: Path | None, snapshot: Path | None) -> None:
    """Say what is wrong with `--timeline` or `--snapshot` before any work is done, not after
    a long estimate or a training run: a timeline is drawn as PNG or HTML, and both files go
    into a folder that exists."""
    if timeline is not None and timeline.suffix.lower() not in (".png", ".html", ".htm"):
        raise BadInputError(f"--timeline {str(timeline)!r}: the file must end in .png or .html.")
    for flag, path, example in (
        ("--timeline", timeline, "memory.html"),
        ("--snapshot", snapshot, "memory.pickle"),
    ):
        if path is None:
            continue
        folder = path.parent
        if path.is_dir():
            raise BadInputError(
                f"{flag} {str(path)!r} is a folder; give a file name in it, e.g. "
                f"{str(path / example)!r}."
            )
        if not folder.is_dir():
            raise BadInputError(
                f"{flag} {str(path)!r}: the folder {str(folder)!r} does not exist. Create it "
                f"(mkdir -p {folder}) or write the file elsewhere."
            )
        _check_writable(flag, path, folder)


def _check_writable(flag: str, path: Path, folder: Path) -> None:
    """A file can be made in `folder` (a folder such as /proc, or one without write permission,
    refuses it); tried with a temporary file that is removed at once, so nothing is left when
    the later work fails."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".memfit-check-"):
            pass
    except OSError as e:
        raise BadInputError(
            f"{flag} {str(path)!r}: no file can be written in {str(folder)!r} "
            f"({e.strerror or e}). Write it to a folder of yours, e.g. ./{path.name}."
        ) from None


def write_pictures(
    profile: Any, timeline: Path | None, snapshot: Path | None, *, config: Any = None
) -> None:
    """Render the timeline (.png or .html) and the memory_viz snapshot when asked (`config`:
    the AllocatorConfig the estimate simulated, for the snapshot's segments)."""
    check_picture_paths(timeline, snapshot)
    if timeline is not None:
        suffix = timeline.suffix.lower()
        if suffix == ".png":
            render_png(profile, timeline)
        elif suffix in (".html", ".htm"):
            # Here, not at the top: this module imports torch, which `memfit --help` must not.
            from memfit.report.timeline_html import render_html

            render_html(profile, timeline)
        where = "a browser" if suffix != ".png" else "an image viewer"
        typer.echo(f"wrote the memory timeline to {timeline} (open it in {where})", err=True)
    if snapshot is not None:
        to_memory_viz(profile, snapshot, config=config)
        said_snapshot(snapshot)


def said_snapshot(snapshot: Path) -> None:
    """Say where a memory_viz snapshot was written (on stderr: stdout may be JSON)."""
    typer.echo(
        f"wrote the memory snapshot to {snapshot} (drag it onto pytorch.org/memory_viz)",
        err=True,
    )
