"""`edged doctor` through the real CLI: this machine against a real mosquitto (up, down, over TLS with a
client certificate, with a stranger's certificate), an unwritable state_dir, and the Jetson sysfs
fixture trees the sensor tests use (L4T, SoC compute capability, sensors, JetPack 5 refused)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from edged.deploy import certs
from edged.models.demo import DemoAssets
from tests.conftest import Broker, base_config, edged_cli, write_config
from tests.sysfs_fixtures import BOARDS, put


def config(tmp_path: Path, b: Any, demo: DemoAssets, **extra: Any) -> Path:
    doc = base_config(b, demo, tmp_path, [{"name": "cam", "uri": f"file://{demo.video}"}], **extra)
    return write_config(tmp_path / "edged.yaml", doc)


def doctor(*args: str) -> tuple[int, dict[str, dict[str, Any]], str]:
    r = edged_cli("doctor", "--json", "--broker-timeout", "5", *args)
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "edged.doctor/1" and doc["ok"] == (r.returncode == 0)
    text = edged_cli("doctor", "--broker-timeout", "5", *args).stdout
    return r.returncode, {c["name"]: c for c in doc["checks"]}, text


def test_this_machine_with_a_broker(broker: Broker, demo: DemoAssets, tmp_path: Path) -> None:
    rc, checks, text = doctor("-c", str(config(tmp_path, broker, demo)))
    assert rc == 0, text
    for name in ("config", "python", "numpy", "opencv", "state_dir", "broker", "model"):
        assert checks[name]["status"] == "ok", checks[name]
    assert f"127.0.0.1:{broker.port}: connected" in checks["broker"]["detail"]
    assert "blazeface-back v1 (onnx" in checks["model"]["detail"] and "ONNX Runtime" in checks["model"]["detail"]
    # no GPU, no TensorRT, no Jetson here: said, with what it means, and not a failure for an ONNX model
    assert checks["tensorrt"]["status"] == "n/a" and "ONNX packages run on ONNX Runtime" in checks["tensorrt"]["detail"]
    assert checks["l4t"]["status"] == "n/a" and not checks["l4t"]["required"]
    assert text.splitlines()[-1] == "doctor: edged can run here"
    assert all(line.split()[0] in {"ok", "FAIL", "warn", "n/a"} for line in text.splitlines()[:-1]), text


def test_broker_down_is_a_warning_and_strict_fails(broker: Broker, demo: DemoAssets, tmp_path: Path) -> None:
    cfg = config(tmp_path, broker, demo)
    broker.stop()
    rc, checks, text = doctor("-c", str(cfg))
    assert rc == 0, text  # the daemon spools until the broker is back: advisory
    assert checks["broker"]["status"] == "warn" and "Connection refused" in checks["broker"]["detail"]
    assert "warn broker" in text and "results are spooled" in text
    r = edged_cli("doctor", "-c", str(cfg), "--strict")
    # broker, sensors (OpenCV without GStreamer is n/a here: capture goes through PyGObject's GStreamer)
    assert r.returncode == 1 and "doctor: 2 warning(s) (--strict)" in r.stdout, r.stdout


def test_unwritable_state_dir_fails(broker: Broker, demo: DemoAssets, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a folder\n")
    cfg = config(tmp_path, broker, demo, state_dir=str(tmp_path / "afile" / "state"))
    rc, checks, text = doctor("-c", str(cfg))
    assert rc == 1
    assert checks["state_dir"]["status"] == "fail" and checks["state_dir"]["required"]
    assert "FAIL state_dir" in text and "is not a folder" in text and "[required]" in text
    assert text.splitlines()[-1].startswith("doctor: 1 required check(s) failed")


def test_a_bad_config_fails_with_its_key(tmp_path: Path) -> None:
    bad = write_config(tmp_path / "bad.yaml", {"device_id": "x", "model": {}, "cameras": []})
    rc, checks, _ = doctor("-c", str(bad))
    assert rc == 1 and checks["config"]["status"] == "fail" and "cameras" in checks["config"]["detail"]
    assert "python" in checks  # the machine's checks still run


def test_broker_over_tls_with_the_configured_identity(demo: DemoAssets, tmp_path: Path) -> None:
    from tests.test_tls import tls_broker

    pki = tmp_path / "pki"
    certs.make_ca(pki)
    certs.make_cert(pki, "server", hosts=["localhost", "127.0.0.1"])
    certs.make_cert(pki, "test-01")
    other = tmp_path / "other"
    certs.make_ca(other, name="someone else's CA")
    certs.make_cert(other, "test-01")
    (tmp_path / "b").mkdir()
    b = tls_broker(tmp_path / "b", pki)
    b.start()
    try:
        tls = {
            "ca_file": str(pki / "ca.crt"),
            "cert_file": str(pki / "test-01.crt"),
            "key_file": str(pki / "test-01.key"),
        }
        good = config(tmp_path, b, demo)
        doc = yaml.safe_load(good.read_text())
        doc["mqtt"]["tls"] = tls
        rc, checks, text = doctor("-c", str(write_config(tmp_path / "tls.yaml", doc)))
        assert rc == 0 and checks["broker"]["status"] == "ok", text
        assert "over TLS with test-01.crt: connected" in checks["broker"]["detail"]
        # a certificate from a CA the broker does not trust: the handshake is refused, said so
        doc["mqtt"]["tls"] = {**tls, "cert_file": str(other / "test-01.crt"), "key_file": str(other / "test-01.key")}
        rc, checks, text = doctor("-c", str(write_config(tmp_path / "rogue.yaml", doc)))
        assert checks["broker"]["status"] == "warn", text
        # a certificate file that is not there: the daemon could not start either: required
        doc["mqtt"]["tls"] = {**tls, "cert_file": str(tmp_path / "missing.crt")}
        rc, checks, text = doctor("-c", str(write_config(tmp_path / "missing.yaml", doc)))
        assert rc == 1 and checks["broker"]["status"] == "fail" and "missing.crt not found" in text
    finally:
        b.stop()


def test_orin_nano_jetpack6_fixture(tmp_path: Path) -> None:
    root = BOARDS["orin_nano_jp6"](tmp_path / "root")
    put(root, "dev/nvgpu/igpu0/ctrl", "")
    rc, checks, _ = doctor("--root", str(root))
    assert checks["l4t"]["status"] == "ok" and "L4T R36.3.0 (JetPack 6)" in checks["l4t"]["detail"]
    assert checks["sensors"]["status"] == "ok", checks["sensors"]
    assert "6 temperatures" in checks["sensors"]["detail"]  # the three offline cv* zones are not counted
    assert "VDD_IN" in checks["sensors"]["detail"] and "GPU load (ga10b)" in checks["sensors"]["detail"]
    assert (
        "SoC compute capability 8.7" in checks["gpu"]["detail"] and "/dev/nvgpu/igpu0/ctrl" in checks["gpu"]["detail"]
    )
    assert checks["cuda"]["status"] == "warn" and "cuda-bindings" in checks["cuda"]["fix"]
    import numpy

    if int(numpy.__version__.split(".")[0]) >= 2:  # this venv's numpy 2 on a Jetson: JetPack's cv2 would break
        assert rc == 1 and checks["numpy"]["status"] == "fail" and "numpy<2" in checks["numpy"]["fix"]
    assert checks["tensorrt"]["status"] == "n/a" and "python3-libnvinfer" in checks["tensorrt"]["fix"]


def test_jetpack5_fixture_is_refused(tmp_path: Path) -> None:
    root = BOARDS["xavier_nx_jp5"](tmp_path / "root")
    rc, checks, text = doctor("--root", str(root))
    assert rc == 1 and checks["l4t"]["status"] == "fail" and checks["l4t"]["required"]
    assert "L4T R35.4.1" in text and "JetPack 5 ships Python 3.8" in text


@pytest.mark.parametrize("board", ["generic_linux", "nano_jp4"])
def test_other_fixture_trees(tmp_path: Path, board: str) -> None:
    root = BOARDS[board](tmp_path / "root")
    rc, checks, _ = doctor("--root", str(root))
    if board == "generic_linux":
        assert checks["l4t"]["status"] == "n/a" and checks["sensors"]["status"] == "warn"
        assert "missing: power, gpu" in checks["sensors"]["detail"]
    else:
        assert rc == 1 and checks["l4t"]["status"] == "fail" and "R32.7.4" in checks["l4t"]["detail"]
        assert "SoC compute capability 5.3" in checks["gpu"]["detail"]


def test_an_engine_package_built_for_another_device(broker: Broker, demo: DemoAssets, tmp_path: Path) -> None:
    """An Orin's engine package here (x86_64, no TensorRT): the model check names every mismatch, and
    TensorRT becomes required."""
    from edged.models.package import write_package

    src = demo.packages["blazeface-back"]
    fields = src.manifest.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
    compat = {"tensorrt": "10.3.0", "compute_capability": "8.7", "l4t": "36.4.0", "platform": "aarch64"}
    fields.update(kind="engine", compatibility=compat)
    files = {"model.engine": src.model_path, "model.onnx": src.model_path, "labels.txt": src.root / "labels.txt"}
    pkg = write_package(tmp_path / "engine-pkg", fields, files)
    cfg = config(tmp_path, broker, demo)
    doc = yaml.safe_load(cfg.read_text())
    doc["model"]["package"] = str(pkg.root)
    rc, checks, text = doctor("-c", str(write_config(tmp_path / "engine.yaml", doc)))
    assert rc == 1, text
    assert checks["model"]["status"] == "fail" and "built for aarch64" in checks["model"]["detail"]
    assert "needs TensorRT 10.3.0, none is installed here" in checks["model"]["detail"]
    assert "edged build-engine" in checks["model"]["fix"]
    assert checks["tensorrt"]["status"] == "fail" and checks["tensorrt"]["required"]


# --- the capture path the daemon will use: GStreamer through PyGObject, not OpenCV's build -------------------

GST_CAMERA = {"name": "gate", "uri": "gst://videotestsrc is-live=true ! videoconvert ! appsink name=sink"}
CSI_CAMERA = {"name": "dock", "uri": "csi://0?width=1280&height=720&fps=30"}


def without_gi(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python finds no PyGObject: a `gi` ahead of the venv's that is not there (as on a
    device without python3-gi, or a venv that does not see the system site-packages)."""
    hide = tmp_path / "no-gi" / "gi"
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'gi\'", name="gi")\n')
    return {"PYTHONPATH": str(hide.parent)}


def doctor_env(env: dict[str, str], *args: str) -> tuple[int, dict[str, dict[str, Any]], str]:
    r = edged_cli("doctor", "--json", "--broker-timeout", "5", *args, env=env)
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] == (r.returncode == 0)
    text = edged_cli("doctor", "--broker-timeout", "5", *args, env=env).stdout
    return r.returncode, {c["name"]: c for c in doc["checks"]}, text


def test_a_gst_camera_passes_where_pygobject_gstreamer_loads(broker: Broker, demo: DemoAssets, tmp_path: Path) -> None:
    """This machine: PyGObject's GStreamer loads (scripts/setup.sh links python3-gi), pip's OpenCV has no
    GStreamer. The daemon captures gst:// through PyGObject, so OpenCV's build is not a failure."""
    doc = base_config(broker, demo, tmp_path, [GST_CAMERA, {"name": "cam", "uri": f"file://{demo.video}"}])
    rc, checks, text = doctor("-c", str(write_config(tmp_path / "gst.yaml", doc)))
    assert rc == 0, text
    assert checks["gstreamer"]["status"] == "ok" and checks["gstreamer"]["required"], checks["gstreamer"]
    assert "through PyGObject" in checks["gstreamer"]["detail"] and "GStreamer 1." in checks["gstreamer"]["detail"]
    capture = checks["capture"]
    assert capture["status"] == "ok" and capture["required"], capture
    assert "gate (gst://" in capture["detail"] and "cam (file://" in capture["detail"]
    assert capture["detail"].count("GStreamer") >= 2, capture  # both cameras: the path the daemon takes
    # OpenCV's GStreamer is not used by this config: not a failure, and no fix that swaps OpenCV
    assert checks["gst-cv2"]["status"] == "n/a" and not checks["gst-cv2"]["required"], checks["gst-cv2"]
    assert "opencv" not in checks["gst-cv2"]["fix"].lower()


def test_without_pygobject_gst_and_csi_cameras_fail_with_the_gstreamer_fix(
    broker: Broker, demo: DemoAssets, tmp_path: Path
) -> None:
    doc = base_config(broker, demo, tmp_path, [GST_CAMERA, CSI_CAMERA])
    rc, checks, text = doctor_env(without_gi(tmp_path), "-c", str(write_config(tmp_path / "csi.yaml", doc)))
    assert rc == 1, text
    g = checks["gstreamer"]
    assert g["status"] == "fail" and g["required"], g
    assert "No module named 'gi'" in g["detail"]
    assert "python3-gi" in g["fix"] and "gir1.2-gstreamer-1.0" in g["fix"] and "system-site-packages" in g["fix"]
    capture = checks["capture"]
    assert capture["status"] == "fail" and "gate (gst://" in capture["detail"] and "dock (csi://0" in capture["detail"]
    assert "python3-gi" in capture["fix"]
    # the old advice (swap OpenCV) is not what fixes PyGObject capture
    fails = [line for line in text.splitlines() if line.startswith("FAIL")]
    assert fails and not any("pip uninstall" in f or "python3-opencv" in f for f in fails), fails


def test_without_pygobject_file_cameras_fall_back_to_opencv(broker: Broker, demo: DemoAssets, tmp_path: Path) -> None:
    """file:// (rtsp, v4l2) cameras on `backend: auto` fall back to OpenCV where GStreamer is missing, as the
    daemon does: an advisory line, not a failure."""
    rc, checks, text = doctor_env(without_gi(tmp_path), "-c", str(config(tmp_path, broker, demo)))
    assert rc == 0, text
    assert checks["gstreamer"]["status"] == "warn" and not checks["gstreamer"]["required"], checks["gstreamer"]
    assert "OpenCV" in checks["capture"]["detail"] and checks["capture"]["status"] == "ok", checks["capture"]


def test_a_csi_camera_here_fails_on_nvarguscamerasrc_not_on_opencv(
    broker: Broker, demo: DemoAssets, tmp_path: Path
) -> None:
    """PyGObject's GStreamer loads here, but this is no Jetson: csi:// needs nvarguscamerasrc, and says so."""
    doc = base_config(broker, demo, tmp_path, [CSI_CAMERA])
    rc, checks, text = doctor("-c", str(write_config(tmp_path / "csi.yaml", doc)))
    assert rc == 1, text
    assert checks["gstreamer"]["status"] == "ok", checks["gstreamer"]
    capture = checks["capture"]
    assert capture["status"] == "fail" and "nvarguscamerasrc" in capture["detail"], capture
    assert "nvidia-l4t-gstreamer" in capture["fix"]
    fails = [line for line in text.splitlines() if line.startswith("FAIL")]
    assert not any("opencv" in f.lower() for f in fails), fails


def without_python_systemd(tmp_path: Path) -> dict[str, str]:
    hide = tmp_path / "no-systemd" / "systemd"
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'systemd\'", name="systemd")\n')
    return {"PYTHONPATH": str(hide.parent)}


def test_journald_logging_needs_python3_systemd(tmp_path: Path) -> None:
    """Under systemd (a root with /run/systemd/system), python3-systemd is what gives the journal each line's
    priority and the CAMERA / EDGED_MODEL / ERROR_CODE fields: checked, and its absence said with the fix."""
    root = BOARDS["generic_linux"](tmp_path / "root")
    (root / "run" / "systemd" / "system").mkdir(parents=True)
    _, checks, _ = doctor("--root", str(root))
    assert checks["journald"]["status"] == "ok", checks["journald"]
    assert "python3-systemd" in checks["journald"]["detail"] and "CAMERA" in checks["journald"]["detail"]
    _, checks, _ = doctor_env(without_python_systemd(tmp_path), "--root", str(root))
    j = checks["journald"]
    assert j["status"] == "warn" and not j["required"], j
    assert "journalctl -p err" in j["detail"] and "CAMERA=" in j["detail"], j
    assert "apt-get install python3-systemd" in j["fix"], j
    # no systemd here (a container, a laptop): nothing to log to
    plain = BOARDS["generic_linux"](tmp_path / "plain")
    _, checks, _ = doctor_env(without_python_systemd(tmp_path / "x"), "--root", str(plain))
    assert checks["journald"]["status"] == "n/a", checks["journald"]


def argus_standin(tmp_path: Path) -> dict[str, str]:
    """GStreamer with an element named nvarguscamerasrc (tests/gst_argus_standin.c, built here with cc): a
    GstBaseSrc that makes nothing, registered from GST_PLUGIN_PATH into a registry of the test's own."""
    cc = shutil.which("cc")
    libs = [Path("/usr/lib/x86_64-linux-gnu") / f"lib{n}.so.0" for n in ("gstbase-1.0", "gstreamer-1.0", "gobject-2.0")]
    if cc is None or not all(lib.exists() for lib in libs):
        pytest.skip("no cc, or no GStreamer libraries where the stand-in plugin links them")
    plugins = tmp_path / "gst-plugins"
    plugins.mkdir()
    src = Path(__file__).with_name("gst_argus_standin.c")
    cmd = [cc, "-shared", "-fPIC", "-o", str(plugins / "libgstedgedargus.so"), str(src), *map(str, libs)]
    subprocess.run(cmd, check=True, timeout=120)
    return {"GST_PLUGIN_PATH": str(plugins), "GST_REGISTRY": str(tmp_path / "gst-registry.bin")}


def test_a_csi_camera_passes_where_gstreamer_has_nvarguscamerasrc(
    broker: Broker, demo: DemoAssets, tmp_path: Path
) -> None:
    """The Jetson case without a Jetson: PyGObject's GStreamer with nvarguscamerasrc (a stand-in element), pip's
    OpenCV without GStreamer. The CSI camera's path is GStreamer; nothing asks for another OpenCV."""
    doc = base_config(broker, demo, tmp_path, [CSI_CAMERA])
    rc, checks, text = doctor_env(argus_standin(tmp_path), "-c", str(write_config(tmp_path / "csi.yaml", doc)))
    assert rc == 0, text
    assert checks["gstreamer"]["status"] == "ok" and checks["gstreamer"]["required"], checks["gstreamer"]
    assert checks["capture"]["status"] == "ok" and "dock (csi://0" in checks["capture"]["detail"], checks["capture"]
    assert "(PyGObject)" in checks["capture"]["detail"]
    assert "nvarguscamerasrc" not in checks["gst-nv"]["detail"].split("(")[0], checks["gst-nv"]  # not missing
    assert text.splitlines()[-1] == "doctor: edged can run here"


# --- the clip encoder (capture/gstreamer/encode.py): which one recording cameras that are not H.264 get ---------

GST_PLUGINS = Path("/usr/lib/x86_64-linux-gnu/gstreamer-1.0")


def gst_without(tmp_path: Path, *plugins: str) -> dict[str, str]:
    """This machine's GStreamer with some plugins taken away: a plugin folder of links to every other one, as the
    only system path, and a registry of the test's own (as a device without gstreamer1.0-plugins-ugly)."""
    if not all((GST_PLUGINS / f"libgst{p}.so").exists() for p in plugins):
        pytest.skip(f"this machine's GStreamer has not all of {plugins} in {GST_PLUGINS}")
    folder = tmp_path / "gst-plugins"
    folder.mkdir(parents=True)
    for lib in GST_PLUGINS.glob("libgst*.so"):
        if lib.name not in {f"libgst{p}.so" for p in plugins}:
            (folder / lib.name).symlink_to(lib)
    return {"GST_PLUGIN_SYSTEM_PATH_1_0": str(folder), "GST_REGISTRY_1_0": str(tmp_path / "gst-registry.bin")}


def test_the_encoder_line_names_the_best_encoder_present_and_its_fix(
    broker: Broker, demo: DemoAssets, tmp_path: Path
) -> None:
    """`edged doctor`'s ``encoder`` row: the encoder a recording camera that does not send H.264/H.265 gets
    (x264enc here, openh264enc without it); with none, a warning with the package that brings one, or "n/a"
    when only RTSP cameras record (their own packets need no encoder)."""
    if not (GST_PLUGINS / "libgstx264.so").exists():
        pytest.skip("no x264enc on this machine")
    recording = {"name": "cam", "uri": f"file://{demo.video}", "record": {"pre_s": 1, "post_s": 1}}
    cfg = write_config(tmp_path / "rec.yaml", base_config(broker, demo, tmp_path, [recording]))
    _, checks, text = doctor("-c", str(cfg))
    enc = checks["encoder"]
    assert enc["status"] == "ok" and not enc["required"], enc
    assert enc["detail"] == "clip encoder: x264enc (recording cameras that do not send H.264/H.265)"
    assert "ok   encoder    clip encoder: x264enc" in text, text
    # without gstreamer1.0-plugins-ugly: the next in the order, openh264enc
    _, checks, _ = doctor_env(gst_without(tmp_path / "no-x264", "x264"), "-c", str(cfg))
    assert checks["encoder"]["status"] == "ok" and "clip encoder: openh264enc" in checks["encoder"]["detail"]
    # no H.264 encoder at all: a warning for the file camera that records, with the fix
    bare = gst_without(tmp_path / "none", "x264", "openh264")
    _, checks, text = doctor_env(bare, "-c", str(cfg))
    enc = checks["encoder"]
    assert enc["status"] == "warn" and not enc["required"], enc
    assert "clip encoder: none (no H.264 encoder is installed" in enc["detail"], enc
    assert "gstreamer1.0-plugins-ugly" in enc["fix"] and "nvv4l2h264enc" in enc["fix"], enc
    assert "warn encoder" in text, text
    # only an RTSP camera records: it keeps the camera's own packets, so no encoder is needed
    rtsp = {"name": "door", "uri": "rtsp://127.0.0.1:9/cam", "record": {"pre_s": 1, "post_s": 1}}
    plain = {"name": "cam", "uri": f"file://{demo.video}"}
    cfg = write_config(tmp_path / "rtsp.yaml", base_config(broker, demo, tmp_path, [rtsp, plain]))
    _, checks, _ = doctor_env(bare, "-c", str(cfg))
    enc = checks["encoder"]
    assert enc["status"] == "n/a" and "RTSP H.264/H.265 cameras record their own packets" in enc["detail"], enc
