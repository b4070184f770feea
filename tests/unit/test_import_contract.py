"""Architecture contracts that keep the layers honest (docs/architecture.md)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "edgespec"
BACKEND = PKG / "runtime" / "backend.py"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_llama_cpp_is_imported_by_the_backend_only():
    offenders = [str(p.relative_to(ROOT)) for p in PKG.rglob("*.py")
                 if "llama_cpp" in _imports(p) and p != BACKEND]
    assert offenders == []
    assert "llama_cpp" in _imports(BACKEND)


def test_tui_does_not_reach_into_ctypes_or_the_backend():
    for p in (PKG / "tui").rglob("*.py"):
        src = p.read_text(encoding="utf-8")
        assert "ctypes" not in _imports(p), p
        assert "edgespec.runtime.backend" not in src, p


# --- the module graph -----------------------------------------------------------------------
def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(pkg: Path = PKG) -> dict[str, Path]:
    mods = {_module_name(p): p for p in pkg.rglob("*.py")}
    # compiled extensions are modules too (edgespec._native: its stub stands for it)
    mods.update({_module_name(p): p for p in pkg.rglob("*.pyi") if _module_name(p) not in mods})
    return mods


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _edges(name: str, path: Path, mods: dict[str, Path], type_checking: bool) -> dict[str, int]:
    """Every edgespec module ``name`` imports -> the first line that does: imports anywhere
    (module level, inside functions and classes), relative ones resolved; ``from pkg import x``
    is an edge to ``pkg.x`` when that is a module, else to ``pkg``. Imports under
    ``if TYPE_CHECKING:`` never run; they are edges only when ``type_checking``."""
    if path.suffix != ".py":
        return {}
    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: dict[str, int] = {}

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for a in node.names:
                out.setdefault(a.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                target = ".".join(parts + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.setdefault(sub if sub in mods else target, node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {m: line for m, line in out.items() if m in mods and m != name}


def _graph(type_checking: bool = False) -> dict[str, dict[str, int]]:
    mods = _modules()
    return {m: _edges(m, p, mods, type_checking) for m, p in mods.items()}


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _describe(graph: dict[str, dict[str, int]], comp: list[str]) -> str:
    members = set(comp)
    return "\n".join(f"  {m}:{line} imports {t}" for m in comp
                     for t, line in sorted(graph[m].items()) if t in members)


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}, "e": {}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b": 1}, "b": {}}) == []


def test_no_import_cycle_among_edgespec_modules():
    # Imports inside functions count: a deferred import still makes a cycle, it only hides
    # it from the interpreter. Package __init__ re-exports count too.
    graph = _graph()
    cycles = _cycles(graph)
    assert not cycles, "import cycles among edgespec modules:\n" + "\n\n".join(
        f"{' <-> '.join(c)}\n{_describe(graph, c)}" for c in cycles)


def test_no_import_cycle_counting_type_checking_imports():
    # An import under `if TYPE_CHECKING:` never runs, but it is still an arrow a reader and
    # mypy follow: two modules that name each other's types are one module in two files.
    graph = _graph(type_checking=True)
    cycles = _cycles(graph)
    assert not cycles, "import cycles among edgespec modules, TYPE_CHECKING included:\n" + \
        "\n\n".join(f"{' <-> '.join(c)}\n{_describe(graph, c)}" for c in cycles)


#: The floors of the package, bottom up (docs/architecture.md): a module imports its own
#: floor and the floors below, never a higher one, TYPE_CHECKING imports included. "" is
#: the package's face, edgespec/__init__.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors", "paths", "_version", "_native", "statefile"),
    ("api",),            # the neutral types
    ("runtime",),        # the llama.cpp boundary
    ("decoding",),       # pure pieces: sampling, verify, trees, KV prefixes, text
    ("grammar", "proposers"),
    ("registry",),
    ("identity",),       # the release identity: it reads the registry's digests
    ("calibration", "chat"),
    ("control", "agents"),
    ("config",),         # EngineConfig: what the planner and the engine read
    ("loop",),           # one request's loop: drives proposers and the controller
    ("planner",),
    ("engine",),
    ("serving",),
    ("protocol",),
    ("apps",),
    ("server", "tui"),
    ("cli", ""),
)
#: the lab measures the product from beside it: it stands on the engine (and everything
#: below), and only the front ends above it (the CLI) import it
LAB = ("lab",)
LAB_STANDS_ON = "engine"


def _package(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def _floor(pkg: str) -> float:
    """The package's floor; one that has none is test_every_package_has_a_floor's to report."""
    if pkg in LAB:
        return next(i for i, f in enumerate(FLOORS) if LAB_STANDS_ON in f) + 0.5
    return next((i for i, f in enumerate(FLOORS) if pkg in f), -1)


def _upward(graph: dict[str, dict[str, int]]) -> list[str]:
    front = min(i for i, f in enumerate(FLOORS) if "server" in f)
    found = []
    for m, edges in sorted(graph.items()):
        a = _package(m)
        for t, line in sorted(edges.items()):
            b = _package(t)
            if a == b:
                continue
            # a product floor between the lab and the front ends is not under the lab
            beside = b in LAB and a not in LAB and _floor(a) < front
            if _floor(b) > _floor(a) or beside:
                found.append(f"{m}:{line} imports {t} (floor {a or 'edgespec'} < {b})")
    return found


def test_every_package_has_a_floor():
    packages = {_package(m) for m in _modules()}
    placed = {p for f in FLOORS for p in f} | set(LAB)
    assert sorted(packages - placed) == [], "place the new package in FLOORS"
    assert sorted(placed - packages) == [], "FLOORS names a package that is gone"


def test_no_module_imports_a_higher_floor():
    upward = _upward(_graph(type_checking=True))
    assert upward == [], "imports that point up a floor:\n" + "\n".join(upward)


def test_the_floor_check_finds_an_upward_import():
    graph = {"edgespec.runtime.model": {"edgespec.engine.engine": 3},
             "edgespec.engine.engine": {"edgespec.runtime.model": 1},
             "edgespec.serving.pool": {"edgespec.lab.bench": 7},
             "edgespec.cli.bench": {"edgespec.lab.bench": 2},
             "edgespec.lab.bench": {"edgespec.engine.engine": 5}}
    assert _upward(graph) == [
        "edgespec.runtime.model:3 imports edgespec.engine.engine (floor runtime < engine)",
        "edgespec.serving.pool:7 imports edgespec.lab.bench (floor serving < lab)"]


def _offenders(prefix: str, allowed: tuple[str, ...], graph) -> list[str]:
    def ok(target: str) -> bool:
        return any(target == a or target.startswith(a + ".") for a in allowed)
    return [f"{m}:{line} imports {t}" for m, edges in sorted(graph.items())
            if m == prefix or m.startswith(prefix + ".")
            for t, line in sorted(edges.items()) if not ok(t)]


def test_api_imports_nothing_of_edgespec_but_errors():
    graph = _graph(type_checking=True)
    assert _offenders("edgespec.api", ("edgespec.api", "edgespec.errors"), graph) == []


def test_the_runtime_imports_nothing_above_it():
    below = ("edgespec.runtime", "edgespec.api", "edgespec.errors", "edgespec.paths",
             "edgespec._version", "edgespec._native")
    assert _offenders("edgespec.runtime", below, _graph(type_checking=True)) == []


def test_the_core_does_not_import_the_adapters():
    adapters = ("edgespec.cli", "edgespec.server")
    graph = _graph(type_checking=True)
    offenders = [f"{m}:{line} imports {t}" for m, edges in sorted(graph.items())
                 if not m.startswith(adapters)
                 for t, line in sorted(edges.items()) if t.startswith(adapters)]
    assert offenders == []
    # the TUI is a front end too, inside the package: only edgespec.cli starts it
    tui = [f"{m}:{line} imports {t}" for m, edges in sorted(graph.items())
           if not m.startswith(("edgespec.cli", "edgespec.tui"))
           for t, line in sorted(edges.items()) if t == "edgespec.tui" or t.startswith("edgespec.tui.")]
    assert tui == []
    assert any(t.startswith("edgespec.tui") for t in graph["edgespec.cli.tui"])  # it is looked at


def test_the_package_root_stays_small():
    root = sorted(p.name for p in PKG.glob("*.py"))
    assert len(root) <= 8, root


def test_unit_tests_mirror_the_package():
    """tests/unit/<package>/ holds the unit tests of edgespec/<package>/, so a module's tests
    are found where the module is; only the contracts of the whole package sit at the top."""
    unit = ROOT / "tests" / "unit"
    folders = sorted(p.name for p in unit.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert [f for f in folders if not (PKG / f / "__init__.py").is_file()] == []
    assert sorted(p.name for p in unit.glob("test_*.py")) == ["test_import_contract.py"]


def _uncommented_deferred_imports(path: Path) -> list[int]:
    """Imports inside functions with no comment on them or just above their run of imports."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for fn in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            first = node.lineno - 1
            while first > 0 and lines[first - 1].strip().startswith(("import ", "from ")):
                first -= 1  # a run of imports shares one comment
            said = lines[max(0, first - 3):first] + lines[node.lineno - 1:node.end_lineno]
            if not any("#" in line for line in said):
                found.append(node.lineno)
    return found


def test_every_deferred_import_says_why():
    """An import inside a function is there for a reason (start-up time, an optional extra, a
    platform) that the next reader needs; one with no comment is a hidden cycle or an
    accident, and belongs at the top of its module."""
    offenders = [f"{p.relative_to(ROOT)}:{line}" for p in sorted(PKG.rglob("*.py"))
                 for line in _uncommented_deferred_imports(p)]
    assert offenders == []


def test_the_deferred_import_check_finds_a_bare_one(tmp_path):
    bare = tmp_path / "m.py"
    bare.write_text("import os\n\n\ndef f():\n    import json\n    return json\n")
    said = tmp_path / "n.py"
    said.write_text("def f():\n    # deferred: slow to import\n    import json\n    return json\n")
    assert _uncommented_deferred_imports(bare) == [5]
    assert _uncommented_deferred_imports(said) == []
