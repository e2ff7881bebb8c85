"""Traces kept for reuse: in this process, and on disk between processes.

A trace is a pure function of what built and ran it: the model (its config and head), the
workload (every field but the GPU's name and the host's RAM, which only the accounting after
the trace reads), the GPU's class of compute capability (it picks the attention kernel:
memfit.estimator.trace.attention.attention_class), and the code:
memfit's own source, Python, torch, transformers, peft, bitsandbytes, torchao and accelerate.
The key is a SHA-256 of all of them, so an edit to memfit or an upgrade of transformers misses the
cache instead of reading a stale trace. A model memfit cannot name that way (an `nn.Module`
passed in, a factory's model, a model with a `make_batch`) is never cached.

Where: `$MEMFIT_CACHE_DIR`, else `$XDG_CACHE_HOME/memfit`, else `~/.cache/memfit`; traces in
`traces/`, plans in `plans/` (one file each, at most `MEMFIT_CACHE_MAX_BYTES`, default 2 GiB,
in all: the oldest go first). Off: `MEMFIT_NO_CACHE=1`, the CLI's `--no-cache`, or
`with caching(False):` (`MEMFIT_NO_CACHE=0`, or unset, leaves it on). `memfit cache` shows
the location and size; `memfit cache --clear` empties it. A file that cannot be read back
(written by another Python, cut short) is a miss and is removed.

The entries are stored in a compact form (events and records as plain tuples), which loads
about five times faster than pickling the objects themselves: a cached llama-2-7b step of
50k events loads in about 0.05 s.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import io
import json
import os
import pickle
import sys
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from memfit.errors import BadInputError
from memfit.estimator.parallel import jobs_asked
from memfit.events import Category, Event, StorageRecord

#: Packages whose code runs in a trace; their versions are part of every key.
TRACED_PACKAGES = ("transformers", "peft", "bitsandbytes", "torchao", "accelerate")

#: Entries kept in this process (the planner reuses traces across GPUs and stages).
MEMORY_ENTRIES = 64

DEFAULT_MAX_BYTES = 2 * 1024**3

_FORMAT = 1  # bump when the stored form changes

_enabled: bool | None = None  # None: read MEMFIT_NO_CACHE
_memory: OrderedDict[str, Any] = OrderedDict()
_session: dict[str, Any] | None = None  # see session()
_code_digest: str | None = None


def cache_dir() -> Path:
    """Where the on-disk cache lives (see the module docstring)."""
    if os.environ.get("MEMFIT_CACHE_DIR"):
        return Path(os.environ["MEMFIT_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "memfit"


#: MEMFIT_NO_CACHE's values, lower-cased: the cache off, or on.
_OFF, _ON = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def enabled() -> bool:
    """Whether traces are cached: `caching()` decides, else MEMFIT_NO_CACHE (1, true, yes,
    on: off; unset, empty, 0, false, no, off: on; another value is refused)."""
    if _enabled is not None:
        return _enabled
    text = os.environ.get("MEMFIT_NO_CACHE", "").strip().lower()
    if text not in _OFF + _ON:
        raise BadInputError(
            f"MEMFIT_NO_CACHE={os.environ['MEMFIT_NO_CACHE']!r} is neither on nor off: give 1 "
            "to turn the cache off, 0 (or unset it) to keep it on."
        )
    return text in _ON


@contextlib.contextmanager
def caching(on: bool) -> Iterator[None]:
    """Turn the cache on or off (both layers) inside the block."""
    global _enabled
    before = _enabled
    _enabled = on
    try:
        yield
    finally:
        _enabled = before


def set_enabled(on: bool | None) -> None:
    """Turn the cache on or off for the rest of the process (None: back to MEMFIT_NO_CACHE).
    The CLI's `--no-cache` calls this."""
    global _enabled
    _enabled = on


def forget() -> None:
    """Drop what this process keeps in memory (the disk stays)."""
    _memory.clear()


def code_digest() -> str:
    """A digest of memfit's source and the versions of the packages a trace runs."""
    global _code_digest
    if _code_digest is None:
        h = hashlib.sha256()
        root = Path(__file__).resolve().parents[2]
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
        h.update(f"python={sys.version}".encode())
        for name in ("torch", *TRACED_PACKAGES):
            try:
                version = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                version = "absent"
            h.update(f"{name}={version}".encode())
        _code_digest = h.hexdigest()
    return _code_digest


def key_of(kind: str, *parts: Any) -> str:
    """The key of an entry of `kind` ("trace", "plan") made from `parts` (their reprs, which
    for memfit's frozen dataclasses list every field) and the code digest."""
    text = json.dumps([_FORMAT, kind, code_digest(), [repr(p) for p in parts]])
    return hashlib.sha256(text.encode()).hexdigest()


@contextlib.contextmanager
def session() -> Iterator[None]:
    """Within the block, entries are kept in memory even with the cache off (and dropped at
    its end): one plan reuses its own traces (the replay check of its recommendation, the
    donors of composed optimizers) whatever the cache holds between processes."""
    global _session
    if _session is not None:
        yield
        return
    _session = {}
    try:
        yield
    finally:
        _session = None


def lookup(kind: str, key: str | None, unpack: Callable[[Any], Any]) -> Any:
    """The entry stored under `key`, or None (a miss, the cache off, or no key)."""
    if key is not None and not enabled() and _session is not None and key in _session:
        return unpack(_session[key])
    if key is None or not enabled():
        return None
    if key in _memory:
        _memory.move_to_end(key)
        return unpack(_memory[key])
    path = cache_dir() / f"{kind}s" / f"{key}.pkl"
    try:
        with path.open("rb") as f:
            packed = pickle.load(f)
    except FileNotFoundError:
        return None
    except Exception:  # cut short, another Python's pickle, a class that moved: a miss
        path.unlink(missing_ok=True)
        return None
    _remember(key, packed)
    return unpack(packed)


def store(kind: str, key: str | None, packed: Any) -> None:
    """Keep `packed` (already in its stored form) under `key`, in memory and on disk. A disk
    that cannot be written (read-only home, full) leaves the memory copy only."""
    if key is not None and not enabled() and _session is not None:
        _session[key] = packed
    if key is None or not enabled():
        return
    _remember(key, packed)
    folder = cache_dir() / f"{kind}s"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(packed, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, folder / f"{key}.pkl")
        _prune(cache_dir())
    except OSError:
        return


def _remember(key: str, packed: Any) -> None:
    _memory[key] = packed
    _memory.move_to_end(key)
    while len(_memory) > MEMORY_ENTRIES:
        _memory.popitem(last=False)


def check_environment() -> None:
    """Read memfit's environment variables now (MEMFIT_NO_CACHE, MEMFIT_CACHE_MAX_BYTES,
    MEMFIT_JOBS), so that a value memfit cannot read is refused before any work, not when a
    trace is first stored or run side by side (`plan` and `estimate` call this first)."""
    enabled()
    max_bytes()
    jobs_asked()


def max_bytes() -> int:
    """MEMFIT_CACHE_MAX_BYTES (a whole number of bytes), else DEFAULT_MAX_BYTES; another value
    is refused (BadInputError), not guessed at."""
    text = os.environ.get("MEMFIT_CACHE_MAX_BYTES", "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    if not (text.isascii() and text.isdigit()):
        raise BadInputError(
            f"MEMFIT_CACHE_MAX_BYTES={text!r} is not a number of bytes: give a whole number "
            f"(e.g. {DEFAULT_MAX_BYTES} for the default 2 GiB; 0 keeps nothing on disk), or "
            "unset it."
        )
    return int(text)


def entries(root: Path | None = None) -> list[tuple[Path, int]]:
    """The cache's files and their sizes, oldest first (another memfit process may be adding
    and removing files meanwhile: one gone before it is read is left out)."""
    root = root or cache_dir()
    found = []
    for p in root.glob("*/*.pkl"):
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        found.append((st.st_mtime, p, st.st_size))
    return [(p, size) for _, p, size in sorted(found)]


def _prune(root: Path) -> None:
    files = entries(root)
    total = sum(size for _, size in files)
    for p, size in files:
        if total <= max_bytes():
            break
        total -= size
        p.unlink(missing_ok=True)


def clear() -> int:
    """Remove every cached file and forget the memory copies; returns the files removed."""
    files = entries()
    for p, _ in files:
        p.unlink(missing_ok=True)
    forget()
    return len(files)


# ----------------------------------------------------------------------------- trace form

_CATEGORY = {c.value: c for c in Category}


def pack_trace(result: tuple[Any, int, bool]) -> tuple[Any, ...]:
    """(Trace, blocks, replayed) as plain tuples, for `store`."""
    tr, n_blocks, replayed = result
    fields = dict(vars(tr))
    events = [tuple(e) for e in fields.pop("events")]
    records = [_record_tuple(r) for r in fields.pop("records").values()]
    return (type(tr), fields, events, records, n_blocks, replayed)


def unpack_trace(packed: tuple[Any, ...]) -> tuple[Any, int, bool]:
    """A fresh (Trace, blocks, replayed) from `pack_trace`'s form: the caller may change it."""
    cls, fields, events, records, n_blocks, replayed = packed
    tr = cls.__new__(cls)
    tr.__dict__.update({k: _fresh(v) for k, v in fields.items()})
    tr.events, tr.records = _events_of(events), _records_of(records)
    return tr, n_blocks, replayed


def dumps_compact(obj: Any) -> bytes:
    """`pickle.dumps(obj)` with every list of events and dict of storage records inside it in
    the compact form (a plan holds several estimates, each with its stream): what
    `pickle.loads` gives back is equal, and loads about five times faster."""
    buffer = io.BytesIO()
    _CompactPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


class _CompactPickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is list and obj and type(obj[0]) is Event:
            return _events_of, ([tuple(e) for e in obj],)
        if type(obj) is dict and obj and type(next(iter(obj.values()))) is StorageRecord:
            return _records_of, ([_record_tuple(r) for r in obj.values()],)
        return NotImplemented


def _record_tuple(r: StorageRecord) -> tuple[Any, ...]:
    return (r.sid, r.nbytes, str(r.category), r.phase, r.step, r.op, r.module, r.owner,
            r.region, r.host, r.paged)  # fmt: skip


def _events_of(rows: list[tuple[Any, ...]]) -> list[Event]:
    return list(map(Event._make, rows))


def _records_of(rows: list[tuple[Any, ...]]) -> dict[int, StorageRecord]:
    return {r[0]: StorageRecord(r[0], r[1], _CATEGORY.get(r[2], r[2]), *r[3:]) for r in rows}


def _fresh(value: Any) -> Any:
    """A copy of a Trace field the caller might change in place (lists, dicts, sets)."""
    if isinstance(value, list | dict | set):
        return type(value)(value)
    return value


def cached_trace(
    key: str | None, run: Callable[[], tuple[Any, int, bool]]
) -> tuple[Any, int, bool]:
    """The trace stored under `key`, else `run()`'s, stored."""
    hit = lookup("trace", key, unpack_trace)
    if hit is not None:
        return hit
    result = run()
    if key is not None and (enabled() or _session is not None):
        store("trace", key, pack_trace(result))  # copies: the caller may change `result`
    return result
