"""The repository layout of DESIGN.md §1: one import root, parts in top-level folders, one-way deps."""

from __future__ import annotations

import ast
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
        "import sys, edged.cli.watch, edged.deploy.push\n"
        "bad = [m for m in ('cv2', 'onnxruntime', 'tensorrt') if m in sys.modules]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
