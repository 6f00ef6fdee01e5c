"""The repository layout of docs/architecture.md: one import root, parts in top-level folders, one-way deps.

The import rules are the page's "What may import what" table, read by tests/architecture_page.py: this file
keeps no copy of them."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import edged.cli
import edged.daemon
import edged.deploy
import edged.models
import edged.protocol
import edged.quantize

from . import architecture_page
from .conftest import REPO

# docs/architecture.md, "What may import what". SHARED: what every part may import (the exception tree, the
# version, the offline tools' progress lines). MAY_IMPORT: for each top-level folder, the `edged.*` modules
# its files may import (a prefix covers its submodules), the folder itself first. WINGS: for each wing of
# daemon/ (edged.daemon.<wing>), the other rooms of daemon/ its files may import besides the wing itself;
# from outside daemon/ a wing may import what MAY_IMPORT["daemon"] allows.
SHARED, _RULES = architecture_page.import_rules()
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    key.split(".")[1]: (key, *allowed) for key, allowed in _RULES.items() if key.count(".") == 1
}
WINGS: dict[str, tuple[str, ...]] = {key: allowed for key, allowed in _RULES.items() if key.count(".") == 2}
# Imports the table forbids that the code still has, each with what removes it. The test fails when a new
# one appears and when one listed here is gone (then delete its line).
KNOWN_VIOLATIONS: dict[tuple[str, str], str] = {}


def test_parts_come_from_their_top_level_folders() -> None:
    for mod, folder in [
        (edged.daemon, "daemon"),
        (edged.models, "models"),
        (edged.quantize, "quantize"),
        (edged.deploy, "deploy"),
        (edged.cli, "cli"),
        (edged.protocol, "protocol"),
    ]:
        assert Path(mod.__file__ or "").resolve().parent == REPO / folder


def test_the_import_root_keeps_only_the_exception_tree_the_version_and_progress() -> None:
    """docs/architecture.md: `edged/` is what every part shares; the `edged` command lives in cli/. `__main__` stays
    for `python -m edged run …` (the tests and the systemd unit use it) and only hands over to edged.cli."""
    found = {p.name for p in (REPO / "edged").iterdir() if p.name != "__pycache__"}
    assert found == {"__init__.py", "__main__.py", "errors.py", "progress.py"}, found
    assert _imports_by_file(REPO / "edged" / "__init__.py", "edged") == set()
    assert _imports_by_file(REPO / "edged" / "errors.py", "edged") == set()
    assert _imports_by_file(REPO / "edged" / "progress.py", "edged") == set()
    assert _imports_by_file(REPO / "edged" / "__main__.py", "edged") == {"edged.cli"}


def _imports_by_file(py: Path, package: str) -> set[str]:
    """The `edged.*` modules one file imports, anywhere in it (inside functions and TYPE_CHECKING too),
    relative imports resolved against `package` (the file's own package)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(py.read_text(), str(py))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            # `from edged.daemon import config`: a name that is a module of ours counts as one
            found.update(f"{module}.{a.name}" for a in node.names if _is_module(f"{module}.{a.name}"))
    return {m for m in found if m == "edged" or m.startswith("edged.")} - {"edged"}


def _is_module(module: str) -> bool:
    """An `edged.*` module or package of this repository (`edged.daemon` is the folder daemon/)."""
    parts = module.split(".")
    if parts[0] != "edged" or len(parts) < 2:
        return False
    path = REPO.joinpath(*parts[1:]) if parts[1] in MAY_IMPORT else REPO.joinpath("edged", *parts[1:])
    return (path / "__init__.py").is_file() or path.with_suffix(".py").is_file()


def _package_of(py: Path) -> str:
    rel = py.relative_to(REPO).with_suffix("").parts
    folder, inner = rel[0], rel[1:-1]
    return ".".join(("edged", folder, *inner)) if folder != "edged" else "edged"


def _covered(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _violations() -> set[tuple[str, str]]:
    bad: set[tuple[str, str]] = set()
    for folder, allowed in MAY_IMPORT.items():
        for py in sorted((REPO / folder).rglob("*.py")) if (REPO / folder).is_dir() else []:
            package = _package_of(py)
            wing = ".".join(package.split(".")[:3]) if folder == "daemon" else ""
            for module in _imports_by_file(py, package):
                outside = not _covered(module, (*allowed, *SHARED))
                # a file of a wing of daemon/ importing another room of daemon/: the wing's row says which
                across = (
                    wing in WINGS and _covered(module, ("edged.daemon",)) and not _covered(module, (wing, *WINGS[wing]))
                )
                if outside or across:
                    bad.add((str(py.relative_to(REPO)), module))
    return bad


def test_the_table_has_a_row_for_every_part_and_every_wing() -> None:
    """A part or a wing without a row would go unchecked: the page's table names each of them."""
    assert {"edged", *(f"edged.{f}" for f in MAY_IMPORT)} == set(_parts()), sorted(MAY_IMPORT)
    wings = {f"edged.daemon.{p.parent.name}" for p in (REPO / "daemon").glob("*/__init__.py")}
    assert wings == set(WINGS), f"wings of daemon/ {sorted(wings)}, rows of the table {sorted(WINGS)}"
    assert SHARED == ("edged.errors", "edged.progress", "edged.__version__"), SHARED
    deeper = [key for key in _RULES if key.count(".") > 2]  # a sub-wing follows its wing's row
    assert not deeper, f"rows for sub-wings, which nothing reads: {deeper}"


def test_each_part_imports_only_what_the_architecture_page_allows() -> None:
    found = _violations()
    new = sorted(found - KNOWN_VIOLATIONS.keys())
    gone = sorted(KNOWN_VIOLATIONS.keys() - found)
    assert not new, f"imports docs/architecture.md forbids (file, module): {new}"
    assert not gone, f"fixed, so delete them from KNOWN_VIOLATIONS: {gone}"


def test_the_rule_checker_sees_relative_and_lazy_imports(tmp_path: Path) -> None:
    """The checker itself: a relative import that leaves the part, and one inside a function, both count."""
    py = tmp_path / "x.py"
    py.write_text("from ..daemon import config\nfrom .sibling import y\ndef f():\n    import edged.quantize.tool\n")
    assert _imports_by_file(py, "edged.deploy") == {"edged.daemon", "edged.daemon.config", "edged.deploy.sibling",
                                                    "edged.quantize.tool"}  # fmt: skip


def test_daemon_source_never_imports_build_tools() -> None:
    bad = {m for m in _imports(REPO / "daemon") if m.startswith(("edged.quantize", "edged.deploy"))}
    assert not bad, f"edged.daemon imports {bad}"


def _imports(folder: Path) -> set[str]:
    return {m for py in folder.rglob("*.py") for m in _imports_by_file(py, _package_of(py))}


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
    """`edged watch` and `edged push` send and read bytes: no OpenCV or ONNX Runtime (STYLE.md). Both the
    modules and the verbs as `main` runs them (each stops at a usage error after its handler's imports)."""
    code = (
        "import sys, edged.cli.watch, edged.deploy.push\n"
        "from edged.cli import main\n"
        "assert main(['push', 'none.tar']) == 2  # no --device or --group\n"
        "assert main(['watch', '--host', '127.0.0.1', '--count', '1']) == 1  # no device id\n"
        "bad = [m for m in ('cv2', 'onnxruntime', 'tensorrt') if m in sys.modules]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_command_line_loads_no_part_until_a_verb_runs() -> None:
    """`edged --help` and the generated CLI reference build the parser only: every verb's handler imports
    its part when it runs, so building the parser loads none of them (nor paho, pydantic, numpy)."""
    code = (
        "import sys\nfrom edged.cli import build_parser\nbuild_parser()\n"
        "parts = ('edged.daemon', 'edged.models', 'edged.quantize', 'edged.deploy', 'edged.protocol')\n"
        "bad = [m for m in sys.modules if m.startswith(parts) or m.split('.')[0] in ('paho', 'pydantic', 'numpy')]\n"
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
                subs = {f"{mod}.{a.name}" for a in node.names} & modules.keys()  # `from . import x`: module x
                targets.update(subs)
                if len(subs) < len(node.names):  # a name defined in the module (or package) itself
                    targets.add(mod)
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


def _all_imports(path: Path) -> set[str]:
    """Absolute module names imported anywhere in a file or folder (inside functions too)."""
    found: set[str] = set()
    for py in [path] if path.is_file() else path.rglob("*.py"):
        for node in ast.walk(ast.parse(py.read_text(), str(py))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
    return found


def test_protocol_imports_nothing_of_ours_but_errors_and_the_version() -> None:
    """The wire contract is the ground both ends stand on: nothing of ours but the exception tree and the
    version, and none of the device runtime's heavy libraries."""
    found = _all_imports(REPO / "protocol")
    ours = {m for m in found if m == "edged" or m.startswith("edged.")}
    assert ours <= {"edged", "edged.errors"}, ours
    heavy = {
        m for m in found if m.split(".")[0] in ("numpy", "cv2", "onnxruntime", "onnx", "tensorrt", "pycuda", "cuda")
    }
    assert not heavy, heavy


def test_operator_tools_import_no_device_runtime_module() -> None:
    """`edged push` and `edged watch` speak edged.protocol, never edged.daemon (docs/architecture.md). The one
    exception: `edged watch --snapshot` draws boxes with the daemon's OpenCV drawing, imported only then."""
    lazy_snapshot_drawing = {"edged.daemon.scene.draw"}
    for py in (REPO / "deploy" / "push.py", REPO / "cli" / "watch.py"):
        daemon = {m for m in _all_imports(py) if m == "edged.daemon" or m.startswith("edged.daemon.")}
        assert daemon <= lazy_snapshot_drawing, f"{py.name} imports {daemon}"
    top_level = ast.parse((REPO / "cli" / "watch.py").read_text()).body
    at_import = {
        n.module for n in top_level if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("edged.daemon")
    }
    assert not at_import, at_import


def test_the_protocol_and_the_operator_tools_load_no_device_runtime() -> None:
    code = (
        "import sys, edged.protocol\n"
        "heavy = [m for m in ('numpy', 'cv2', 'onnxruntime', 'onnx') if m in sys.modules]\n"
        "import edged.cli.watch, edged.deploy.push\n"
        "daemon = [m for m in sys.modules if m.startswith('edged.daemon')]\n"
        "print(heavy, daemon); sys.exit(1 if heavy or daemon else 0)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
