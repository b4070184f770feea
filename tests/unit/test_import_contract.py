"""Architecture contracts that keep the layers honest."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
    offenders = [str(p.relative_to(ROOT)) for d in ("edgespec", "tui")
                 for p in (ROOT / d).rglob("*.py")
                 if "llama_cpp" in _imports(p) and p != ROOT / "edgespec" / "backend.py"]
    assert offenders == []


def test_tui_does_not_reach_into_ctypes_or_the_backend():
    for p in (ROOT / "tui").rglob("*.py"):
        src = p.read_text(encoding="utf-8")
        assert "ctypes" not in _imports(p), p
        assert "edgespec.backend" not in src, p
