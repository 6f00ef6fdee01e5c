"""``edged doctor``: can this device run edged, and if not, what to do. One line per check.

Each check says ``ok``, ``FAIL`` (a required check: edged cannot serve this config here), ``warn`` (an
advisory check: something works less well or a feature is off) or ``n/a`` (not present on this kind
of machine, and what that means). install.sh and the first-boot unit run it and refuse to enable the
daemon when a required check fails.

    python      >= 3.10 (JetPack 6 is Python 3.10; JetPack 5's 3.8 cannot run edged)
    numpy       imports; where from; 1.x on Jetson (JetPack's OpenCV and TensorRT 10.3 need numpy 1.x)
    opencv      imports and where from; required (gst-cv2: whether it is built with GStreamer, which only
                `backend: opencv` csi:// and gst:// cameras use)
    gstreamer   GStreamer through PyGObject (python3-gi), the capture path of file/rtsp/v4l2/csi/gst
                cameras; required when a configured camera cannot be opened without it
    gst-nv      NVIDIA elements (nvarguscamerasrc, nvv4l2decoder, nvvidconv) in the registry capture uses
    encoder     clip encoder: nvv4l2h264enc | x264enc | openh264enc | none, for recording cameras not sending H.264
    capture     each configured camera: the path the daemon opens it on (capture/gstreamer/pipeline.py decides, as
                the daemon does) and why it cannot be opened on this machine
    tensorrt    imports and its version; required when the model is an engine or is built on the device
    cuda        the CUDA binding (cuda-python, else pycuda): which, its version and why; required with TensorRT
    gpu         CUDA device, compute capability and free memory (through that binding), DLA cores (TensorRT)
    l4t         /etc/nv_tegra_release: R36 is JetPack 6; R35 (JetPack 5) is refused
    sensors     thermal zones, power rails, GPU load, power mode (edged.daemon.host.sensors)
    journald    under systemd: python3-systemd, which gives the journal each line's priority and fields
    state_dir   writable by this user, free space
    broker      a real MQTT connect with the config's host, port, TLS identity and credentials
    model       the configured package opens and, for an engine, was built for this device

Files (L4T release, device tree, sysfs, device nodes) are read under ``root`` so tests use fixture trees.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from edged.errors import BackendError, EdgedError
from edged.models import compat

from .config import CameraConfig, Config
from .host.sensors import Sensors

Status = Literal["ok", "fail", "warn", "n/a"]
NV_ELEMENTS = ("nvarguscamerasrc", "nvv4l2decoder", "nvvidconv")
GST_FIX = (
    "apt-get install python3-gi gir1.2-gstreamer-1.0 gir1.2-gst-plugins-base-1.0 gstreamer1.0-plugins-good "
    "gstreamer1.0-plugins-bad, in a venv that sees them (python3 -m venv --system-site-packages, as firstboot.sh "
    "makes it)"
)
NV_FIX = "JetPack's GStreamer plugins: apt-get install nvidia-l4t-gstreamer"
GPU_NODES = ("dev/nvidia0", "dev/nvhost-gpu", "dev/nvgpu/igpu0/ctrl")
MIN_FREE_MB = 64
LOW_FREE_MB = 512


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""
    required: bool = False

    def line(self) -> str:
        tag = {"ok": "ok  ", "fail": "FAIL", "warn": "warn", "n/a": "n/a "}[self.status]
        kind = "required" if self.required else "advisory"
        text = f"{tag} {self.name:<10} {self.detail}"
        if self.fix and self.status != "ok":
            text += f" -> {self.fix}"
        return text + (f" [{kind}]" if self.status in ("fail", "warn") else "")


@dataclass
class Needs:
    """What the configured model and cameras need from this device (without a config: the ONNX path)."""

    tensorrt: bool = False
    csi: bool = False
    jetson: bool = False


def needs_of(cfg: Config | None, root: Path) -> Needs:
    n = Needs(jetson=compat.l4t_release(root) is not None)
    if cfg is None:
        return n
    n.tensorrt = cfg.model.backend == "tensorrt" or cfg.model.build_on_device
    # an engine package (a folder, or the store's current version); a .tar's kind the model check reports
    package = cfg.model.package
    if package is None and cfg.model.name is not None:
        package = cfg.state_dir / "models" / cfg.model.name / "current"
    if package is not None and (package / "model.engine").exists():
        n.tensorrt = True
    n.csi = any(c.uri.startswith("csi://") for c in cfg.cameras)
    return n


def _origin(module_file: str | None) -> str:
    if not module_file:
        return "unknown place"
    path = Path(module_file).resolve()  # a venv's link to the system's package (python3-gi) is the system's
    text = str(path)
    if "dist-packages" in text or text.startswith("/usr/lib/"):
        where = "the system"
    elif sys.prefix != sys.base_prefix and path.is_relative_to(Path(sys.prefix).resolve()):
        where = "this venv (pip)"
    else:
        where = "pip"
    return f"{where}: {path.parent if path.name == '__init__.py' else path}"


def check_python() -> Check:
    v = sys.version_info
    here = f"Python {v.major}.{v.minor}.{v.micro} ({sys.executable})"
    if v < (3, 10):
        return Check("python", "fail", here, "edged needs Python >= 3.10: JetPack 6 (Ubuntu 22.04)", True)
    return Check("python", "ok", here, required=True)


def check_numpy(needs: Needs) -> Check:
    try:
        import numpy
    except ImportError as exc:
        return Check("numpy", "fail", f"does not import: {exc}", "reinstall the bundle (numpy is in its wheels)", True)
    major = int(numpy.__version__.split(".")[0])
    detail = f"numpy {numpy.__version__} from {_origin(numpy.__file__)}"
    if needs.jetson and major >= 2:
        fix = "JetPack's OpenCV and TensorRT 10.3 bindings are built for numpy 1.x: pip install 'numpy<2' in the venv"
        return Check("numpy", "fail", detail, fix, True)
    return Check("numpy", "ok", detail, required=True)


def check_opencv(needs: Needs) -> list[Check]:
    """OpenCV imports (every camera's frames and snapshots go through it); whether it is built with GStreamer,
    which only a `backend: opencv` csi:// or gst:// camera uses (and `auto` ones where PyGObject's GStreamer
    does not load): the capture check says which camera needs it."""
    try:
        import cv2
    except ImportError as exc:
        fix = (
            "JetPack's OpenCV: apt-get install nvidia-opencv (python3-opencv); the venv sees the system site-packages"
            if needs.jetson
            else "pip install opencv-python-headless, or apt-get install python3-opencv"
        )
        return [Check("opencv", "fail", f"does not import: {exc}", fix, True)]
    out = [Check("opencv", "ok", f"OpenCV {cv2.__version__} from {_origin(cv2.__file__)}", required=True)]
    if opencv_has_gstreamer():
        return [*out, Check("gst-cv2", "ok", "OpenCV is built with GStreamer (used by backend: opencv cameras)")]
    from .capture.gstreamer import pipeline as gst

    detail = "OpenCV is built without GStreamer"
    if gst.available():
        return [*out, Check("gst-cv2", "n/a", f"{detail}: not used, cameras capture through PyGObject's GStreamer")]
    why = f"{detail}, and PyGObject's GStreamer does not load either (the gstreamer line: how to install it)"
    return [*out, Check("gst-cv2", "warn", why)]


def opencv_has_gstreamer() -> bool:
    import cv2

    m = re.search(r"^\s*GStreamer:\s*(\S+)", cv2.getBuildInformation(), re.MULTILINE)
    value = m.group(1) if m else "NO"
    return value.upper() in {"YES", "ON"} or value[:1].isdigit()


def check_gstreamer(cameras: list[Camera] | None) -> Check:
    """GStreamer through PyGObject, the daemon's capture path (capture/gstreamer/); required when a configured
    camera cannot be opened without it."""
    from .capture.gstreamer import pipeline as gst

    required = any(c.needs_gst for c in cameras or [])
    if gst.available():
        import gi  # type: ignore[import-untyped,import-not-found,unused-ignore]

        version = getattr(gi, "__version__", "?")
        detail = f"{gst.version()} through PyGObject {version} from {_origin(gi.__file__)}"
        return Check("gstreamer", "ok", detail, required=required)
    why = gst.why_unavailable()
    if required:
        return Check("gstreamer", "fail", f"{why}: cameras need it (capture below)", GST_FIX, True)
    meaning = "file/rtsp/v4l2 cameras fall back to OpenCV (software decode and scale); no csi:// or gst:// cameras"
    return Check("gstreamer", "warn", f"{why}: {meaning}", GST_FIX)


@dataclass(frozen=True)
class Camera:
    """One camera's capture path as the daemon would open it here, and why it cannot be opened."""

    shown: str
    path: str
    problem: str = ""
    fix: str = ""
    needs_gst: bool = False  # cannot be opened without PyGObject's GStreamer


def camera_path(cam: CameraConfig) -> Camera:
    """The path the daemon opens `cam` on: use_gstreamer decides, as in sources.open_source. Not checked:
    whether the file, device or server is there now (`edged check-config --probe-cameras` opens it)."""
    from edged.errors import CaptureError

    from .capture.gstreamer import pipeline as gst
    from .capture.registry import source_type

    row = source_type(cam.uri)
    scheme = cam.uri.split("://", 1)[0]
    shown = f"{cam.name} ({cam.display})"
    # no other way in: backend gstreamer, or csi/gst where OpenCV (the fallback) is built without GStreamer
    only = cam.backend == "gstreamer" or (row.needs_gst and not opencv_has_gstreamer())
    try:
        on_gst = row.plan is not None and gst.use_gstreamer(cam)
    except CaptureError as exc:  # backend: gstreamer where it does not load
        return Camera(shown, "GStreamer", str(exc), GST_FIX, True)
    if on_gst and row.plan is not None:
        for element in row.gst_elements:
            if not gst.has_element(element):
                why = f"{scheme}:// needs {element}, which this GStreamer lacks"
                return Camera(shown, "GStreamer", why, NV_FIX, only)
        try:
            p = row.plan(cam.uri, gst.have(), cam.rtsp_latency_ms, cam.rtsp_transport, cam.stall_timeout_s)
            if row.own_pipeline:
                gst.parse_check(p.description, cam.display)
        except CaptureError as exc:
            fix = "fix the camera's uri (gst-launch-1.0 tries a pipeline)"
            return Camera(shown, "GStreamer", str(exc), fix, only)
        path = f"{gst.version()} (PyGObject)" + (", scaler nvvidconv" if "nvvidconv" in p.description else "")
        return Camera(shown, path, needs_gst=only)
    if row.needs_gst:
        if opencv_has_gstreamer():
            return Camera(shown, "OpenCV's GStreamer")
        if cam.backend == "opencv":
            fix = "backend: auto (GStreamer through PyGObject), or an OpenCV built with GStreamer"
            return Camera(shown, "OpenCV", f"{scheme}:// needs GStreamer; this OpenCV is built without it", fix)
        why = f"{scheme}:// needs GStreamer: {gst.why_unavailable()}; this OpenCV is built without it either"
        return Camera(shown, "none", why, GST_FIX, True)
    return Camera(shown, row.path)


def _guarded_path(cam: CameraConfig) -> Camera:
    try:
        return camera_path(cam)
    except Exception as exc:  # as run_checks' guard: a broken check is reported, not a crash
        return Camera(f"{cam.name} ({cam.display})", "?", f"the check itself failed: {type(exc).__name__}: {exc}")


def check_capture(cameras: list[Camera]) -> Check:
    bad = [c for c in cameras if c.problem]
    if not bad:
        return Check("capture", "ok", "; ".join(f"{c.shown}: {c.path}" for c in cameras), required=True)
    fixes = list(dict.fromkeys(c.fix for c in bad if c.fix))
    detail = "; ".join(f"{c.shown}: {c.problem}" for c in bad)
    return Check("capture", "fail", detail, "; ".join(fixes), True)


def check_gst_elements(needs: Needs, inspect: str | None = None) -> Check:
    """The NVIDIA elements in the registry capture uses (PyGObject's GStreamer); gst-inspect-1.0 where that
    does not load."""
    from .capture.gstreamer import pipeline as gst

    if gst.available() and inspect is None:
        found = [el for el in NV_ELEMENTS if gst.has_element(el)]
    else:
        exe = inspect or shutil.which("gst-inspect-1.0")
        if exe is None:
            return Check(
                "gst-nv",
                "n/a",
                "gst-inspect-1.0 is not installed: cannot list GStreamer elements",
                "apt-get install gstreamer1.0-tools to check nvarguscamerasrc / nvv4l2decoder / nvvidconv",
            )
        found = [
            el
            for el in NV_ELEMENTS
            if subprocess.run([exe, "--exists", el], capture_output=True, timeout=30).returncode == 0
        ]
    missing = [el for el in NV_ELEMENTS if el not in found]
    if not missing:
        return Check("gst-nv", "ok", f"NVIDIA elements: {', '.join(found)}", required=needs.csi)
    detail = f"missing {', '.join(missing)}" + (f" (have {', '.join(found)})" if found else "")
    if needs.csi and "nvarguscamerasrc" in missing:
        return Check("gst-nv", "fail", detail + ": csi:// cameras cannot open", NV_FIX, True)
    if not needs.jetson:
        return Check("gst-nv", "n/a", f"{detail}: not a Jetson, so no CSI cameras or NVIDIA hardware decode")
    return Check("gst-nv", "warn", f"{detail}: no CSI cameras or hardware decode", NV_FIX)


def check_encoder(cfg: Config | None) -> Check:
    from .capture.gstreamer.encode import encoder_check  # recording (capture/gstreamer/encode.py)

    n = 0 if cfg is None else sum(c.record is not None and not c.uri.startswith("rtsp") for c in cfg.cameras)
    return Check("encoder", *encoder_check(n))


def check_tensorrt(needs: Needs) -> tuple[Check, Any]:
    try:
        import tensorrt
    except ImportError as exc:
        meaning = "engine packages cannot load; ONNX packages run on ONNX Runtime"
        fix = "JetPack's TensorRT: apt-get install python3-libnvinfer (nvidia-jetpack)" if needs.jetson else ""
        status: Status = "fail" if needs.tensorrt else "n/a"
        return Check("tensorrt", status, f"not importable ({exc}): {meaning}", fix, needs.tensorrt), None
    version = str(getattr(tensorrt, "__version__", "?"))
    major = int(version.split(".")[0]) if version[:1].isdigit() else 0
    if major < 10:
        detail = f"TensorRT {version}: edged's engine path needs TensorRT >= 10 (JetPack 6.1+)"
        return Check("tensorrt", "fail" if needs.tensorrt else "warn", detail, "upgrade JetPack", needs.tensorrt), None
    return Check("tensorrt", "ok", f"TensorRT {version} from {_origin(tensorrt.__file__)}", required=needs.tensorrt), (
        tensorrt
    )


def check_gpu(needs: Needs, root: Path, trt: Any) -> list[Check]:
    """The CUDA binding the TensorRT backend uses (cuda-python, else pycuda: which, its version, why), then the
    GPU through it: name, compute capability, free memory, DLA cores."""
    from edged.daemon.backends.tensorrt.cuda import CudaError, load_cuda

    nodes = [n for n in GPU_NODES if (root / n).exists()]
    soc_cc = compat.tegra_compute_capability(root)
    try:
        cuda = load_cuda()
    except BackendError as exc:
        fix = (
            "pip install 'cuda-bindings>=12.6,<13' into edged's venv (edged[tensorrt]); a jetson-jp6 bundle "
            "carries its wheel: run /opt/edged/firstboot.sh again"
        )
        status: Status = "fail" if needs.tensorrt else ("warn" if nodes else "n/a")
        gpu = f"GPU nodes {', '.join('/' + n for n in nodes)}" if nodes else "no NVIDIA GPU device node"
        cc = f", SoC compute capability {soc_cc}" if soc_cc else ""
        detail = f"{exc}: the TensorRT backend cannot allocate buffers"
        return [
            Check("cuda", status, detail, fix if nodes or needs.tensorrt else "", needs.tensorrt),
            Check("gpu", "n/a" if not nodes else "warn", f"{gpu}{cc}; free memory unknown without CUDA"),
        ]
    out = [Check("cuda", "ok", f"{cuda.binding} {cuda.version}: {cuda.why}", required=needs.tensorrt)]
    try:
        cuda.init()
        name, (major, minor) = cuda.device_name(0), cuda.compute_capability(0)
        ctx = cuda.retain_primary(0)
        cuda.push(ctx)
        try:
            free, total = cuda.mem_get_info()
        finally:
            cuda.pop()
            cuda.release(ctx)
    except CudaError as exc:
        status = "fail" if needs.tensorrt else "warn"
        fix = (
            "install the NVIDIA driver (libcuda.so.1; Jetson: JetPack's nvidia-l4t-cuda)"
            if "driver library" in str(exc) or "libcuda" in str(exc)
            else "check /dev/nvidia* or /dev/nvgpu permissions (the edged user is in group video/render)"
        )
        return [*out, Check("gpu", status, f"CUDA cannot start: {exc}", fix, needs.tensorrt)]
    out.append(
        Check("gpu", "ok", f"{name}, compute capability {major}.{minor}, {free >> 20} of {total >> 20} MiB free")
    )
    if trt is not None:
        try:
            dla = int(trt.Builder(trt.Logger(trt.Logger.ERROR)).num_DLA_cores)
            out.append(Check("dla", "ok" if dla else "n/a", f"{dla} DLA cores"))
        except (TypeError, RuntimeError, AttributeError) as exc:
            out.append(Check("dla", "warn", f"TensorRT's builder cannot start: {exc}"))
    return out


def check_l4t(root: Path) -> Check:
    release = compat.l4t_release(root)
    if release is None:
        return Check("l4t", "n/a", "no /etc/nv_tegra_release: not a Jetson (engines built here are for this GPU)")
    major = int(release.split(".")[0])
    if major < 36:
        fix = "flash JetPack 6 (L4T R36): JetPack 5 ships Python 3.8, edged needs 3.10"
        return Check("l4t", "fail", f"L4T R{release} (JetPack 5 or older)", fix, True)
    return Check("l4t", "ok", f"L4T R{release} (JetPack 6)")


def check_sensors(root: Path) -> Check:
    s = Sensors(root)
    reading = s.read()
    found = [
        f"{len(reading.temps_c)} temperatures (max {reading.max_temp_c:.1f} C)"
        if reading.temps_c
        else "no temperatures"
    ]
    if s.rails:
        found.append(f"power rails {', '.join(s.rails)}")
    if s.gpu_name:
        found.append(f"GPU load ({s.gpu_name})")
    detail = "; ".join(found)
    if s.missing:
        return Check("sensors", "warn", f"{detail}; missing: {', '.join(s.missing)}", "the governor skips these")
    return Check("sensors", "ok", detail)


def check_journald(root: Path) -> Check:
    """python3-systemd's JournalHandler (edged.daemon.host.systemd uses it under systemd): without it the journal
    has the daemon's lines from stderr, each at the unit's priority and without edged's fields."""
    if not (root / "run" / "systemd" / "system").is_dir():
        return Check("journald", "n/a", "systemd is not running here: logs are plain lines on stderr")
    fields = "priority and fields (journalctl -p err, journalctl -u edged CAMERA=<camera>)"
    try:
        from systemd import journal  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError as exc:
        detail = (
            f"python3-systemd not importable ({exc}): the journal gets plain stderr lines, so "
            f"journalctl -p err shows no edged error and CAMERA=<camera> finds nothing"
        )
        return Check("journald", "warn", detail, "apt-get install python3-systemd (the venv sees the system's)")
    where = _origin(getattr(journal, "__file__", None))
    detail = f"python3-systemd from {where}: logs to journald with {fields}; CAMERA, EDGED_MODEL, ERROR_CODE"
    return Check("journald", "ok", detail)


def check_state_dir(state_dir: Path) -> Check:
    probe = state_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return Check("state_dir", "fail", f"{state_dir}: {probe} is not a folder", "fix state_dir in the config", True)
    try:
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".edged-doctor-"):
            pass
    except OSError as exc:
        fix = "systemd-tmpfiles --create /usr/lib/tmpfiles.d/edged.conf (owned by the edged user)"
        return Check("state_dir", "fail", f"{state_dir}: not writable by uid {os.geteuid()}: {exc.strerror}", fix, True)
    st = os.statvfs(probe)
    free_mb = st.f_bavail * st.f_frsize >> 20
    made = "" if probe == state_dir else f" (created on first start, in {probe})"
    detail = f"{state_dir}: writable, {free_mb} MiB free{made}"
    if free_mb < MIN_FREE_MB:
        return Check("state_dir", "fail", detail, "free space: the spool and the model store need room", True)
    if free_mb < LOW_FREE_MB:
        return Check("state_dir", "warn", detail, "little room for the spool and new model versions")
    return Check("state_dir", "ok", detail, required=True)


def check_broker(cfg: Config, timeout_s: float = 5.0) -> Check:
    import paho.mqtt.client as mqtt

    from edged.protocol.client import make_client

    where = f"{cfg.mqtt.host}:{cfg.mqtt.port}" + (" over TLS" if cfg.mqtt.tls else "")
    who = f" with {cfg.mqtt.tls.cert_file.name}" if cfg.mqtt.tls and cfg.mqtt.tls.cert_file else ""
    try:
        client = make_client(cfg.mqtt, f"edged-doctor-{cfg.device_id}")
    except EdgedError as exc:  # certificate or password files: the daemon would fail the same way
        return Check("broker", "fail", str(exc), "fix mqtt.tls / mqtt.password_file in the config", True)
    done = threading.Event()
    result: list[str] = []

    def on_connect(c: mqtt.Client, u: Any, flags: Any, rc: Any, props: Any = None) -> None:
        result.append("" if not rc.is_failure else str(rc))
        done.set()

    client.on_connect = on_connect
    try:
        client.connect(cfg.mqtt.host, cfg.mqtt.port, keepalive=10)
        client.loop_start()
        done.wait(timeout_s)
    except OSError as exc:  # refused, unreachable, TLS handshake (ssl.SSLError is an OSError)
        result.append(f"cannot connect: {exc}")
    finally:
        client.loop_stop()
        client.disconnect()
        sock = client.socket()
        if sock is not None:
            sock.close()
    fix = "results are spooled until it is; check mqtt.host/port, the broker, and the device's certificate"
    if not result:
        return Check("broker", "warn", f"{where}: no answer within {timeout_s:g} s", fix)
    if result[0]:
        return Check("broker", "warn", f"{where}{who}: {result[0]}", fix)
    return Check("broker", "ok", f"{where}{who}: connected")


def check_model(cfg: Config, root: Path, trt_version: str | None) -> Check:
    from .lifecycle.loader import resolve_package

    try:
        pkg = resolve_package(cfg)
    except EdgedError as exc:
        return Check("model", "fail", str(exc), "edged model install PKG.tar -c CONFIG", True)
    m = pkg.manifest
    what = f"{m.name} v{m.version} ({m.kind}, {m.precision})"
    if m.kind == "engine":
        facts = compat.DeviceFacts.read(root, tensorrt=trt_version)
        problems = compat.mismatches(m.compatibility, facts)
        if problems:
            return Check("model", "fail", f"{what}: {'; '.join(problems)}", "edged build-engine on this device", True)
        return Check("model", "ok", f"{what}: built for this device", required=True)
    try:
        import onnxruntime
    except ImportError as exc:
        return Check("model", "fail", f"{what}: ONNX Runtime does not import: {exc}", "reinstall the bundle", True)
    return Check("model", "ok", f"{what}: runs on ONNX Runtime {onnxruntime.__version__}", required=True)


def run_checks(cfg: Config | None, root: Path = Path("/"), broker_timeout_s: float = 5.0) -> list[Check]:
    """Every check, in order; a check that raises becomes a failing line naming the exception (this is the
    boundary where an unexpected library error is reported instead of ending the report)."""
    needs = needs_of(cfg, root)
    out: list[Check] = []

    def guard(name: str, fn: Callable[[], Check | list[Check]]) -> None:
        try:
            got = fn()
        except Exception as exc:  # the doctor reports a broken check, it does not crash
            got = Check(name, "fail", f"the check itself failed: {type(exc).__name__}: {exc}", required=True)
        out.extend(got if isinstance(got, list) else [got])

    guard("python", check_python)
    guard("numpy", lambda: check_numpy(needs))
    guard("opencv", lambda: check_opencv(needs))
    cameras = None if cfg is None else [_guarded_path(c) for c in cfg.cameras]
    guard("gstreamer", lambda: check_gstreamer(cameras))
    guard("gst-nv", lambda: check_gst_elements(needs))
    guard("encoder", lambda: check_encoder(cfg))
    if cameras is not None:
        guard("capture", lambda: check_capture(cameras))
    trt_box: list[Any] = [None]

    def trt_check() -> Check:
        check, trt_box[0] = check_tensorrt(needs)
        return check

    guard("tensorrt", trt_check)
    guard("gpu", lambda: check_gpu(needs, root, trt_box[0]))
    guard("l4t", lambda: check_l4t(root))
    guard("sensors", lambda: check_sensors(root))
    guard("journald", lambda: check_journald(root))
    if cfg is None:
        out.append(Check("config", "n/a", "no config given: state_dir, broker and model not checked", "-c CONFIG"))
        return out
    guard("state_dir", lambda: check_state_dir(cfg.state_dir))
    guard("broker", lambda: check_broker(cfg, broker_timeout_s))
    version = str(trt_box[0].__version__) if trt_box[0] is not None else None
    guard("model", lambda: check_model(cfg, root, version))
    return out


def failed(checks: list[Check], strict: bool = False) -> list[Check]:
    """The checks that make the exit status 1: required failures (with `strict`, warnings too)."""
    return [c for c in checks if c.status == "fail" or (strict and c.status == "warn")]


def to_json(checks: list[Check], strict: bool = False) -> dict[str, Any]:
    return {
        "schema": "edged.doctor/1",
        "machine": platform.machine(),
        "ok": not failed(checks, strict),
        "checks": [asdict(c) for c in checks],
    }
