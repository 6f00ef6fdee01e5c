"""``edged bundle build``: one file to copy onto a device, or to lay into a rootfs before flashing.

    edged-bundle-<version>-<target>.tar
      bundle.json  bundle.sig   manifest (schema edged.bundle/1: target, Python, every file's sha256),
                                signed like model packages
      SHA256SUMS                the same hashes for `sha256sum -c` (install.sh checks them first)
      install.sh  firstboot.sh  the installer (see install.sh --help)
      wheels/                   edged and its dependencies for the target's Python and CPU (on a Jetson,
                                cuda-python too), plus what check/gpu-check.sh installs besides (pytest
                                and its plugins)
      requirements.txt          what install.sh installs from wheels/
      check/                    scripts/gpu-check.sh with the tests it runs: the TensorRT checks on the
                                device, offline, from this bundle alone (plus the demo assets)
      systemd/                  the units, the per-L4T device drop-ins, sysusers.d, tmpfiles.d
      docs/                     the man page edged.1 and the operator guide (the unit's Documentation=)
      config/edged.yaml         the default device config (kept on upgrades)
      keys/*.pub                the public keys devices trust for model packages
      models/*.tar              the initial model package(s), signed

Targets: ``host`` (this machine's Python and CPU), ``jetson-jp6`` (aarch64, CPython 3.10: JetPack 6
is Ubuntu 22.04). ``jetson-jp5`` is refused: JetPack 5 ships Python 3.8 and edged needs 3.10.

The jetson-jp6 bundle runs on the device's own stack. The venv is made with ``--system-site-packages``:
JetPack's OpenCV (python3-opencv / nvidia-opencv, built with GStreamer against numpy 1.x) and
TensorRT's bindings (python3-libnvinfer) live in /usr/lib/python3/dist-packages. So:

- opencv-python-headless is left out (a pip cv2 would shadow JetPack's, and it has no GStreamer);
- numpy is pinned below 2 (``numpy>=1.24,<2``): JetPack's cv2 and the TensorRT 10.3 bindings are built
  against numpy 1.x, and a numpy 2 in the venv would shadow the system's and break both. The system
  numpy (Ubuntu 22.04's 1.21.5) is older than edged's and ONNX Runtime's floor, so the venv carries
  numpy 1.26 from the bundle; 1.x keeps the ABI JetPack's modules were built for;
- the TensorRT backend's CUDA binding is cuda-python (``cuda-bindings>=12.6,<13``, pyproject's ``tensorrt``
  extra): its cp310 aarch64 wheel and its one dependency (cuda-pathfinder, pure Python) are in wheels/ and
  in requirements.txt, so edged-firstboot installs them offline with the rest; nothing compiles on the
  device. Importing it needs no GPU; its first driver call does. pycuda's source is not carried: it would
  make every first boot try a compile (CUDA's nvcc, python3-dev, g++) for a binding edged does not use where
  cuda-python imports. A prebuilt pycuda wheel given with ``--wheelhouse`` is still carried (with its
  dependencies) and installed.

``machine`` (jetson-jp6 only) picks the CPU of the wheels: aarch64 for a Jetson; x86_64 builds the same
recipe for an Ubuntu 22.04 PC or rootfs (the tests install it into one, since this machine cannot
execute aarch64).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import platform as _platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path
from typing import Literal

from edged import __version__
from edged.errors import BundleError as BundleError  # defined in edged.errors, importable here as before
from edged.models.package import open_package
from edged.models.signing import SigningKey
from edged.progress import Eta

Target = Literal["host", "jetson-jp6", "jetson-jp5"]
REPO = Path(__file__).resolve().parent.parent
# The extras (pyproject.toml) the device installs besides edged's dependencies: ONNX Runtime from PyPI on both,
# OpenCV from PyPI on a host only; on a Jetson it comes from JetPack (GStreamer for CSI cameras).
TARGET_EXTRAS: dict[str, tuple[str, ...]] = {"host": ("onnxruntime", "opencv"), "jetson-jp6": ("onnxruntime",)}
JETSON_SKIP = {"opencv-python-headless"}  # never on a Jetson, whichever extra would name it
JETSON_MANYLINUX = ("manylinux2014", "manylinux_2_28", "manylinux_2_17")  # Ubuntu 22.04: glibc 2.35
JETSON_NUMPY = "numpy>=1.24,<2"
# the TensorRT backend's CUDA binding on a Jetson (pyproject's `tensorrt` extra, read from here rather than from
# edged's installed metadata, which is as old as the last `pip install -e .`); TensorRT itself is JetPack's
CUDA_PYTHON = "cuda-bindings>=12.6,<13"
PYCUDA = "pycuda>=2024.1"  # only as a prebuilt wheel from --wheelhouse (PyPI has no aarch64 wheel)
PIP_TIMEOUT_S = 1800  # one pip step, however slow the index
BUILD_LEFTOVERS = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".demo", ".*_cache")  # not in a wheel
# what scripts/gpu-check.sh installs besides edged[tensorrt] (its CHECK_REQS): the bundle carries them, so the
# check runs offline on the device; install.sh never installs them
GPU_CHECK = ("pytest>=8", "pytest-timeout>=2.2", "pytest-xdist>=3.5")
# the check's files, from the source checkout, under check/ (the tests' conftest finds its root one level up)
GPU_CHECK_FILES = (
    "scripts/gpu-check.sh",
    "pyproject.toml",
    "tests/__init__.py",
    "tests/conftest.py",
    "tests/test_tensorrt.py",
)
Machine = Literal["aarch64", "x86_64"]


@dataclass(frozen=True)
class Bundle:
    path: Path
    target: str
    files: int
    wheels: list[str]


def requirements(target: Target) -> list[str]:
    """edged's runtime dependencies and the target's extras (from its installed metadata), minus what the
    target's OS provides."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        declared = requires("edged") or []
    except PackageNotFoundError as exc:
        raise BundleError("edged is not installed (pip install -e .), so its dependencies are unknown") from exc
    wanted = TARGET_EXTRAS.get(target, ())
    reqs: list[str] = []
    for r in declared:
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", r)
        req = r if extra is None else r.partition(";")[0].strip()
        if (extra is None or extra.group(1) in wanted) and req not in reqs:
            reqs.append(req)
    if target.startswith("jetson"):
        names = [(re.split(r"[<>=!~ ;\[]", r)[0], r) for r in reqs]
        reqs = [JETSON_NUMPY if n == "numpy" else r for n, r in names if n not in JETSON_SKIP]
        reqs.append(CUDA_PYTHON)  # the TensorRT backend's CUDA binding: a wheel, installed with the rest
    return reqs


def build_bundle(
    out_dir: Path,
    target: Target,
    keys_dir: Path,
    models: list[Path],
    signing_key: SigningKey | None = None,
    wheelhouse: Path | None = None,
    progress: Callable[[str], None] | None = None,
    machine: Machine = "aarch64",
) -> Bundle:
    say = progress or (lambda m: None)
    if target == "jetson-jp5":
        raise BundleError(
            "jetson-jp5: JetPack 5 ships Python 3.8 (Ubuntu 20.04) and edged needs Python >= 3.10; "
            "use JetPack 6 (--target jetson-jp6), or a device Python 3.10 and --target host on the device"
        )
    pubs = sorted(keys_dir.glob("*.pub")) if keys_dir.is_dir() else []
    if not pubs:
        raise BundleError(f"{keys_dir}: no *.pub keys; devices would trust no model package (edged keys generate)")
    with tempfile.TemporaryDirectory(prefix="edged-bundle-") as tmp_dir:
        tmp = Path(tmp_dir)
        names = [open_package(m, scratch=tmp).manifest.name for m in models]  # sizes and hashes first
        root = tmp / "bundle"
        wheels = root / "wheels"
        wheels.mkdir(parents=True)
        reqs = requirements(target)
        (root / "requirements.txt").write_text("\n".join(reqs) + "\n")
        _wheels(target, reqs, wheels, wheelhouse, say, machine)
        for rel in (
            "edged.service",
            "edged-rollback.service",
            "edged-firstboot.service",
            "sysusers.d/edged.conf",
            "tmpfiles.d/edged.conf",
            "devices/l4t-r35.conf",
            "devices/l4t-r36.conf",
        ):
            dst = root / "systemd" / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / "systemd" / rel, dst)
        for rel in GPU_CHECK_FILES:  # gpu-check.sh lies at check/ itself, not check/scripts/
            dst = root / "check" / (Path(rel).name if rel.startswith("scripts/") else rel)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / rel, dst)
        (root / "docs").mkdir()
        for rel in ("edged.1", "operator.md"):  # man edged; the unit's Documentation=
            shutil.copy(REPO / "docs" / rel, root / "docs" / rel)
        for name in ("install.sh", "firstboot.sh"):
            data = resources.files("edged.deploy").joinpath(name).read_bytes()
            (root / name).write_bytes(data)
            (root / name).chmod(0o755)
        (root / "config").mkdir()
        config = resources.files("edged.deploy").joinpath("edged.yaml").read_text()
        if names:
            config = config.replace("name: MODEL-NAME", f"name: {names[0]}")
        (root / "config" / "edged.yaml").write_text(config)
        (root / "keys").mkdir()
        for p in pubs:
            shutil.copy(p, root / "keys" / p.name)
        (root / "models").mkdir()
        for m in models:
            shutil.copy(m, root / "models" / m.name)
        files = {
            str(p.relative_to(root)): {"size": p.stat().st_size, "sha256": _sha(p)}
            for p in sorted(root.rglob("*"))
            if p.is_file()
        }
        py = "cp310" if target == "jetson-jp6" else f"cp{sys.version_info.major}{sys.version_info.minor}"
        doc = {
            "schema": "edged.bundle/1",
            "edged": __version__,
            "target": target,
            "python": py,
            "machine": machine if target == "jetson-jp6" else _platform.machine(),
            "created": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "files": files,
        }
        manifest = (json.dumps(doc, indent=2) + "\n").encode()
        (root / "bundle.json").write_bytes(manifest)
        (root / "SHA256SUMS").write_text("".join(f"{v['sha256']}  {k}\n" for k, v in files.items()))
        if signing_key is not None:
            (root / "bundle.sig").write_bytes(signing_key.sign(manifest))
        out_dir.mkdir(parents=True, exist_ok=True)
        out = out_dir / f"edged-bundle-{__version__}-{target}.tar"
        part = out.with_name(out.name + ".partial")
        with tarfile.open(part, "w") as tar:
            for p in sorted(root.rglob("*")):
                info = tar.gettarinfo(str(p), arcname=f"edged-bundle/{p.relative_to(root)}")
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                if p.is_file():
                    with p.open("rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
        part.replace(out)
        say(f"wrote {out} ({out.stat().st_size >> 20} MiB, {len(files)} files)")
        return Bundle(out, target, len(files), sorted(p.name for p in wheels.iterdir()))


def clean_source(repo: Path, dest: Path) -> Path:
    """A copy of the source checkout without build outputs, virtual environments or caches."""
    shutil.copytree(repo, dest, ignore=shutil.ignore_patterns(*BUILD_LEFTOVERS), symlinks=True)
    return dest


def _wheels(
    target: Target,
    reqs: list[str],
    dest: Path,
    wheelhouse: Path | None,
    say: Callable[[str], None],
    machine: Machine = "aarch64",
) -> None:
    if not (REPO / "pyproject.toml").is_file():
        raise BundleError(
            f"{REPO}: not an edged source checkout; bundles are built from one (git clone, pip install -e .)"
        )
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    extra = ["--find-links", str(wheelhouse)] if wheelhouse else []
    say("building the edged wheel")
    with tempfile.TemporaryDirectory(prefix="edged-src-") as tmp:
        # from a copy without build outputs: setuptools reuses a checkout's build/lib, which can still hold
        # modules since moved or deleted, and they would ship in the wheel
        _run([*pip, "wheel", "--no-deps", "-q", "-w", str(dest), str(clean_source(REPO, Path(tmp) / "src"))])
    if target == "host":
        say(f"collecting wheels for this machine's Python {sys.version_info.major}.{sys.version_info.minor}")
        wanted = [*reqs, *GPU_CHECK]
        _pip([*pip, "wheel", "-w", str(dest), *extra, *wanted], wanted, "collecting wheels", say)
        return
    say(f"downloading {machine} / CPython 3.10 wheels for JetPack 6 (numpy < 2, no pip OpenCV, cuda-python)")
    # linux_<machine>: a wheel built on a device (a --wheelhouse pycuda) has no manylinux tag; PyPI has none such
    plats = [a for p in (*JETSON_MANYLINUX, "linux") for a in ("--platform", f"{p}_{machine}")]
    cp310 = ["--python-version", "3.10", "--implementation", "cp", "--abi", "cp310", "--abi", "abi3", "--abi", "none"]
    binary = [*pip, "download", "--only-binary=:all:", *plats, *cp310, "-d", str(dest), *extra]
    prebuilt = bool(wheelhouse and any(wheelhouse.glob(f"pycuda-*{machine}*.whl")))
    if prebuilt:
        say("pycuda: the prebuilt wheel from --wheelhouse, with its dependencies (cuda-python is preferred)")
    wanted = [*reqs, *GPU_CHECK, *([PYCUDA] if prebuilt else [])]  # one resolution: pycuda's numpy is ours
    _pip([*binary, *wanted], wanted, "downloading wheels", say)


def _pip(cmd: list[str], reqs: list[str], what: str, say: Callable[[str], None]) -> None:
    """`pip wheel|download` (`cmd`, ending with `reqs`) with its progress: each distribution pip collects (its
    "Collecting" and "Processing" lines) is a unit, out of an estimate of how many `reqs` pull in (this
    machine's installed metadata; the estimate grows when pip finds more)."""
    eta = Eta(say, what, estimate_distributions(reqs), "distributions (estimated)")
    tail: list[str] = []
    timed_out = threading.Event()
    with subprocess.Popen(
        [*cmd, "--progress-bar", "off"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:

        def stop() -> None:
            timed_out.set()
            proc.kill()

        timer = threading.Timer(PIP_TIMEOUT_S, stop)
        timer.start()
        try:
            for line in proc.stdout or ():
                tail = [*tail[-40:], line.rstrip()]
                if line.startswith(("Collecting ", "Processing ")):  # from an index / from a local file
                    if eta.done + 1 >= eta.total:
                        eta.extend(1)  # more than estimated: the estimate grows, the step is not done yet
                    eta.advance()
            rc = proc.wait()
        finally:
            timer.cancel()
    if timed_out.is_set():
        raise BundleError(f"`{' '.join(cmd[2:6])} ...` took over {PIP_TIMEOUT_S} s")
    if rc != 0:
        raise BundleError(f"`{' '.join(cmd[2:6])} ...` failed: {chr(10).join(tail)[-800:]}")
    eta.finish()


def estimate_distributions(reqs: list[str]) -> int:
    """How many distributions `reqs` pull in, from the metadata installed here (a name not installed counts
    once): an estimate for the progress line, never a check."""
    seen: set[str] = set()
    todo = [r for r in reqs if r and not r.startswith(("-", "/", "."))]
    while todo:
        name = re.split(r"[<>=!~ ;\[]", todo.pop().strip())[0].lower().replace("_", "-")
        if not name or name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [r for r in requires if "extra ==" not in r]
    return max(1, len(seen))


def _run(cmd: list[str]) -> None:
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800)
    except subprocess.CalledProcessError as exc:
        raise BundleError(f"`{' '.join(cmd[2:6])} ...` failed: {exc.stderr.strip()[-800:]}") from exc


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(bundle: Path) -> dict[str, object]:
    with tarfile.open(bundle) as tar:
        f = tar.extractfile("edged-bundle/bundle.json")
        if f is None:
            raise BundleError(f"{bundle}: no bundle.json")
        doc: dict[str, object] = json.load(io.TextIOWrapper(f))
        return doc


def verify_bundle(bundle: Path, keys_dir: Path) -> dict[str, object]:
    """Check a bundle before flashing or copying it: bundle.sig by one of `keys_dir`'s keys over the
    exact bundle.json bytes, then every file's size and sha256 against bundle.json, and nothing else
    in the tar. Returns the manifest."""
    from edged.errors import PackageError
    from edged.models.signing import TrustStore

    trust = TrustStore.load(keys_dir)
    prefix = "edged-bundle/"
    try:
        with tarfile.open(bundle) as tar:
            members = {m.name: m for m in tar.getmembers() if m.isfile()}

            def read(name: str) -> bytes:
                member = members.get(prefix + name)
                f = tar.extractfile(member) if member else None
                if f is None:
                    raise BundleError(f"{bundle}: no {name}")
                return f.read()

            manifest_bytes = read("bundle.json")
            try:
                trust.verify(manifest_bytes, read("bundle.sig"), str(bundle))
            except PackageError as exc:
                raise BundleError(str(exc), code=exc.code) from exc
            doc: dict[str, object] = json.loads(manifest_bytes)
            files = doc["files"]
            if not isinstance(files, dict):
                raise BundleError(f"{bundle}: bundle.json has no file list")
            for rel, entry in files.items():
                data = read(rel)
                if len(data) != entry["size"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
                    raise BundleError(f"{bundle}: {rel} does not match bundle.json (corrupt or altered)")
            extra = (
                set(members)
                - {prefix + r for r in files}
                - {prefix + n for n in ("bundle.json", "bundle.sig", "SHA256SUMS")}
            )
            if extra:
                raise BundleError(f"{bundle}: files not in bundle.json: {', '.join(sorted(extra))}")
    except (tarfile.TarError, OSError, ValueError, KeyError) as exc:
        raise BundleError(f"{bundle}: not a readable bundle: {exc}") from exc
    return doc
