"""The local health endpoint (issue 19 item 6) against a real daemon: ready after start, not ready with the
reason when its camera is gone or the broker is away, /metrics served all along, scraped by a real HTTP
client and parsed with prometheus_client's own parsers (Prometheus text and OpenMetrics)."""

from __future__ import annotations

import json
import re
import socket
import statistics
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from edged.models.demo import DemoAssets

from .conftest import base_config, free_port, wait_until, write_config
from .test_capture import mjpeg_server
from .test_systemd import NotifySocket


def get(port: int, path: str, accept: str = "") -> tuple[int, str, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()
    except OSError:
        return 0, "", b""


def ready(port: int) -> tuple[int, dict[str, Any]]:
    status, _, body = get(port, "/readyz")
    return status, (json.loads(body) if body else {})


def metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus-text scrape: (name, sorted labels) -> value."""
    status, ctype, body = get(port, "/metrics")
    assert status == 200 and ctype.startswith("text/plain"), (status, ctype)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(body.decode())
        for s in fam.samples
    }


def test_health_ready_and_metrics_follow_camera_and_broker(
    broker, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    cam_port, port = free_port(), free_port()
    server = mjpeg_server(cam_port, "--fps", "15")
    cams = [
        {
            "name": "door",
            "uri": f"http://127.0.0.1:{cam_port}/",
            "stall_timeout_s": 1.0,
            "reconnect_min_s": 0.2,
            "reconnect_max_s": 1.0,
        }
    ]
    cfg = base_config(broker, demo, tmp_path, cams, health={"enabled": True, "port": port})
    d = start_daemon(write_config(tmp_path / "edged.yaml", cfg))
    try:
        wait_until(lambda: ready(port)[0] == 200, 60, "/readyz 200")
        assert ready(port)[1] == {"status": "ready"}
        assert get(port, "/healthz")[:2] == (200, "application/json")
        wait_until(lambda: metrics(port)[("edged_inference_results_total", ())] > 0, 20, "results counted")
        took = []
        for _ in range(10):
            t0 = time.perf_counter()
            m = metrics(port)
            took.append(time.perf_counter() - t0)
        print(f"\n/metrics: {len(m)} samples, scrape median {1000 * statistics.median(took):.1f} ms")
        assert m[("edged_ready", ())] == 1.0
        assert m[("edged_camera_up", (("camera", "door"),))] == 1.0
        assert m[("edged_camera_frames_total", (("camera", "door"),))] > 0
        assert m[("edged_mqtt_connected", ())] == 1.0
        assert m[("edged_memory_bytes", (("kind", "rss"),))] > 10 * 2**20
        assert m[("edged_inference_latency_seconds_count", ())] > 0  # a histogram (issue 27), was quantile gauges
        assert m[("edged_messages_acked_total", ())] >= 0
        # OpenMetrics for a scraper that asks for it, parsed by prometheus_client's OpenMetrics parser
        status, ctype, body = get(port, "/metrics", accept="application/openmetrics-text; version=1.0.0")
        assert status == 200 and ctype.startswith("application/openmetrics-text"), ctype
        names = {f.name for f in openmetrics_families(body.decode())}  # type: ignore[no-untyped-call]
        assert {"edged_camera_frames", "edged_inference_results", "edged_spool_rows", "edged"} <= names
        assert get(port, "/nope")[0] == 404

        # the camera goes away: not ready, saying which camera; metrics still served; alive
        server.terminate()
        server.wait(10)
        wait_until(lambda: ready(port)[0] == 503, 20, "/readyz 503 without the camera")
        reasons = ready(port)[1]["reasons"]
        assert any(r.startswith("camera door is down") for r in reasons), reasons
        assert metrics(port)[("edged_camera_up", (("camera", "door"),))] == 0.0
        assert get(port, "/healthz")[0] == 200
        server = mjpeg_server(cam_port, "--fps", "15")  # back: ready again
        wait_until(lambda: ready(port)[0] == 200, 30, "/readyz 200 with the camera back")

        # the broker goes away: not ready, saying so; metrics still served
        broker.stop()
        wait_until(lambda: ready(port)[0] == 503, 20, "/readyz 503 without the broker")
        reasons = ready(port)[1]["reasons"]
        assert any(f"the broker 127.0.0.1:{broker.port} is not connected" in r for r in reasons), reasons
        m = metrics(port)
        assert m[("edged_mqtt_connected", ())] == 0.0 and m[("edged_ready", ())] == 0.0
        assert get(port, "/healthz")[0] == 200
        broker.start()
        wait_until(lambda: ready(port)[0] == 200, 30, "/readyz 200 with the broker back")
    finally:
        server.terminate()
        server.wait(10)
    assert d.stop() == 0, d.output()[-3000:]
    assert get(port, "/healthz")[0] == 0  # closed with the daemon
    assert "health: http://127.0.0.1:" in d.output()


def test_a_taken_port_leaves_the_daemon_serving(broker, start_daemon, demo: DemoAssets, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cams = [{"name": "lobby", "uri": "synthetic://?fps=15"}]
        cfg = base_config(broker, demo, tmp_path, cams, health={"enabled": True, "port": port})
        d = start_daemon(write_config(tmp_path / "edged.yaml", cfg), "--duration", "4")
        assert d.proc.wait(60) == 0, d.output()[-3000:]
    out = d.output()
    assert f"health: cannot listen on 127.0.0.1:{port}" in out and "serving without the endpoint" in out


def test_a_daemon_whose_cameras_deliver_nothing_fails_healthz_and_the_watchdog(
    broker, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    """Issue 26 item 3: every camera gone for inference.serving_timeout_s is not serving: /healthz 503 and
    /readyz say so (and which camera), the watchdog pings stop and WATCHDOG=trigger asks systemd to act;
    the camera back, both recover. Before, /healthz said ok and the pings went on."""
    cam_port, port = free_port(), free_port()
    server = mjpeg_server(cam_port, "--fps", "15")
    cams = [{"name": "door", "uri": f"http://127.0.0.1:{cam_port}/", "stall_timeout_s": 1.0, "reconnect_max_s": 1.0}]
    inference = {"max_wait_ms": 20, "serving_timeout_s": 10}
    cfg = base_config(broker, demo, tmp_path, cams, health={"enabled": True, "port": port}, inference=inference)
    notify = NotifySocket(tmp_path / "notify.sock")
    env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "2000000"}
    d = start_daemon(write_config(tmp_path / "edged.yaml", cfg), env=env)

    def healthz() -> tuple[int, dict[str, Any]]:
        status, _, body = get(port, "/healthz")
        return status, (json.loads(body) if body else {})

    def pings(after: float) -> int:
        return sum(1 for t, line in notify.lines("WATCHDOG") if line == "WATCHDOG=1" and t > after)

    def triggers() -> list[float]:
        return [t for t, line in notify.lines("WATCHDOG") if line == "WATCHDOG=trigger"]

    try:
        wait_until(lambda: ready(port)[0] == 200, 60, "/readyz 200")
        wait_until(lambda: pings(0) >= 2, 10, "watchdog pings while serving")
        server.terminate()
        server.wait(10)
        gone = time.monotonic()
        wait_until(lambda: healthz()[0] == 503, 10 + 20, "/healthz 503 with no frame for serving_timeout_s")
        assert time.monotonic() - gone >= 10 - 1, "not before the bound"
        why = healthz()[1]["reasons"][0]
        assert re.match(r"serving: no camera has delivered a frame for \d+ s", why) and "door down" in why, why
        reasons = ready(port)[1]["reasons"]
        assert why.split(" for ")[0] in " ".join(reasons) and any(r.startswith("camera door is down") for r in reasons)
        wait_until(lambda: bool(triggers()), 10, "WATCHDOG=trigger")
        stopped = triggers()[0]
        assert pings(stopped) == 0
        server = mjpeg_server(cam_port, "--fps", "15")  # back: serving, healthy, pinging again
        wait_until(lambda: healthz()[0] == 200, 30, "/healthz 200 with the camera back")
        wait_until(lambda: pings(stopped) >= 2, 10, "watchdog pings again")
    finally:
        server.terminate()
        server.wait(10)
        notify.close()
    assert d.stop() == 0, d.output()[-3000:]
    assert "watchdog: not petting systemd's watchdog: serving: no camera has delivered a frame" in d.output()
