"""Will this TensorRT engine load here? The device's facts against what a package's manifest records.

A TensorRT plan is tied to the TensorRT version that built it, build number included: 10.3.0.30 and 10.3.0.26
differ, as TensorRT's own check says (unless built version-compatible, then
to its major version, not older), to the GPU's compute capability (unless built with a hardware
compatibility level), and on Jetson to the L4T release whose CUDA and TensorRT it was built against.
Checking before deserializing turns TensorRT's "Serialization assertion ... failed" into an error
that says which fact differs and what to do.

``compatibility`` in the manifest of an engine package::

    {"tensorrt": "10.3.0", "compute_capability": "8.7", "l4t": "36.4.0", "platform": "aarch64",
     "version_compatible": false, "hardware_compatibility": "none", "dla_core": null}

``hardware_compatibility`` is "none" (this compute capability only), "ampere+" or "same-cc" (TensorRT
10's same-compute-capability level); ``dla_core`` is the DLA core the engine runs on, checked against the
cores the device tree enables.

Device facts come from the running TensorRT and CUDA (passed in by the backend) and from files under a
root folder (``/etc/nv_tegra_release``, ``/proc/device-tree/compatible``), so tests read fixture trees.
"""

from __future__ import annotations

import platform as _platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edged.errors import IncompatibleEngine as IncompatibleEngine  # defined in edged.errors, importable here as before

# Jetson SoCs by device-tree compatible string: their GPU's compute capability.
TEGRA_COMPUTE_CAPABILITY = {
    "nvidia,tegra210": "5.3",  # Nano, TX1
    "nvidia,tegra186": "6.2",  # TX2
    "nvidia,tegra194": "7.2",  # Xavier NX / AGX Xavier
    "nvidia,tegra234": "8.7",  # Orin Nano / NX / AGX Orin
}
# The TensorRT versions edged runs: 8.6 (JetPack 6.0) to 11.x (daemon/backends/tensorrt/api.py spells each).
TENSORRT_MIN = (8, 6)
TENSORRT_MAX_MAJOR = 11
TENSORRT_SUPPORTED = "8.6 (JetPack 6.0) to 11.x"
_RELEASE = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)")


@dataclass(frozen=True)
class DeviceFacts:
    platform: str
    tensorrt: str | None = None
    compute_capability: str | None = None
    l4t: str | None = None
    dla_cores: int | None = None  # None: unknown (not checked)

    @classmethod
    def read(
        cls, root: Path = Path("/"), tensorrt: str | None = None, compute_capability: str | None = None
    ) -> DeviceFacts:
        """Facts from the files under `root`; `tensorrt` / `compute_capability` from the live libraries
        when the caller has them (a Jetson's compute capability is also known from its SoC)."""
        return cls(
            platform=_platform.machine(),
            tensorrt=tensorrt,
            compute_capability=compute_capability or tegra_compute_capability(root),
            l4t=l4t_release(root),
            dla_cores=dla_cores(root),
        )


def detect(root: Path = Path("/")) -> DeviceFacts:
    """This device's facts without touching the GPU: TensorRT's version if it imports, the compute
    capability from the SoC on Jetson (the TensorRT backend asks CUDA itself)."""
    try:
        import tensorrt

        version: str | None = str(tensorrt.__version__)
    except ImportError:
        version = None
    return DeviceFacts.read(root, tensorrt=version)


def l4t_release(root: Path = Path("/")) -> str | None:
    """'36.4.0' from '# R36 (release), REVISION: 4.0, ...'; None off Jetson."""
    try:
        first = (root / "etc/nv_tegra_release").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    m = _RELEASE.match(first)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def dla_cores(root: Path = Path("/")) -> int:
    """The enabled DLA cores in the device tree (`nvdla0@…`, `nvdla1@…` with status "okay": two on AGX Orin
    and Orin NX, none on Orin Nano, where they are disabled); 0 without a device tree (no Jetson, no DLA)."""
    tree = root / "proc/device-tree"
    found = 0
    for node in tree.glob("**/nvdla*"):
        status = node / "status"
        try:
            enabled = not status.exists() or status.read_bytes().rstrip(b"\0\n") in (b"okay", b"ok")
        except OSError:
            continue
        found += node.is_dir() and enabled
    return found


def tegra_compute_capability(root: Path = Path("/")) -> str | None:
    try:
        compatible = (root / "proc/device-tree/compatible").read_bytes().split(b"\0")
    except OSError:
        return None
    for entry in compatible:
        cc = TEGRA_COMPUTE_CAPABILITY.get(entry.decode(errors="replace"))
        if cc:
            return cc
    return None


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", v)[:4])


def same_tensorrt(built: str, here: str) -> bool:
    """TensorRT's own plan check: a plan deserializes only on the TensorRT that built it, all four parts
    (major.minor.patch.build: "10.3.0.30", as ``tensorrt.__version__`` says and edged records). A version
    recorded with fewer parts ("10.3.0", by hand or an older edged) is compared on the parts it has."""
    a, b = _version(built), _version(here)
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def unsupported_tensorrt(version: str) -> str | None:
    """Why edged cannot run this TensorRT version, or None when it can."""
    v = _version(version)
    if len(v) >= 2 and v[:2] >= TENSORRT_MIN and v[0] <= TENSORRT_MAX_MAJOR:
        return None
    return (
        f"TensorRT {version} is not supported: edged runs TensorRT {TENSORRT_SUPPORTED} "
        "(JetPack 5's TensorRT 8.5 and Python 3.8 cannot run edged; flash JetPack 6)"
    )


def mismatches(required: dict[str, Any], facts: DeviceFacts) -> list[str]:
    """Every way the engine described by `required` cannot run on `facts`, in words; empty if it can."""
    out = []
    want_platform = required.get("platform")
    if want_platform and want_platform != facts.platform:
        out.append(f"built for {want_platform}, this device is {facts.platform}")
    want_trt = required.get("tensorrt")
    refused = unsupported_tensorrt(facts.tensorrt) if want_trt and facts.tensorrt else None
    if want_trt:
        before = len(out)
        if facts.tensorrt is None:
            out.append(f"needs TensorRT {want_trt}, none is installed here")
        elif required.get("version_compatible"):
            have, want = _version(facts.tensorrt), _version(want_trt)
            if have[:1] != want[:1] or have < want:
                out.append(
                    f"built version-compatible with TensorRT {want_trt}: needs {want[0]}.x at least that new, "
                    f"this device has {facts.tensorrt}"
                )
        elif not same_tensorrt(want_trt, facts.tensorrt):
            out.append(f"built with TensorRT {want_trt}, this device has {facts.tensorrt}")
        if refused and len(out) > before:  # the version differs, and edged cannot run this device's anyway
            out[-1] += f" ({refused})"
        elif refused:
            out.append(f"this device's {refused}")
    want_cc = required.get("compute_capability")
    if want_cc:
        hw = required.get("hardware_compatibility", "none")
        if facts.compute_capability is None:
            out.append(f"built for compute capability {want_cc}, this device's is unknown (no GPU found?)")
        elif hw == "ampere+":
            if _version(facts.compute_capability) < (8, 0):
                out.append(f"built for Ampere or newer, this GPU is compute capability {facts.compute_capability}")
        elif want_cc != facts.compute_capability:
            out.append(f"built for compute capability {want_cc}, this GPU is {facts.compute_capability}")
    want_dla = required.get("dla_core")
    if want_dla is not None and facts.dla_cores is not None and int(want_dla) >= facts.dla_cores:
        cores = f"{facts.dla_cores} DLA core(s)" if facts.dla_cores else "no DLA"
        out.append(f"built for DLA core {want_dla}, this device has {cores}")
    want_l4t = required.get("l4t")
    if want_l4t and facts.l4t and want_l4t.split(".")[0] != facts.l4t.split(".")[0]:
        out.append(f"built on L4T R{want_l4t}, this device runs R{facts.l4t}")
    return out


def check_engine(required: dict[str, Any], facts: DeviceFacts, where: str, has_onnx: bool) -> None:
    """Raise IncompatibleEngine naming every mismatch and what to do about it."""
    problems = mismatches(required, facts)
    if not problems:
        return
    fix = (
        "rebuild it on this device from the package's model.onnx (`edged build-engine`)"
        if has_onnx
        else "rebuild it with `edged build-engine` on a device of this type, from the ONNX model"
    )
    raise IncompatibleEngine(f"{where}: this engine cannot load here: {'; '.join(problems)}. To fix: {fix}")
