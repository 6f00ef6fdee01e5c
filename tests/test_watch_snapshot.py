"""`edged watch --snapshot` asks the device: a running daemon's camera, with no local copy of its video (a
synthetic camera, as an RTSP one would be), gives the JPEG the device published, byte for byte; a camera the
device does not have is named in a clear error. Drawing onto a local video stays, offline (tests/test_cli.py)."""

from __future__ import annotations

from pathlib import Path

from edged.models.demo import DemoAssets

from .conftest import base_config, edged_cli, wait_until, write_config


def test_watch_snapshot_writes_what_the_device_sends(
    broker, start_daemon, subscribe, demo: DemoAssets, tmp_path: Path
) -> None:
    cams = [{"name": "yard", "uri": "synthetic://?fps=10"}]
    cfg = write_config(tmp_path / "c.yaml", base_config(broker, demo, tmp_path, cams))
    seen = subscribe(broker, "edged/test-01/snapshot/#")
    d = start_daemon(cfg)
    wait_until(lambda: "serving 1 camera(s)" in d.output(), 60, "the daemon")
    snap = tmp_path / "yard.jpg"
    run = edged_cli("watch", "-c", str(cfg), "--snapshot", str(snap), timeout=90)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"snapshot: {snap}" in run.stdout and "camera yard" in run.stdout, run.stdout
    wait_until(lambda: bool(seen.on("snapshot/yard")), 10, "the device's JPEG")
    sent = seen.on("snapshot/yard")[-1].payload
    assert snap.read_bytes() == sent and sent[:2] == b"\xff\xd8"
    run = edged_cli("watch", "-c", str(cfg), "--snapshot", str(tmp_path / "no.jpg"), "--camera", "gate", timeout=90)
    assert run.returncode == 1 and "unknown_camera" in run.stderr and "yard" in run.stderr, run.stderr
    assert not (tmp_path / "no.jpg").exists()
    assert d.stop() == 0
