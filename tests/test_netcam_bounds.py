"""A camera's frame over `max_frame_pixels` is refused before it is decoded, counted, and the camera goes on.

The case from the field: one 16,000 x 16,000 MJPEG frame (3 MB as a JPEG of one grey; 768 MB decoded as
BGR) took the daemon's RSS from 0.2 to 2.44 GB. Here it comes from the real MJPEG server between the usual
frames, to a real daemon publishing to a real mosquitto; and through real GStreamer pipelines.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import cv2
import jsonschema
import numpy as np
import pytest

from edged.daemon.capture import registry
from edged.daemon.capture import uri as gstpipe
from edged.daemon.capture.framebound import MAX_FRAME_PIXELS, FrameBound, jpeg_size
from edged.daemon.capture.gstreamer import pipeline as gst
from edged.daemon.capture.netcam import open_http
from edged.errors import CaptureError, ConfigError
from edged.models.demo import DemoAssets
from edged.protocol import TELEMETRY_SCHEMA, schema

from .conftest import base_config, free_port, wait_until, write_config
from .test_capture import mjpeg_server

HUGE = 16_000  # the frame: 16,000 x 16,000


def jpeg(img: np.ndarray, *params: int) -> bytes:
    ok, data = cv2.imencode(".jpg", img, list(params))
    assert ok
    return bytes(data.tobytes())


@pytest.fixture(scope="module")
def huge_jpeg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 16,000 x 16,000 JPEG, encoded by OpenCV (one grey: 256 MB to encode here, 3 MB of bytes)."""
    path = tmp_path_factory.mktemp("huge") / "huge.jpg"
    path.write_bytes(jpeg(np.full((HUGE, HUGE), 128, np.uint8)))
    return path


# --- the frame header ---------------------------------------------------------------------------------


def test_jpeg_size_reads_the_frame_header_of_real_jpegs() -> None:
    img = np.random.default_rng(1).integers(0, 255, (240, 320, 3), np.uint8)
    assert jpeg_size(jpeg(img)) == (320, 240)
    assert jpeg_size(jpeg(img, cv2.IMWRITE_JPEG_PROGRESSIVE, 1)) == (320, 240)  # SOF2
    assert jpeg_size(jpeg(img[:, :, 0])) == (320, 240)  # one component
    data = jpeg(img)
    # an APP1 segment (EXIF, as cameras add; its bytes hold 0xFF 0xC0) and fill bytes before the next marker
    app1 = b"\xff\xe1" + (2 + 8).to_bytes(2, "big") + b"Exif\xff\xc0\x00\x00"
    assert jpeg_size(data[:2] + app1 + b"\xff\xff" + data[2:]) == (320, 240)
    sof = data.index(b"\xff\xc0")
    assert jpeg_size(data[: sof + 6]) is None  # cut short in its frame header
    assert jpeg_size(data[:sof] + b"\xff\xd9") is None  # ends before one
    ok, png = cv2.imencode(".png", img)
    assert ok and jpeg_size(png.tobytes()) is None  # cv2 would decode a PNG of any size: not a camera's JPEG
    assert jpeg_size(b"") is None and jpeg_size(b"\xff\xd8") is None


def test_max_frame_pixels_is_validated_with_its_key_path(tmp_path: Path) -> None:
    from edged.daemon.config import load_config

    cam = {"name": "a", "uri": "synthetic://", "max_frame_pixels": 0}
    doc = {"device_id": "d", "mqtt": {"host": "h"}, "model": {"package": str(tmp_path)}, "cameras": [cam]}
    with pytest.raises(ConfigError, match=r"cameras\[0\]\.max_frame_pixels: Input should be greater than or equal"):
        load_config(write_config(tmp_path / "c.yaml", doc), environ={})


# --- MJPEG over HTTP ----------------------------------------------------------------------------------


def test_an_mjpeg_camera_skips_a_huge_frame_and_reads_the_next(huge_jpeg: Path) -> None:
    """The reader refuses the part by its header, counts it and returns the next usual frame. The server
    sends every 3rd frame huge, so six reads pass at least two of them."""
    port = free_port()
    server = mjpeg_server(port, "--fps", "30", "--big", str(huge_jpeg), "--big-every", "3")
    bound = FrameBound("ip")
    source = open_http(f"http://127.0.0.1:{port}/video.mjpg", 5.0, bound)
    try:
        assert source is not None
        sizes = []
        for _ in range(6):
            frame = source.read()
            assert frame is not None
            sizes.append(frame.shape)
    finally:
        if source is not None:
            source.close()
        server.kill()
        server.wait()
    assert set(sizes) == {(240, 320, 3)}, sizes
    assert bound.refused >= 2 and source.bad_parts == 0


def test_the_daemon_refuses_huge_mjpeg_frames_counts_them_and_keeps_serving(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path, huge_jpeg: Path
) -> None:
    """On the code before the bound: the frame was decoded (768 MB of BGR, more in the resize), the daemon's
    peak RSS passed 1 GB and telemetry had no frames_refused."""
    port = free_port()
    server = mjpeg_server(port, "--fps", "10", "--big", str(huge_jpeg), "--big-every", "5")
    sub = subscribe(broker, "edged/#")
    cams: list[dict[str, Any]] = [{"name": "ip", "uri": f"http://127.0.0.1:{port}/video.mjpg", "stall_timeout_s": 5}]
    d = start_daemon(write_config(tmp_path / "c.yaml", base_config(broker, demo, tmp_path, cams)))

    def telemetry() -> dict[str, Any]:
        tel = sub.on("telemetry")
        return tel[-1].json() if tel else {}

    def refused() -> int:
        return int(telemetry().get("cameras", {}).get("ip", {}).get("frames_refused", 0))

    try:
        wait_until(lambda: refused() >= 2, 90, f"two huge frames refused in telemetry; log:\n{d.output()[-3000:]}")
        n = len(sub.results("ip"))
        wait_until(lambda: len(sub.results("ip")) >= n + 10, 30, "results after the refusals")
        k = refused()
        wait_until(lambda: refused() > k, 30, "a later huge frame refused too")
        doc = telemetry()
        assert d.stop() == 0, d.output()[-3000:]
    finally:
        server.kill()
        server.wait()
    jsonschema.validate(doc, schema(TELEMETRY_SCHEMA))
    cam = doc["cameras"]["ip"]
    assert cam["state"] == "up" and cam["stalls"] == 0 and cam["reconnects"] == 0, cam
    # the peak over the whole run: a 16k frame decoded at all (768 MB of BGR) would show here
    peak = doc["memory"]["peak_rss_mb"]
    print(f"\ndaemon peak RSS {peak} MB with {cam['frames_refused']} huge frames refused, {cam['frames']} taken")
    assert peak < 450, f"peak RSS {peak} MB"
    log = d.output()
    # logged once (then at most once a minute): not a line per frame
    assert log.count(f"refused a {HUGE}x{HUGE} frame") == 1, log[-3000:]
    assert f"over max_frame_pixels {MAX_FRAME_PIXELS}" in log


# --- GStreamer ----------------------------------------------------------------------------------------

needs_gst = pytest.mark.skipif(not gst.available(), reason=f"GStreamer unavailable: {gst.why_unavailable()}")

HUGE_THROUGH_GST = """
import sys
from edged.daemon.capture import registry
from edged.daemon.capture import uri as gstpipe
from edged.daemon.capture.framebound import FrameBound
from edged.daemon.capture.gstreamer import pipeline as gst
from edged.errors import CaptureError

desc = f"filesrc location={sys.argv[1]} ! decodebin name=dec ! videoconvert ! video/x-raw,format=BGR"
desc += " ! appsink name=sink"
bound = FrameBound("big", int(sys.argv[2]))
try:
    gst.GstSource(gstpipe.Plan(desc, {}, False, False), 20.0, shown="big", bound=bound).close()
    print("opened")
except CaptureError as exc:
    print("refused:", exc)
# the kernel's VmHWM of this address space: ru_maxrss would survive the exec, and start at the RSS of the forked
# test worker (over a GB late in a suite)
hwm = next(ln.split()[1] for ln in open("/proc/self/status").read().splitlines() if ln.startswith("VmHWM:"))
print("counted", bound.refused, "peak_rss_mb", int(hwm) // 1024)
"""


@needs_gst
def test_gstreamer_drops_a_huge_frame_before_its_decoder(huge_jpeg: Path) -> None:
    """The decoder's input caps (typefind/parser) say 16,000 x 16,000: its buffers are dropped before jpegdec.
    A process of its own, so its peak RSS is the pipeline's: without the bound it decodes the frame (measured
    here: a peak of 2.5 GB)."""
    out = subprocess.run(
        [sys.executable, "-c", HUGE_THROUGH_GST, str(huge_jpeg), str(MAX_FRAME_PIXELS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "refused: big: no frame: its frames are over max_frame_pixels" in out.stdout, out.stdout + out.stderr
    counted, peak = out.stdout.split("counted ")[1].split(" peak_rss_mb ")
    assert int(counted) == 1, out.stdout  # unparsed chunks of one image: one frame, not one per buffer
    # 75 MB: the VmHWM of the script's own address space (ru_maxrss, read before, survives the exec and starts at
    # the forked worker's RSS: 1.3 GB late in a suite), far from the 2.5 GB of a decoded 16k x 16k frame
    assert int(peak) < 1000, out.stdout


@needs_gst
def test_gstreamer_counts_each_parsed_frame_over_the_bound(demo: DemoAssets) -> None:
    """The demo video (960 x 540, H.264 through h264parse) against a bound below its size: every frame is
    dropped before the decoder and counted one by one; the open fails saying why."""
    bound = FrameBound("door", 960 * 540 - 1)
    p = registry.plan(f"file://{demo.video}", gst.have(), 200, "auto", 5.0)
    with pytest.raises(CaptureError, match="over max_frame_pixels 518399"):
        gst.GstSource(p, 5.0, None, threading.Event(), "door", bound=bound)
    assert bound.refused > 10  # the file's frames, each refused (it has hundreds; the read may end earlier)


@needs_gst
def test_gstreamer_without_a_decoder_checks_the_sample_before_mapping_it() -> None:
    desc = "videotestsrc num-buffers=20 ! video/x-raw,width=320,height=240 ! videoconvert ! appsink name=sink"
    bound = FrameBound("test", 320 * 240 - 1)
    with pytest.raises(CaptureError, match="over max_frame_pixels 76799"):
        gst.GstSource(gstpipe.Plan(desc, {}, False, False), 5.0, shown="test", bound=bound)
    assert bound.refused == 20
    ok = FrameBound("test", 320 * 240)
    source = gst.GstSource(gstpipe.Plan(desc, {}, False, False), 5.0, shown="test", bound=ok)
    try:
        frame = source.read()
        assert frame is not None and frame.shape == (240, 320, 3) and ok.refused == 0
    finally:
        source.close()
