"""The package map of docs/how-it-works.md, enforced: imports go down the floors, never up, and
no module takes part in an import cycle (counting imports inside functions too)."""

from __future__ import annotations

import ast
from pathlib import Path

import memfit

SRC = Path(memfit.__file__).parent

#: Floors, lowest first. A module may import its own floor's modules and any lower floor's.
FLOORS: tuple[tuple[str, ...], ...] = (
    # _compat: the version-dependent behaviour of torch and transformers (STYLE.md), which
    # every floor may need; it imports no memfit module.
    # storage_ledger: the live-storage table that the tracer, the simulated GPU and the doctor
    # are modes over; it imports no memfit module.
    (
        "memfit.errors",
        "memfit.units",
        "memfit.events",
        "memfit._compat",
        "memfit.precision",
        "memfit.storage_ledger",
    ),
    # optimizers: the optimizer table (memfit.optimizers.table), read by every floor above.
    ("memfit.cuda", "memfit.optimizers"),
    ("memfit.workload", "memfit.profile"),
    ("memfit.models",),
    ("memfit.techniques",),
    ("memfit.estimator",),
    ("memfit.report",),
    ("memfit.simulation",),
    ("memfit.measurement",),
    ("memfit.diagnosis", "memfit.lint"),
    ("memfit.guard",),
    ("memfit.planner",),
    ("memfit.data",),
    ("memfit.integrations",),
    ("memfit.cli",),
    ("memfit",),
)

MAX_LINES = 600


def _modules() -> dict[str, Path]:
    out = {}
    for p in SRC.rglob("*.py"):
        parts = ("memfit", *p.relative_to(SRC).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """memfit modules `name` imports anywhere in its file (functions and TYPE_CHECKING too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t.startswith("memfit") and t != name:
                found.add(t)
    return found


def _floor(module: str) -> int:
    best = (-1, -1)  # (length of the matching prefix, floor)
    for i, names in enumerate(FLOORS):
        for n in names:
            if (module == n or module.startswith(n + ".")) and len(n) > best[0]:
                best = (len(n), i)
    assert best[1] >= 0, f"{module} is on no floor of FLOORS; add its package there"
    return best[1]


def test_imports_go_down() -> None:
    mods = _modules()
    upward = [
        f"{m} (floor {_floor(m)}) imports {t} (floor {_floor(t)})"
        for m, p in mods.items()
        for t in sorted(_imports(m, p, set(mods)))
        if _floor(t) > _floor(m) and not m.startswith(t + ".")
    ]
    assert not upward, "\n".join(upward)


def test_no_import_cycles() -> None:
    mods = _modules()
    # A package's __init__ re-exporting its own modules is not an edge of a cycle.
    graph = {
        m: {t for t in _imports(m, p, set(mods)) if not t.startswith(m + ".")}
        for m, p in mods.items()
    }
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append([*stack[stack.index(t) :], t])
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_files_stay_small() -> None:
    big = {
        str(p.relative_to(SRC)): n
        for p in SRC.rglob("*.py")
        if not (p.name.startswith("_") and p.name.endswith("_data.py"))
        and (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not big, f"modules over {MAX_LINES} lines (split them by concern): {big}"


def test_top_level_holds_only_the_shared_vocabulary() -> None:
    top = {p.name for p in SRC.glob("*.py")}
    assert top == {
        "__init__.py", "errors.py", "units.py", "events.py", "profile.py", "_compat.py",
        "precision.py", "storage_ledger.py",
    }  # fmt: skip


#: The most modules a package folder holds beside its __init__ before it needs subfolders.
MAX_MODULES_PER_FOLDER = 15


def test_package_folders_stay_small() -> None:
    crowded = {
        str(d.relative_to(SRC)): n
        for d in [SRC, *(p for p in SRC.rglob("*") if p.is_dir() and p.name != "__pycache__")]
        if (n := len([f for f in d.glob("*.py") if f.name != "__init__.py"]))
        > MAX_MODULES_PER_FOLDER
    }
    assert not crowded, f"folders over {MAX_MODULES_PER_FOLDER} modules (add subfolders): {crowded}"


def test_other_packages_use_the_estimators_public_face() -> None:
    inside = []
    for name, path in _modules().items():
        if name == "memfit.estimator" or name.startswith("memfit.estimator."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            inside += [f"{name} imports {t}" for t in targets if t.startswith("memfit.estimator.")]
    assert not inside, "import these from memfit.estimator:\n" + "\n".join(sorted(inside))
