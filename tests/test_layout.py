"""The repository layout of DESIGN.md §1: one import root, parts in top-level folders, one-way deps."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import edged.daemon
import edged.deploy
import edged.models
import edged.protocol
import edged.quantize

from .conftest import REPO


def test_parts_come_from_their_top_level_folders() -> None:
    for mod, folder in [
        (edged.daemon, "daemon"),
        (edged.models, "models"),
        (edged.quantize, "quantize"),
        (edged.deploy, "deploy"),
        (edged.protocol, "protocol"),
    ]:
        assert Path(mod.__file__ or "").resolve().parent == REPO / folder


def _imports(folder: Path) -> set[str]:
    found: set[str] = set()
    for py in [folder] if folder.is_file() else folder.rglob("*.py"):
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
    modules = sorted(p.stem for p in (REPO / "daemon").glob("*.py") if p.stem != "__init__")
    code = (
        "import sys, importlib\n"
        f"for m in {modules!r}: importlib.import_module('edged.daemon.' + m)\n"
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


def test_protocol_imports_nothing_of_ours_but_errors_and_the_version() -> None:
    """The wire contract is the ground both ends stand on: nothing of ours but the exception tree and the
    version, and none of the device runtime's heavy libraries."""
    found = _imports(REPO / "protocol")
    ours = {m for m in found if m == "edged" or m.startswith("edged.")}
    assert ours <= {"edged", "edged.errors"}, ours
    heavy = {m for m in found if m.split(".")[0] in ("numpy", "cv2", "onnxruntime", "onnx", "tensorrt", "pycuda")}
    assert not heavy, heavy


def _relative_imports(py: Path) -> set[str]:
    tree = ast.parse(py.read_text(), str(py))
    return {f"{'.' * n.level}{n.module or ''}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level}


def test_operator_tools_import_no_device_runtime_module() -> None:
    """`edged push` and `edged watch` speak edged.protocol, never edged.daemon (DESIGN §1). The one exception:
    `edged watch --snapshot` draws boxes with the daemon's OpenCV drawing, imported only then."""
    lazy_snapshot_drawing = {"edged.daemon.annotate"}
    for py in (REPO / "edged" / "push.py", REPO / "daemon" / "watch.py"):
        daemon = {m for m in _imports(py) if m == "edged.daemon" or m.startswith("edged.daemon.")}
        assert daemon <= lazy_snapshot_drawing, f"{py.name} imports {daemon}"
        assert not _relative_imports(py), f"{py.name} imports {_relative_imports(py)}"
    top_level = ast.parse((REPO / "daemon" / "watch.py").read_text()).body
    at_import = {
        n.module for n in top_level if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("edged.daemon")
    }
    assert not at_import, at_import


def test_the_protocol_and_the_operator_tools_load_no_device_runtime() -> None:
    code = (
        "import sys, edged.protocol\n"
        "heavy = [m for m in ('numpy', 'cv2', 'onnxruntime', 'onnx') if m in sys.modules]\n"
        "import edged.daemon.watch, edged.push\n"
        "daemon = [m for m in sys.modules if m.startswith('edged.daemon.') and m != 'edged.daemon.watch']\n"
        "print(heavy, daemon); sys.exit(1 if heavy or daemon else 0)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
