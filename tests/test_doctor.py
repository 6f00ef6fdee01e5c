"""`edged doctor` through the real CLI: this machine against a real mosquitto (up, down, over TLS with a
client certificate, with a stranger's certificate), an unwritable state_dir, and the Jetson sysfs
fixture trees the sensor tests use (L4T, SoC compute capability, sensors, JetPack 5 refused)."""

from __future__ import annotations

import json
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
    assert r.returncode == 1 and "doctor: 3 warning(s) (--strict)" in r.stdout  # broker, gst-cv2, sensors


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
    assert checks["pycuda"]["status"] == "warn" and "firstboot.sh again" in checks["pycuda"]["fix"]
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
