"""The repository layout of DESIGN.md §1: one import root, parts in top-level folders, one-way deps."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import edged.daemon
import edged.deploy
import edged.models
import edged.quantize

from .conftest import REPO


def test_parts_come_from_their_top_level_folders() -> None:
    for mod, folder in [
        (edged.daemon, "daemon"),
        (edged.models, "models"),
        (edged.quantize, "quantize"),
        (edged.deploy, "deploy"),
    ]:
        assert Path(mod.__file__ or "").resolve().parent == REPO / folder


def _imports(folder: Path) -> set[str]:
    found: set[str] = set()
    for py in folder.rglob("*.py"):
        tree = ast.parse(py.read_text(), str(py))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
    return found


def test_daemon_source_never_imports_build_tools() -> None:
    bad = {m for m in _imports(REPO / "daemon") if m.startswith(("edged.quantize", "edged.deploy"))}
    assert not bad, f"edged.daemon imports {bad}"


def test_models_imports_nothing_of_ours_but_errors() -> None:
    ours = {m for m in _imports(REPO / "models") if m.startswith("edged.") and not m.startswith("edged.models")}
    assert ours <= {"edged.errors"}, ours


def test_importing_every_daemon_module_loads_no_build_tools() -> None:
    modules = sorted(m for m in _modules() if m.startswith("edged.daemon."))  # the backends and decoders too
    code = (
        "import sys, importlib\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "bad = [m for m in sys.modules if m == 'onnx' or m.startswith(('edged.quantize', 'edged.deploy', 'onnx.'))]\n"
        "print(len(sys.modules)); sys.exit(1 if bad else 0)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_operator_tools_load_no_device_runtime() -> None:
    """`edged watch` and `edged push` send and read bytes: no OpenCV or ONNX Runtime (STYLE.md)."""
    code = (
        "import sys, edged.daemon.watch, edged.push\n"
        "bad = [m for m in ('cv2', 'onnxruntime', 'tensorrt') if m in sys.modules]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def _parts() -> dict[str, Path]:
    """`edged` and each part it is installed from: import name -> folder (pyproject's package-dir)."""
    parts = {"edged": REPO / "edged"}
    for folder in sorted(REPO.iterdir()):
        init = folder / "__init__.py"
        if folder.name == "edged" or not init.is_file():
            continue
        spec = importlib.util.find_spec(f"edged.{folder.name}")
        if spec is not None and spec.origin is not None and Path(spec.origin).resolve() == init.resolve():
            parts[f"edged.{folder.name}"] = folder
    return parts


def _modules() -> dict[str, Path]:
    """Every module of ours: dotted name -> file."""
    found: dict[str, Path] = {}
    for root, folder in _parts().items():
        for py in sorted(folder.rglob("*.py")):
            rel = list(py.relative_to(folder).with_suffix("").parts)
            if rel[-1] == "__init__":
                rel.pop()
            found[".".join([root, *rel])] = py
    return found


def _import_time_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """What runs when a module is imported: its body, into `if`/`try`/`with` and class bodies, not into
    functions (a lazy import inside one is allowed) nor `if TYPE_CHECKING:` (never runs)."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If):
            test = node.test
            if not (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") and not (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
            ):
                out += _import_time_statements(node.body)
            out += _import_time_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for part in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                out += _import_time_statements(part)
        elif isinstance(node, ast.With | ast.ClassDef):
            out += _import_time_statements(node.body)
    return out


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports at import time."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, py in modules.items():
        package = name if py.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _import_time_statements(ast.parse(py.read_text(), str(py)).body):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                mod = ".".join(base + ([node.module] if node.module else []))
                targets.add(mod)
                targets.update(f"{mod}.{a.name}" for a in node.names)  # `from . import x`: module x
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_import_graph_finds_a_loop() -> None:
    """The checker below, on a made-up graph: a loop of three is found, a diamond is none."""
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) is None


def test_no_import_loops_among_our_modules() -> None:
    """No module of ours imports itself round a loop at import time (an import inside a function is lazy
    and allowed: the factory in edged.daemon.backends opens the TensorRT backend that way)."""
    graph = _import_graph()
    assert "edged.daemon.backends.tensorrt" in graph and "edged.daemon.app" in graph, sorted(graph)
    assert "edged.daemon.backends.base" in graph["edged.daemon.backends.tensorrt"]
    cycle = _find_cycle(graph)
    assert cycle is None, "import loop: " + " -> ".join(cycle or [])
