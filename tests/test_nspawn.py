"""End to end under a real systemd: a throwaway Debian rootfs booted with systemd-nspawn (systemd as
PID 1 in its own namespaces, never on this machine's root), the host deploy bundle installed with its
install.sh, then start / status / results / reload / watchdog / journald / OnFailure rollback / stop
driven with systemctl (tests/nspawn/e2e.sh); then, in the same boot, the site as shipped
(tests/nspawn/site.sh): docs/operator.md "A secured site from zero" run verbatim (its sh blocks:
certificates from `edged certs`, mosquitto with systemd/mosquitto/edged.conf and edged.acl, the
device's identity through LoadCredential=, start, results over TLS to the backend), then `edged push`
to a version that commits, a broker restart with no seq lost, a camera's password through
LoadCredential= grepped for in the journal, the retained messages and the events, a revoked device
refused. About 2 min the first time (debootstrap, cached in /var/cache/edged-nspawn), then about a
minute and a half a run (the bundle's wheels install inside; 70 s here with a warm cache)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from edged.models.demo import DemoAssets
from edged.models.package import pack_tar, write_package
from edged.models.signing import generate_key, load_signing_key
from tests.conftest import REPO, build_bundle, edged_cli
from tests.nspawn import from_zero

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="booting a container with systemd-nspawn needs root")


@pytest.mark.start_early(131)
def test_bundle_under_a_real_systemd(demo: DemoAssets, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    key_path, _ = generate_key(keys)
    key = load_signing_key(key_path)
    payload = tmp_path / "payload"
    payload.mkdir()
    src = demo.packages["blazeface-back"]
    r = edged_cli("model", "pack", str(src.root), "--out", str(tmp_path / "faces-1.tar"), "--key", str(key_path))
    assert r.returncode == 0, r.stderr
    # version 2 hashes and signs correctly but is not an ONNX model: the daemon rolls it back at start
    broken = tmp_path / "v2"
    broken.mkdir()
    (broken / "model.onnx").write_bytes(b"not an onnx model\n" * 100)
    fields = src.manifest.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
    fields["version"] = 2
    pkg = write_package(broken, fields, {"model.onnx": broken / "model.onnx", "labels.txt": src.root / "labels.txt"})
    pack_tar(pkg, payload / "v2-crash.tar", key.sign(pkg.manifest_bytes))
    # version 3 is good, but run with a test hook that kills the daemon at every start while it is on
    # probation: a crash loop the daemon cannot judge itself, for edged-rollback.service
    good = write_package(
        tmp_path / "v3", {**fields, "version": 3}, {"model.onnx": src.model_path, "labels.txt": src.root / "labels.txt"}
    )
    pack_tar(good, payload / "v3.tar", key.sign(good.manifest_bytes))
    # version 4 is good and is pushed over TLS by site.sh, with `edged push` and the backend's certificate
    v4 = write_package(
        tmp_path / "v4", {**fields, "version": 4}, {"model.onnx": src.model_path, "labels.txt": src.root / "labels.txt"}
    )
    pack_tar(v4, payload / "v4.tar", key.sign(v4.manifest_bytes))
    # docs/operator.md "A secured site from zero" as a script of its sh blocks, verbatim (step 1's names
    # set to the container's); site.sh runs it: certificates, broker, device credentials, start, check
    doc = (REPO / "docs/operator.md").read_text(encoding="utf-8")
    names = {"BROKER": "localhost", "BROKER_IP": "127.0.0.1", "DEVICE": "e2e-01", "SRC": "/srv/payload/src"}
    script = from_zero.script(doc, names)
    assert all(step.code in script for step in from_zero.steps(doc))
    (payload / "from-zero.sh").write_text(script)
    shutil.copytree(REPO / "systemd/mosquitto", payload / "src/systemd/mosquitto")
    bundle = build_bundle("host", keys, tmp_path / "faces-1.tar", key_path, tmp_path / "out")
    shutil.copy(bundle, payload / "bundle.tar")
    shutil.copy(demo.video, payload / "demo.mp4")
    for script in ("e2e.sh", "site.sh"):
        shutil.copy(REPO / "tests/nspawn" / script, payload / script)
    os.chmod(payload, 0o755)
    r = subprocess.run(
        ["bash", str(REPO / "tests/nspawn/harness.sh")],
        env={**os.environ, "PAYLOAD": str(payload), "TESTS": "e2e.sh site.sh", "TEST_TIMEOUT": "600"},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    print(r.stdout[-6000:])
    failed = [line for line in r.stdout.splitlines() if line.startswith("FAIL")]
    assert r.returncode == 0 and not failed, "\n".join(failed) + "\n" + r.stderr[-3000:]
    passed = [line for line in r.stdout.splitlines() if line.startswith("PASS")]
    assert len(passed) >= 60, f"{len(passed)} checks passed:\n" + "\n".join(passed)
    for check in (
        "results over TLS at the backend",
        "the doc's secured site from zero ran verbatim",
        "from zero, step 6",
        "edged push v4",
        "nothing lost across the broker restart",
        "redaction: journalctl -u edged",
        "redaction: the whole journal",
        "redaction: every retained message",
        "redaction: the events",
    ):
        assert any(check in line for line in passed), f"no PASS: {check}"
    assert any("the broker refuses the revoked device" in line for line in passed), "no PASS: a revoked device"


@pytest.mark.start_early(190)
@pytest.mark.slow  # its own boot (~2 min); the short form in the default set: tests/test_health.py
def test_a_daemon_serving_nothing_is_restarted_under_a_real_systemd(demo: DemoAssets, tmp_path: Path) -> None:
    """Issue 26 item 3 under a real systemd (tests/nspawn/liveness.sh): the only camera (an MJPEG server)
    stops; with inference.serving_timeout_s: 10 the daemon stops petting the watchdog and systemd restarts
    it; the camera back, it serves and stays up. Its own boot: about 2 min with the bundle's install."""
    keys = tmp_path / "keys"
    key_path, _ = generate_key(keys)
    model = demo.packages["blazeface-back"].root
    r = edged_cli("model", "pack", str(model), "--out", str(tmp_path / "m.tar"), "--key", str(key_path))
    assert r.returncode == 0, r.stderr
    payload = tmp_path / "payload"
    payload.mkdir()
    shutil.copy(build_bundle("host", keys, tmp_path / "m.tar", key_path, tmp_path / "out"), payload / "bundle.tar")
    shutil.copy(REPO / "tests/mjpeg_server.py", payload / "mjpeg_server.py")
    shutil.copy(REPO / "tests/nspawn/liveness.sh", payload / "liveness.sh")
    os.chmod(payload, 0o755)
    r = subprocess.run(
        ["bash", str(REPO / "tests/nspawn/harness.sh")],
        env={**os.environ, "PAYLOAD": str(payload), "TESTS": "liveness.sh", "TEST_TIMEOUT": "400"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(r.stdout[-4000:])
    failed = [line for line in r.stdout.splitlines() if line.startswith("FAIL")]
    assert r.returncode == 0 and not failed, "\n".join(failed) + "\n" + r.stderr[-3000:]
    passed = [line for line in r.stdout.splitlines() if line.startswith("PASS")]
    for check in ("no restart while the camera delivers", "systemd restarted edged", "not petting", "stays up"):
        assert any(check in line for line in passed), f"no PASS: {check}\n" + r.stdout[-3000:]
