"""``pip install edged`` keeps the host's own ONNX Runtime and OpenCV (pyproject.toml's extras).

A GPU host has ``onnxruntime-gpu`` (the module ``onnxruntime`` under another distribution name), a Jetson
JetPack's GStreamer OpenCV in the system site-packages. Real pip, a real venv and edged's real wheel; the
host's ONNX Runtime GPU and OpenCV are stand-ins of those names (no GPU here), and the venv sees this
checkout's other dependencies (numpy, onnx, ...) through a .pth, so pip resolves offline with --no-index.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from edged.deploy.bundle import REPO, clean_source

pytestmark = pytest.mark.xdist_group("install_extras")

# what pip's stand-ins make `import onnxruntime` / `import cv2` say
GPU_ORT = "onnxruntime-gpu stand-in"
CPU_ORT = "PyPI onnxruntime stand-in"
SYSTEM_CV2 = "system OpenCV stand-in"
PIP_CV2 = "PyPI opencv stand-in"
# the .venv distributions the test venvs must not see (edged itself comes from its wheel)
HIDDEN = ("onnxruntime", "opencv-python-headless", "onnxruntime-gpu", "edged")


def _wheel(dest: Path, dist: str, version: str, files: dict[str, str]) -> Path:
    """A minimal valid wheel: the files, METADATA, WHEEL and RECORD."""
    info = f"{dist.replace('-', '_')}-{version}.dist-info"
    meta = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: edged-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in meta.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    path = dest / f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in meta.items():
            z.writestr(name, text)
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """edged's wheel from this checkout, and wheels of the names pip would pull: the CPU ONNX Runtime and pip's
    OpenCV (stand-ins, so that a dependency on either would be installed and seen), and the GPU ONNX Runtime."""
    tmp = tmp_path_factory.mktemp("extras")
    out = tmp / "wheels"
    out.mkdir()
    src = clean_source(REPO, tmp / "src")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_pip_env(),
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    _wheel(out, "onnxruntime-gpu", "1.99.0", {"onnxruntime/__init__.py": f"WHO = {GPU_ORT!r}\n"})
    _wheel(out, "onnxruntime", "1.99.0", {"onnxruntime/__init__.py": f"WHO = {CPU_ORT!r}\n"})
    _wheel(out, "opencv-python-headless", "4.99.0", {"cv2/__init__.py": f"WHO = {PIP_CV2!r}\n"})
    return out


def _pip_env() -> dict[str, str]:
    # this machine's pip config adds its own indexes and wheel folders: only ours here
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _others_view(dest: Path) -> Path:
    """This environment's site-packages without ONNX Runtime, OpenCV and edged: symlinks to everything else."""
    site = Path(sysconfig.get_paths()["purelib"])
    hidden: set[str] = set()
    for info in site.glob("*.dist-info"):
        name = info.name.split("-")[0].lower().replace("_", "-")
        if name in HIDDEN:
            record = (info / "RECORD").read_text().splitlines() if (info / "RECORD").is_file() else []
            hidden |= {info.name, *(line.split("/")[0].split(",")[0] for line in record if line)}
    dest.mkdir()
    for entry in site.iterdir():
        if entry.name in hidden or entry.name.startswith("__editable__") or entry.suffix == ".pth":
            continue
        (dest / entry.name).symlink_to(entry)
    return dest


def _venv(tmp: Path, *pth_dirs: Path) -> Path:
    """A venv without pip (this pip installs into it with --python) that sees `pth_dirs` as the system site."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp)], check=True, timeout=120)
    py = tmp / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "system-site.pth").write_text("".join(f"{d}\n" for d in pth_dirs))
    return py


def _pip(py: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=_pip_env(),
    )


def _says(py: Path, code: str) -> str:
    # from the venv's own folder: `python -c` puts the working directory first, and this checkout's edged/ is not
    # the installed package
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=120, cwd=py.parent)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip()


def test_pip_install_edged_keeps_the_gpu_onnxruntime_and_the_system_opencv(wheels: Path, tmp_path: Path) -> None:
    others = _others_view(tmp_path / "others")
    system = tmp_path / "dist-packages"  # JetPack's /usr/lib/python3/dist-packages: cv2 without pip metadata
    (system / "cv2").mkdir(parents=True)
    (system / "cv2" / "__init__.py").write_text(f"WHO = {SYSTEM_CV2!r}\n")
    py = _venv(tmp_path / "venv", others, system)
    gpu = _pip(py, "install", "--no-index", "--no-deps", str(next(wheels.glob("onnxruntime_gpu-*.whl"))))
    assert gpu.returncode == 0, gpu.stderr[-2000:]

    r = _pip(py, "install", "--no-index", "--find-links", str(wheels), "edged")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Successfully installed edged-" in r.stdout, r.stdout
    assert _says(py, "import onnxruntime; print(onnxruntime.WHO)") == GPU_ORT, r.stdout
    assert _says(py, "import cv2; print(cv2.WHO)") == SYSTEM_CV2, r.stdout
    dists = _says(py, "import importlib.metadata as m; print(sorted(d.metadata['Name'] for d in m.distributions()))")
    assert "'onnxruntime-gpu'" in dists and "'onnxruntime'" not in dists and "opencv" not in dists, dists
    assert _says(py, "import edged.daemon.app; print('ok')") == "ok"  # and edged runs on them


def test_the_cpu_extra_brings_both_from_pypi(wheels: Path, tmp_path: Path) -> None:
    py = _venv(tmp_path / "venv", _others_view(tmp_path / "others"))
    r = _pip(py, "install", "--dry-run", "--no-index", "--find-links", str(wheels), "edged[cpu]")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    would = next(line for line in r.stdout.splitlines() if line.startswith("Would install"))
    assert "onnxruntime-1.99.0" in would and "opencv-python-headless-4.99.0" in would and "gpu" not in would, would


def test_a_missing_onnxruntime_or_opencv_is_named_with_its_extra(wheels: Path, tmp_path: Path) -> None:
    py = _venv(tmp_path / "venv", _others_view(tmp_path / "others"))
    r = _pip(py, "install", "--no-index", "--find-links", str(wheels), "edged")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    edged = py.parent / "edged"
    run = subprocess.run(
        [str(edged), "run", "--config", str(tmp_path / "edged.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert run.returncode == 1, run.stderr[-2000:]
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    assert "edged: error: OpenCV (module cv2) is not installed: pip install 'edged[opencv]'" in run.stderr, run.stderr
    code = (
        "from pathlib import Path\n"
        "from edged.daemon.backends.onnxruntime import OnnxRuntimeBackend\n"
        "from edged.errors import BackendError\n"
        "try:\n"
        "    OnnxRuntimeBackend(Path('model.onnx'))\n"
        "except BackendError as exc:\n"
        "    print(exc)\n"
    )
    said = _says(py, code)
    assert said.startswith("onnxruntime backend unavailable: ONNX Runtime (module onnxruntime) is not installed"), said
    assert "pip install 'edged[onnxruntime]'" in said and "onnxruntime-gpu" in said, said


def test_bundles_carry_the_extras_their_device_needs() -> None:
    """A bundle installs offline, so it names the extras: both on a host, ONNX Runtime only on a Jetson (its
    OpenCV is JetPack's)."""
    from edged.deploy.bundle import requirements

    names = {t: {re.split(r"[<>=!~ ;\[]", r)[0] for r in requirements(t)} for t in ("host", "jetson-jp6")}
    assert {"onnxruntime", "opencv-python-headless", "numpy", "paho-mqtt"} <= names["host"], names
    assert "onnxruntime" in names["jetson-jp6"] and "opencv-python-headless" not in names["jetson-jp6"], names
    assert not any(n.startswith(("pytest", "pycuda", "matplotlib", "edged")) for t in names for n in names[t]), names
