"""rtsps:// cameras with a self-signed certificate, against a real RTSP-over-TLS server (gst-rtsp-server's
set_tls_certificate in tests/rtsp_server.py): pinned by `tls_ca_file` (the camera's own certificate),
refused with the reason when it does not verify, and `tls_verify: false` accepted but warned about. On
the GStreamer path (rtspsrc's tls-database and accept-certificate) and on the OpenCV/FFmpeg path (edged
checks the certificate on its own probe connection; FFmpeg's own connection is not verified)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from edged.daemon.capture.gstreamer import pipeline as gst
from edged.daemon.capture.sources import open_source, tls_warnings
from edged.daemon.config import CameraConfig
from edged.errors import CaptureError
from edged.models.demo import DemoAssets

from .conftest import base_config, edged_cli, write_config
from .test_capture_gst import RtspServer, camera, taken_sizes

pytestmark = pytest.mark.skipif(not gst.available(), reason=f"GStreamer (RTSP server): {gst.why_unavailable()}")


def self_signed(folder: Path, name: str) -> tuple[Path, Path]:
    """A camera's self-signed certificate for 127.0.0.1, as `openssl req -x509` makes one."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(key, hashes.SHA256())
    )
    crt, pem = folder / f"{name}.crt", folder / f"{name}.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return crt, pem


@pytest.fixture
def rig() -> Iterator[tuple[threading.Condition, threading.Event]]:
    cond, stop = threading.Condition(), threading.Event()
    yield cond, stop
    stop.set()


@pytest.fixture
def tls_server(demo: DemoAssets, tmp_path: Path) -> Iterator[tuple[RtspServer, Path, Path]]:
    """An rtsps:// camera with a self-signed certificate; (server, its certificate, another camera's)."""
    crt, key = self_signed(tmp_path, "camera")
    other, _ = self_signed(tmp_path, "other-camera")
    server = RtspServer(demo.video, "--protocols", "tcp", "--tls-cert", str(crt), "--tls-key", str(key))
    yield server, crt, other
    server.stop()


def rtsps(server: RtspServer) -> str:
    return server.uri().replace("rtsp://", "rtsps://")


@pytest.mark.parametrize("backend", ["gstreamer", "opencv"])
def test_a_self_signed_camera_pinned_by_its_certificate_streams(
    backend: str, tls_server: tuple[RtspServer, Path, Path], rig: tuple[threading.Condition, threading.Event]
) -> None:
    server, crt, _ = tls_server
    cond, stop = rig
    cfg = {"name": "tls", "uri": rtsps(server), "tls_ca_file": str(crt), "backend": backend, "fps_max": 30}
    cam = camera(cfg, cond, stop)
    cam.start()
    assert set(taken_sizes(cam, cond, 10, 30)) == {(960, 540)} and cam.stats.state == "up"
    warned = tls_warnings(CameraConfig.model_validate(cfg))
    assert warned == [] if backend == "gstreamer" else "FFmpeg's RTSP connection is not verified" in warned[0]


@pytest.mark.parametrize("backend", ["gstreamer", "opencv"])
def test_a_certificate_that_does_not_verify_is_refused_with_the_reason(
    backend: str, tls_server: tuple[RtspServer, Path, Path]
) -> None:
    server, _, other = tls_server
    # no tls_ca_file: the system's CAs do not know a self-signed camera
    cam = CameraConfig(name="sys", uri=rtsps(server), backend=backend, stall_timeout_s=5)
    with pytest.raises(CaptureError, match="TLS: the camera's certificate does not verify against the system's CAs"):
        open_source(cam).close()
    # another camera's certificate pinned: refused, naming the file and the fix
    cam = CameraConfig(name="pin", uri=rtsps(server), backend=backend, stall_timeout_s=5, tls_ca_file=other)
    with pytest.raises(CaptureError) as err:
        open_source(cam).close()
    text = str(err.value)
    assert f"does not verify against tls_ca_file {other}" in text and "give the camera's CA" in text
    if backend == "gstreamer":  # GStreamer says which check failed
        assert "not signed by a trusted CA" in text


def test_tls_verify_false_streams_and_is_warned_at_start_and_by_check_config(
    tls_server: tuple[RtspServer, Path, Path],
    rig: tuple[threading.Condition, threading.Event],
    demo: DemoAssets,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, _, _ = tls_server
    cond, stop = rig
    cfg = {"name": "lax", "uri": rtsps(server), "tls_verify": False, "backend": "gstreamer"}
    cam = camera(cfg, cond, stop)
    cam.start()
    taken_sizes(cam, cond, 5, 30)
    assert "camera lax: tls_verify is false: the camera's certificate is not checked" in caplog.text

    class Broker:
        host, port = "127.0.0.1", 1

    doc = base_config(Broker(), demo, tmp_path, [cfg])
    run = edged_cli("check-config", "--no-model", "-c", str(write_config(tmp_path / "c.yaml", doc)))
    assert run.returncode == 0, run.stderr
    assert "camera lax: rtsps://127.0.0.1" in run.stderr and "WARNING: tls_verify is false" in run.stderr


def test_tls_options_are_for_rtsps_and_do_not_contradict(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="for rtsps:// cameras"):
        CameraConfig(name="a", uri="rtsp://cam/x", tls_verify=False)
    with pytest.raises(ValueError, match="give one of them"):
        CameraConfig(name="a", uri="rtsps://cam/x", tls_verify=False, tls_ca_file=tmp_path / "ca.pem")
