"""The house rules the code's shape must keep: imports only go down the floors (stats, data -> engine
-> schemes/models -> training/planning -> experiments/localize -> api/report/paper -> explore -> cli), no
module or package imports itself round a circle, no file over 450 lines and no folder over 15
modules, and every file docs/architecture.md names exists. Imports are read from the source
(``ast``), function-level and ``TYPE_CHECKING`` ones included, and the lazy export tables
(``_EXPORTS``) count as imports of the modules they name."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PACKAGE = "weightgraft"

# Floors, low to high. A module may import its own floor and the floors below.
FLOORS: dict[str, int] = {
    "stats": 0, "data": 0, "resume": 0, "paper": 5, "engine": 1, "schemes": 2, "models": 2, "training": 3, "planning": 3,
    "experiments": 4, "localization": 4, "expert_maps": 4, "api": 5, "report": 5, "explore": 6, "cli": 7,
}
# The top-level modules: lazy.py, runtime.py, errors.py (the errors' root), atomic.py (atomic
# file writes) and devices.py (whether a named device is here) import nothing of ours (the lowest floor); configfile.py reads config files for
# experiments and localization alike (the models floor: it reads model specs);
# __init__.py is the notebook's front door (the api floor: it exports api, schemes, engine,
# models and localize names); demo.py runs data -> train -> run -> report (the report floor);
# entry.py and __main__.py start the CLI (its floor).
TOP_LEVEL: dict[str, int] = {
    f"{PACKAGE}.lazy": 0, f"{PACKAGE}.runtime": 0, f"{PACKAGE}.errors": 0, f"{PACKAGE}.atomic": 0, f"{PACKAGE}.devices": 0, f"{PACKAGE}.configfile": 2, PACKAGE: 5, f"{PACKAGE}.demo": 5,
    f"{PACKAGE}.entry": 7, f"{PACKAGE}.__main__": 7,
}
MAX_LINES, MAX_MODULES = 450, 15
# Edges known to break a rule, each with the change that removes it. The test fails when one
# no longer exists, so the entry goes with the fix.
PENDING: dict[tuple[str, str], str] = {}
PENDING_LONG: dict[str, str] = {}


def module_files(src: Path = SRC) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (``pkg/__init__.py`` is ``pkg``)."""
    out = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _target(name: str, known: set[str]) -> str | None:
    """The module of ours that importing ``name`` runs: itself, or the nearest package above it."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, tree: ast.AST, known: set[str], is_package: bool) -> set[str]:
    """The modules of ours that ``module`` imports anywhere in its body."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import sub`` imports the submodule when there is one
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in targets) and node.value is not None:
                names = [c.value for c in ast.walk(node.value)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value.startswith(f"{PACKAGE}.")]
        for name in names:
            if name == PACKAGE or name.startswith(f"{PACKAGE}."):
                hit = _target(name, known)
                if hit is not None and hit != module:
                    found.add(hit)
    return found


def import_table(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports."""
    files = module_files(src)
    known = set(files)
    return {m: imports_of(m, ast.parse(p.read_text(encoding="utf-8")), known, p.name == "__init__.py")
            for m, p in files.items()}


def floor_of(module: str) -> int:
    if module in TOP_LEVEL:
        return TOP_LEVEL[module]
    top = module.split(".")[1]
    if top not in FLOORS:
        raise KeyError(f"{module} sits on no floor: add its package to FLOORS or the module to TOP_LEVEL")
    return FLOORS[top]


def upward(table: Mapping[str, set[str]]) -> list[str]:
    """Every import from a lower floor to a higher one."""
    return sorted(f"{a} (floor {floor_of(a)}) imports {b} (floor {floor_of(b)})"
                  for a, targets in table.items() for b in targets if floor_of(b) > floor_of(a))


def package_of(module: str) -> str:
    """The package a module belongs to, for the package-level graph (top-level modules stand alone)."""
    return module if module in TOP_LEVEL else ".".join(module.split(".")[:2])


def cycles(table: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    nodes = sorted(set(table) | {b for t in table.values() for b in t})

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(table.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in nodes:
        if v not in index:
            visit(v)
    return sorted(found)


def package_table(table: Mapping[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for a, targets in table.items():
        pa = package_of(a)
        out.setdefault(pa, set()).update(package_of(b) for b in targets if package_of(b) != pa)
    return out


# ---------------------------------------------------------------- the checker can fail

SYNTHETIC = {
    "weightgraft.data.worlds": set(),
    "weightgraft.engine.forward": {"weightgraft.data.worlds"},
    "weightgraft.schemes.scheme": {"weightgraft.engine.forward", "weightgraft.models.loading"},
    "weightgraft.models.loading": {"weightgraft.schemes.scheme"},
    "weightgraft.api.graft": {"weightgraft.schemes.scheme"},
}


def test_checker_finds_a_planted_upward_import_and_cycles():
    assert upward(SYNTHETIC) == [] and cycles(SYNTHETIC) != []
    planted = {**SYNTHETIC, "weightgraft.engine.forward": {"weightgraft.api.graft"}}
    assert upward(planted) == ["weightgraft.engine.forward (floor 1) imports weightgraft.api.graft (floor 5)"]
    # schemes <-> models: a circle of modules and of packages on one floor
    assert cycles(SYNTHETIC) == [["weightgraft.models.loading", "weightgraft.schemes.scheme"]]
    assert cycles(package_table(SYNTHETIC)) == [["weightgraft.models", "weightgraft.schemes"]]
    acyclic = {**SYNTHETIC, "weightgraft.models.loading": set()}
    assert cycles(acyclic) == [] and cycles(package_table(acyclic)) == []


def test_checker_reads_function_level_relative_and_lazy_imports(tmp_path):
    pkg = tmp_path / PACKAGE
    for sub in ("engine", "api", "data"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text('_EXPORTS = {"graft": ("weightgraft.api.graft", "graft")}\n')
    (pkg / "data" / "spans.py").write_text("")
    (pkg / "data" / "worlds.py").write_text("from .spans import x\nfrom . import spans\n")
    (pkg / "api" / "graft.py").write_text("")
    (pkg / "engine" / "forward.py").write_text("def f():\n    from weightgraft.api import graft\n")
    table = import_table(tmp_path)
    assert table["weightgraft.data.worlds"] == {"weightgraft.data.spans"}
    assert table["weightgraft"] == {"weightgraft.api.graft"}
    assert upward(table) == ["weightgraft.engine.forward (floor 1) imports weightgraft.api.graft (floor 5)"]


# ---------------------------------------------------------------- the house itself

@pytest.fixture(scope="module")
def table() -> dict[str, set[str]]:
    """The house's import table, less the :data:`PENDING` edges (each checked to still exist)."""
    found = import_table()
    for (a, b), why in PENDING.items():
        assert b in found.get(a, set()), f"{a} no longer imports {b}: remove its PENDING entry ({why})"
        found[a] = found[a] - {b}
    return found


def test_every_module_sits_on_a_floor(table):
    for module in table:
        floor_of(module)


def test_no_import_goes_up_a_floor(table):
    assert upward(table) == []


def test_no_module_or_package_imports_round_a_circle(table):
    assert cycles(table) == []
    assert cycles(package_table(table)) == []


def test_no_file_over_450_lines_and_no_folder_over_15_modules():
    files = module_files()
    long = {str(p.relative_to(ROOT)): n for p in files.values()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    for path, why in PENDING_LONG.items():
        assert path in long, f"{path} is no longer over {MAX_LINES} lines: remove its PENDING_LONG entry ({why})"
        del long[path]
    assert long == {}, f"over {MAX_LINES} lines: {long}"
    folders: dict[Path, int] = {}
    for p in files.values():
        if p.name != "__init__.py":  # a package's __init__ is the package, not one of its modules
            folders[p.parent] = folders.get(p.parent, 0) + 1
    crowded = {str(f.relative_to(ROOT)): n for f, n in folders.items() if n > MAX_MODULES}
    assert crowded == {}, f"over {MAX_MODULES} modules: {crowded}"


def test_every_file_docs_architecture_names_exists():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:src|tests|docs|benchmarks|configs)/[\w./-]+\.(?:py|md|yaml|js|html))`", text))
    assert len(named) >= 10
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert missing == []
