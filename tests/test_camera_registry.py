"""The camera source registry (daemon/capture/registry.py): one row per scheme family, and the config check,
both capture paths, check-config's probe and doctor read it; no scheme chains left elsewhere."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from edged.daemon.capture import registry, sources
from edged.daemon.capture.probe import check_camera
from edged.daemon.capture.registry import BY_SCHEME, GST_SCHEMES, NETWORK_SCHEMES, SCHEMES, SOURCE_TYPES, source_type
from edged.daemon.config import CameraConfig
from edged.daemon.doctor import camera_path
from edged.errors import CaptureError

from .conftest import REPO


def test_each_scheme_has_one_row_and_the_sets_come_from_the_rows() -> None:
    schemes = [s for t in SOURCE_TYPES for s in t.schemes]
    assert len(schemes) == len(set(schemes)) == len(SCHEMES)
    first = {"file", "v4l2", "rtsp", "rtsps", "http", "https", "csi", "gst", "synthetic"}  # the types before the table
    assert first <= SCHEMES
    assert {"file", "v4l2", "rtsp", "rtsps", "csi", "gst"} == GST_SCHEMES  # what the GStreamer path opened before
    assert {"rtsp", "rtsps", "http", "https"} == NETWORK_SCHEMES & first
    assert {s for t in SOURCE_TYPES if t.network for s in t.schemes} == NETWORK_SCHEMES


def test_every_opener_resolves_to_a_function_of_its_module() -> None:
    """The first types open through sources.py (OpenCV imported there, not at config load): each name a row
    gives must be a function there, or that type could not open at all."""
    for row in SOURCE_TYPES:
        target = getattr(sources, row.open, None) if isinstance(row.open, str) else row.open
        assert callable(target), f"{row.name}: opener {row.open} not found in sources.py"


def test_the_config_loader_and_the_registry_load_no_opencv() -> None:
    """`edged push -c`/`edged watch -c` load the config: the table they validate URIs by pulls in no OpenCV,
    numpy or GStreamer (every source type's module is light at import)."""
    code = (
        "import sys, edged.daemon.config, edged.daemon.capture.registry\n"
        "bad = [m for m in ('cv2', 'numpy', 'gi') if m in sys.modules]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_uri_description_and_the_scheme_error_list_every_row() -> None:
    described = CameraConfig.model_fields["uri"].description or ""
    for row in SOURCE_TYPES:
        assert row.form in described
    with pytest.raises(ValueError, match="scheme must be one of") as err:
        CameraConfig.model_validate({"name": "c", "uri": "ftp://u:pw@cam/x"})
    said = str(err.value).splitlines()[2].split(" [type=")[0]  # the message, not pydantic's quote of the input
    assert all(f"{s}://" in said for s in SCHEMES) and "pw" not in said, said


def test_no_scheme_chains_left_in_the_modules_that_read_the_table() -> None:
    chain = re.compile(r"""scheme\s*(==|!=|in|not in)\s*[{("']""")  # `if scheme == "csi"`, `scheme in {…}`
    for name in ("capture/sources.py", "capture/uri.py", "capture/probe.py", "config/cameras.py"):
        text = (REPO / "daemon" / name).read_text()
        found = [line.strip() for line in text.splitlines() if chain.search(line)]
        assert not found, f"daemon/{name}: {found}"
    doctor = (REPO / "daemon" / "doctor.py").read_text()
    body = doctor[doctor.index("def camera_path(") : doctor.index("def _guarded_path(")]
    assert not [line for line in body.splitlines() if chain.search(line)]


def test_plans_open_paths_and_doctor_lines_come_from_the_rows(tmp_path) -> None:
    video = tmp_path / "v.mp4"
    video.write_bytes(b"")  # there (check-config looks, it does not open)
    assert registry.plan(f"file://{video}", set(), 200, "auto", 5.0).description.startswith("filesrc name=src")
    with pytest.raises(CaptureError, match=r"no GStreamer pipeline for http://"):
        registry.plan("http://cam/video.mjpg", set(), 200, "auto", 5.0)
    mjpeg = CameraConfig.model_validate({"name": "m", "uri": "http://cam.local/video.mjpg"})
    assert source_type(mjpeg.uri) is BY_SCHEME["http"]
    assert check_camera(mjpeg) == "edged"
    assert camera_path(mjpeg).path == "edged's MJPEG reader, else OpenCV/FFmpeg" and not camera_path(mjpeg).problem
    synth = CameraConfig.model_validate({"name": "p", "uri": "synthetic://"})
    assert camera_path(synth).path == "synthetic frames" and check_camera(synth) == "edged"
    missing = CameraConfig.model_validate({"name": "f", "uri": f"file://{tmp_path}/none.mp4"})
    with pytest.raises(CaptureError, match=r"no such file .*none\.mp4"):
        check_camera(missing)
    with pytest.raises(CaptureError, match=r"no such file$"):
        sources.open_source(missing)
