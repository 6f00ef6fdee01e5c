"""The chaos soak's rig: the processes it runs and hurts (see soak_chaos.py).

- a real mosquitto on 127.0.0.1 with persistence (sessions survive a SIGKILL and restart on the same port);
- a real RTSP camera (tests/rtsp_server.py, gst-rtsp-server in its own process) serving the demo video
  encoded once to H.264, which the schedule kills and starts again on the same port;
- the daemon as its own process (`python -m edged run -c CFG`), on one looping file camera (the demo
  video: 20 s, so a loop wrap every 20 s) and the RTSP camera, with a model installed in its store from a
  signed package, so `edged push` can hot-swap a newer version over the air.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from edged.models.demo import DemoAssets  # noqa: E402
from edged.models.package import pack_tar, write_package  # noqa: E402
from edged.models.signing import SigningKey, generate_key, load_signing_key  # noqa: E402
from tests.conftest import Broker, free_port  # noqa: E402  (the tests' mosquitto, as bench/swap.py uses it)

__all__ = ["Broker", "Camera", "Daemon", "Packages", "broker_kill", "daemon_config", "edged", "h264_video"]

DEVICE = "soak-01"
MODEL = "blazeface-back"
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def h264_video(src: Path, out: Path) -> Path:
    """`src` encoded once to H.264 at 640x360 (the demo video is MPEG-4 part 2): the RTSP server then only
    sends the file, and the daemon decodes what an IP camera sends."""
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_suffix(".part.mp4")
    enc = ["videoscale", "!", "video/x-raw,width=640,height=360", "!", "videoconvert", "!"]
    enc += ["openh264enc", "complexity=low", "bitrate=1000000", "!", "h264parse", "!", "mp4mux"]
    cmd = ["gst-launch-1.0", "-q", "filesrc", f"location={src}", "!", "qtdemux", "!", "decodebin", "!", *enc]
    r = subprocess.run([*cmd, "!", "filesink", f"location={part}"], timeout=600, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"encoding {src} to H.264 failed: {r.stderr[-2000:]}")
    part.rename(out)
    return out


class Camera:
    """tests/rtsp_server.py on a fixed port: kill() and start() it at will."""

    def __init__(self, video: Path, log: Path) -> None:
        self.port = free_port()
        self.video, self.log = video, log
        self.proc: subprocess.Popen[str] | None = None

    @property
    def uri(self) -> str:
        return f"rtsp://127.0.0.1:{self.port}/cam"

    def start(self, timeout_s: float = 60.0) -> None:
        """Start it and wait for its "ready" (it prints that once it listens; it exits when the port is not
        free yet, e.g. a killed server's connections in TIME_WAIT: tried again every second)."""
        end = time.monotonic() + timeout_s
        while True:
            with open(self.log, "a") as err:
                self.proc = subprocess.Popen(
                    [sys.executable, str(REPO / "tests" / "rtsp_server.py"), str(self.port), str(self.video), "--h264"],
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                )
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline()
            if line.strip() == "ready":
                return
            self.kill()
            if time.monotonic() > end:
                raise RuntimeError(f"rtsp_server.py on port {self.port} did not start: {line!r}")
            time.sleep(1.0)

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(10)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        self.proc = None


def broker_kill(b: Broker) -> None:
    """SIGKILL: no clean shutdown, no final save; what persistence had saved (every second) survives."""
    if b.proc is not None and b.proc.poll() is None:
        b.proc.kill()
        b.proc.wait(10)
    b.proc = None


class Packages:
    """Signed packages of the demo BlazeFace, one per version, and the key devices trust."""

    def __init__(self, demo: DemoAssets, work: Path) -> None:
        key_path, pub = generate_key(work / "signer")
        self.trusted = work / "trusted"
        self.trusted.mkdir(exist_ok=True)
        (self.trusted / pub.name).write_text(pub.read_text())
        self.key: SigningKey = load_signing_key(key_path)
        src = demo.packages[MODEL]
        self.fields = src.manifest.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
        self.files = {"model.onnx": src.model_path, "labels.txt": src.root / "labels.txt"}
        self.work = work

    def build(self, version: int) -> Path:
        pkg = write_package(self.work / f"pkg-{version}", {**self.fields, "version": version}, self.files)
        return Path(pack_tar(pkg, self.work / f"v{version}.tar", self.key.sign(pkg.manifest_bytes)))


def daemon_config(demo: DemoAssets, work: Path, broker: Broker, camera: Camera, trusted: Path) -> Path:
    doc: dict[str, Any] = {
        "device_id": DEVICE,
        "state_dir": str(work / "state"),
        "mqtt": {"host": broker.host, "port": broker.port, "reconnect_max_s": 4},
        "model": {
            "name": MODEL,
            "keys_dir": str(trusted),
            "probation_s": 60,
            "probation_batches": 200,
            "onnxruntime": {"threads": 1},
        },
        "cameras": [
            {"name": "lobby", "uri": f"file://{demo.video}", "loop": True, "fps_max": 10},
            {
                "name": "gate",
                "uri": camera.uri,
                "fps_max": 5,
                "stall_timeout_s": 5,
                "reconnect_min_s": 0.5,
                "reconnect_max_s": 2,
            },
        ],
        "inference": {"max_wait_ms": 20},
        "detection": {"score_threshold": 0.7},
        "ota": {"chunk_kb": 64, "window": 4, "retry_s": 2},
        "telemetry": {"interval_s": 5},
    }
    path = work / "soak.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def edged(*args: str, work: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The edged CLI; `edged push` keeps its rollout state under $XDG_STATE_HOME: the run's, not the user's."""
    env = {**ENV, "XDG_STATE_HOME": str(work / "xdg-state")}
    return subprocess.run(
        [sys.executable, "-m", "edged", *args], capture_output=True, text=True, timeout=timeout, cwd=work, env=env
    )


class Daemon:
    """`python -m edged run -c CFG` as its own process, started in CFG's folder; its log in a file."""

    def __init__(self, cfg: Path, log: Path) -> None:
        self.cfg, self.log = cfg, log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "edged", "run", "-c", str(cfg)],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=cfg.parent,  # not the checkout: $PYTHONPATH can then point the daemon at another tree
                env=ENV,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout_s: float = 60.0) -> int:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return -9


def stacks(pid: int, work: Path) -> str:
    """Every thread's stack of a process, into WORK/stacks-PID-N.txt: Python's by py-spy (on $PATH or in
    $SOAK_PYSPY), the kernel's wait channel of each thread from /proc. Returns where it went."""
    out = work / f"stacks-{pid}-{time.monotonic_ns()}.txt"
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        try:
            name = (task / "comm").read_text().strip()
            wchan = (task / "wchan").read_text().strip()
        except OSError:
            continue
        lines.append(f"{task.name} {name}: {wchan}")
    spy = os.environ.get("SOAK_PYSPY") or shutil.which("py-spy")
    if spy:
        r = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
        lines += ["", r.stdout, r.stderr]
    out.write_text("\n".join(lines) + "\n")
    return f"stacks in {out}"
