"""The governor's policy over scripts of readings, the memory budget, and the running daemon
following the level that a fixture tree's temperatures dictate."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from edged.daemon.capture.camera import Throttle
from edged.daemon.config import GovernorConfig, MemoryConfig
from edged.daemon.host.governor import Governor, Level, Policy, admit, plan_swap
from edged.daemon.host.sensors import Reading, Sensors
from edged.errors import EngineLoadError, SwapError
from edged.models.demo import DemoAssets

from . import sysfs_fixtures as fx
from .conftest import base_config, wait_until, write_config
from .test_delivery import captured


def iso_s(ts: str) -> float:
    """An ISO 8601 UTC time of ours (`…Z`) as a Unix time."""
    return captured({"captured_at": ts})


CFG = GovernorConfig(warm_c=80, hot_c=90, critical_c=97, hysteresis_c=5, min_dwell_s=10, critical_action="pause")
MEM = MemoryConfig(budget_mb=1000, throttle_pct=80, hard_limit_pct=95)


def reading(temp: float | None = None, power_w: float | None = None, rss_mb: float = 100.0, **kw: Any) -> Reading:
    return Reading(temps_c={} if temp is None else {"tj-thermal": temp}, power_w=power_w, rss_mb=rss_mb, **kw)


def run_script(policy: Policy, script: Sequence[tuple[float, float]]) -> list[tuple[float, str]]:
    """(time, temperature) pairs -> the (time, level) of each transition."""
    out = []
    for t, temp in script:
        for e in policy.update(reading(temp), t).events:
            if e["type"] == "throttle":
                out.append((t, e["to"]))
    return out


def test_every_transition_at_the_right_reading() -> None:
    script = [(0, 60), (1, 79.9), (2, 80.0), (3, 85), (4, 90.0), (5, 96.9), (6, 97.0), (7, 95),
              (20, 93), (21, 91.9), (35, 80), (36, 74.9), (50, 70)]  # fmt: skip
    assert run_script(Policy(CFG, MEM), script) == [
        (2, "warm"),  # 80.0 reaches warm_c
        (4, "hot"),  # 90.0 reaches hot_c
        (6, "critical"),  # 97.0 reaches critical_c
        (21, "hot"),  # dwell over (>= 10 s) and 91.9 < 97 - 5
        (35, "warm"),  # 80 < 90 - 5 and 14 s in hot; 80 + 5 is still warm
        (50, "normal"),  # 70 < 80 - 5 after dwell; 74.9 at t=36 was too soon
    ]


def test_noisy_sensor_around_a_threshold_does_not_flap() -> None:
    noisy = [(t * 0.5, 80 + (1.5 if t % 2 else -1.5)) for t in range(120)]  # 78.5 / 81.5 every half second
    assert run_script(Policy(CFG, MEM), noisy) == [(0.5, "warm")]  # in, and never out: 78.5 > 80 - 5


def test_levels_drive_the_frame_rate_and_pause() -> None:
    p = Policy(CFG, MEM)
    assert p.update(reading(50), 0).fps_scale == 1.0
    d = p.update(reading(82), 1)
    assert (d.level, d.fps_scale, d.paused) == (Level.WARM, CFG.warm_fps_scale, False)
    d = p.update(reading(91), 2)
    assert (d.level, d.fps_scale, d.paused) == (Level.HOT, 0.0, True)
    assert p.update(reading(98), 3).stop_reason == ""  # critical_action pause
    exit_policy = Policy(CFG.model_copy(update={"critical_action": "exit"}), MEM)
    assert "critical temperature" in exit_policy.update(reading(99), 0).stop_reason


def test_zone_selection_and_missing_thermals() -> None:
    p = Policy(CFG.model_copy(update={"zones": ["gpu-thermal"]}), MEM)
    r = Reading(temps_c={"cpu-thermal": 95.0, "gpu-thermal": 60.0}, rss_mb=100)
    assert p.update(r, 0).level == Level.NORMAL  # only the watched zone counts
    assert Policy(CFG, MEM).update(reading(None), 0).level == Level.NORMAL  # no sensors: runs normally


def test_power_cap_scales_frame_rate_and_recovers() -> None:
    p = Policy(CFG.model_copy(update={"power_cap_w": 10.0}), MEM)
    d = p.update(reading(50, power_w=12.5), 0)
    assert d.fps_scale == pytest.approx(0.8) and d.events[0]["state"] == "capped"
    d = p.update(reading(50, power_w=11.0), 1)
    assert d.fps_scale == pytest.approx(0.8 * 10 / 11)
    decisions = [p.update(reading(50, power_w=7.0), 2 + i) for i in range(10)]  # under 90 % of the cap
    scales = [x.fps_scale for x in decisions]
    assert scales == sorted(scales) and scales[-1] == 1.0
    assert [e["state"] for x in decisions for e in x.events] == ["released"]


def test_over_current_events_are_counted() -> None:
    p = Policy(CFG, MEM)
    assert p.update(reading(50, oc_events={"oc1": 2}), 0).events == []  # the first reading is the baseline
    events = p.update(reading(50, oc_events={"oc1": 5}), 1).events
    assert events == [{"type": "over_current", "counter": "oc1", "new_events": 3, "total": 5}]


def test_memory_soft_and_hard_limits() -> None:
    p = Policy(CFG, MEM)
    d = p.update(reading(50, rss_mb=850), 0)  # over 80 % of 1000 MB
    assert d.fps_scale == 0.5 and d.events[0]["state"] == "throttled"
    d = p.update(reading(50, rss_mb=700), 1)
    assert d.fps_scale == 1.0 and d.events[0]["state"] == "normal"
    d = p.update(reading(50, rss_mb=960), 2)
    assert "over the hard limit 950 MB" in d.stop_reason


def test_memory_throttle_is_named_for_what_it_does_and_the_old_key_still_reads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # over memory.throttle_pct the frame rate halves (frees no memory): the event and telemetry say so
    p = Policy(CFG, MEM)
    d = p.update(reading(50, rss_mb=850), 0)
    assert d.events[0] == {
        "type": "memory", "state": "throttled", "rss_mb": 850, "soft_limit_mb": 800.0, "fps_scale": 0.5,
    }  # fmt: skip
    gov = Governor(CFG, MEM, Sensors(tmp_path / "none"), Throttle(), lambda e: None, lambda why: None)
    gov.policy = p
    assert gov.telemetry()["memory_fps_scale"] == 0.5
    # the old key is read as the new one, with a warning that names both
    old = MemoryConfig.model_validate({"budget_mb": 1000, "soft_limit_pct": 70, "hard_limit_pct": 90})
    assert old.throttle_pct == 70
    assert "memory.soft_limit_pct is deprecated, read as memory.throttle_pct" in caplog.text
    with pytest.raises(ValueError, match="give only throttle_pct"):
        MemoryConfig.model_validate({"soft_limit_pct": 70, "throttle_pct": 80})


def test_admission_names_both_numbers() -> None:
    admit("faces@7", 300, 50, 1000, 4096)
    with pytest.raises(EngineLoadError, match=r"faces@7 does not fit .* = 4150\.0 MB, over memory\.budget_mb 4096"):
        admit("faces@7", 3000, 150, 1000, 4096)


def test_swap_side_by_side_or_stop_the_world() -> None:
    assert plan_swap(current_mb=300, new_mb=400, in_use_mb=2000, budget_mb=4096) == "side_by_side"
    assert plan_swap(current_mb=1500, new_mb=1600, in_use_mb=3000, budget_mb=4096) == "stop_the_world"
    with pytest.raises(SwapError, match="over the 4096 MB budget"):
        plan_swap(current_mb=500, new_mb=3000, in_use_mb=3000, budget_mb=4096)


def test_governor_thread_samples_a_fixture_tree(tmp_path: Path) -> None:
    root = fx.orin_nano_jp6(tmp_path)
    events: list[dict[str, Any]] = []
    throttle = Throttle()
    # the memory budget out of reach: the RSS read is the test worker's own (800 MB and more late in a suite, which
    # throttled the frame rate under MEM's 1000 MB budget and failed CI); this test is about the fixture's temperatures
    roomy = MEM.model_copy(update={"budget_mb": 1_000_000})
    gov = Governor(CFG.model_copy(update={"interval_s": 0.1, "min_dwell_s": 0.3}), roomy, Sensors(root), throttle,
                   events.append, lambda reason: None)  # fmt: skip
    gov.start()
    try:
        fx.set_temp(root, "tj-thermal", 91.0)
        wait_until(lambda: throttle.paused, 5, "hot pauses inference")
        fx.set_temp(root, "tj-thermal", 60.0)
        wait_until(lambda: not throttle.paused and throttle.fps_scale == 1.0, 5, "back to normal")
    finally:
        gov.stop()
    assert [e["to"] for e in events if e["type"] == "throttle"] == ["hot", "normal"]
    tel = gov.telemetry()
    assert tel["level"] == "normal" and tel["sensors"]["temps_c"]["tj-thermal"] == 60.0 and tel["samples"] >= 3


@pytest.mark.timeout(240)
def test_daemon_frame_rate_follows_the_level(broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path) -> None:
    root = fx.orin_nano_jp6(tmp_path / "sys-root")
    notify_path = tmp_path / "notify.sock"
    notify_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify_sock.bind(str(notify_path))
    notify_sock.settimeout(0.2)
    sub = subscribe(broker, "edged/#")
    # 6 fps at the camera: the governor's cap sets the camera's rate at every level, whatever a busy machine
    # infers (beside two busy loops on 2 cores, as little as 4 results a second)
    cams = [{"name": "cam", "uri": "synthetic://?fps=6", "fps_max": 6}]
    doc = base_config(broker, demo, tmp_path, cams,
                      governor={"sysfs_root": str(root), "interval_s": 0.2, "warm_c": 80, "hot_c": 90,
                                "critical_c": 97, "min_dwell_s": 1.0, "warm_fps_scale": 0.5})  # fmt: skip
    d = start_daemon(write_config(tmp_path / "c.yaml", doc), env={"NOTIFY_SOCKET": str(notify_path)})

    # Each level's rate is judged at the camera, where the governor caps it: the frames it offered to inference
    # (its telemetry, once a second) over a window of wall-clock time. Neither how fast a busy machine infers
    # (below the cap, results thin out at every level alike) nor how late results arrive changes it. A window
    # opens once the level's event has arrived (the governor changed the level before it sent the event).
    windows: list[tuple[float, float]] = []

    def window(seconds: float) -> None:
        start = time.time()  # telemetry's `ts` and results' `captured_at` are wall-clock times on this machine
        time.sleep(seconds)  # the window itself: time passing is the point
        windows.append((start, start + seconds))

    def offered_fps(a: float, b: float) -> float:
        docs = [m.json() for m in sub.on("telemetry")]
        samples = sorted((iso_s(doc["ts"]), int(doc["cameras"]["cam"]["frames"])) for doc in docs)
        inside = [s for s in samples if a <= s[0] <= b]
        assert len(inside) >= 2, f"telemetry in the window {a:.1f}..{b:.1f}: {samples}"
        (t0, f0), (t1, f1) = inside[0], inside[-1]
        return (f1 - f0) / (t1 - t0)

    try:
        wait_until(lambda: len(sub.results()) > 20, 60, "results at normal level")
        window(4)
        fx.set_temp(root, "tj-thermal", 84.0)
        wait_until(lambda: any(e.json().get("to") == "warm" for e in sub.on("events")), 10, "warm event")
        window(4)
        fx.set_temp(root, "tj-thermal", 92.0)
        wait_until(lambda: any(e.json().get("to") == "hot" for e in sub.on("events")), 10, "hot event")
        window(4)
        fx.set_temp(root, "tj-thermal", 50.0)
        wait_until(lambda: any(e.json().get("to") == "normal" for e in sub.on("events")), 10, "normal event")
        window(4)
        status_lines: list[str] = []

        def said_normal() -> bool:  # the status line systemd shows says so
            with contextlib.suppress(TimeoutError):
                status_lines.append(notify_sock.recv(4096).decode())
            return any("thermal normal" in s and s.startswith("STATUS=") for s in status_lines)

        wait_until(said_normal, 10, "a STATUS= line with thermal normal")
        assert d.stop() == 0
        # what the stop sent (the results still queued, then the status `stopped`) has arrived
        sub.wait_stopped(30)
    finally:
        notify_sock.close()
    normal, warm, hot, back = (offered_fps(a, b) for a, b in windows)
    print(f"\ncamera fps: normal {normal:.1f}, warm {warm:.1f}, hot {hot:.1f}, normal again {back:.1f}")
    a, b = windows[2]
    late = [r["seq"] for r in sub.results() if a <= captured(r) < b]
    assert not late, f"results captured while hot (paused): {late}"
    # the levels as ratios of the normal rate measured in the same run: warm halves it, hot stops it,
    # normal restores it
    assert 4 <= normal <= 7, normal
    assert 0.3 <= warm / normal <= 0.75 and hot == 0 and 0.7 <= back / normal <= 1.35, (normal, warm, hot, back)
    tel = sub.on("telemetry")[-1].json()
    assert tel["governor"]["level"] == "normal" and tel["sensors"]["power_source"] == "VDD_IN"
    assert tel["sensors"]["temps_c"]["tj-thermal"] == 50.0 and tel["memory"]["budget_mb"] == 4096
    assert any("thermal normal" in s and s.startswith("STATUS=") for s in status_lines), status_lines


def test_daemon_refuses_a_model_over_budget(start_daemon, demo: DemoAssets, tmp_path: Path) -> None:
    class Nowhere:
        host, port = "127.0.0.1", 1

    doc = base_config(Nowhere(), demo, tmp_path, [{"name": "a", "uri": "synthetic://"}], memory={"budget_mb": 40})
    d = start_daemon(write_config(tmp_path / "c.yaml", doc))
    assert d.proc.wait(60) == 1
    out = d.output()
    assert "does not fit the memory budget" in out and "over memory.budget_mb 40 MB" in out and "Traceback" not in out


def test_daemon_stops_at_the_hard_memory_limit(start_daemon, demo: DemoAssets, tmp_path: Path) -> None:
    class Nowhere:
        host, port = "127.0.0.1", 1

    doc = base_config(Nowhere(), demo, tmp_path, [{"name": "a", "uri": "synthetic://?fps=10"}],
                      memory={"budget_mb": 1000, "throttle_pct": 5, "hard_limit_pct": 10},
                      governor={"interval_s": 0.2})  # fmt: skip
    d = start_daemon(write_config(tmp_path / "c.yaml", doc))
    assert d.proc.wait(60) == 3
    assert "stopped by the governor: memory: RSS" in d.output() and "over the hard limit 100 MB" in d.output()


def test_unrelated_hwmon_sensors_are_not_governed_by_default(tmp_path) -> None:
    """An Orin devkit's NVMe drive at 92 °C (a hwmon chip) is reported, but with no zones configured the
    governor watches the SoC's thermal zones; on a machine without thermal zones, hwmon counts, except
    storage and network chips."""
    from edged.daemon.host.sensors import Sensors
    from tests.sysfs_fixtures import BOARDS, put

    root = BOARDS["orin_nano_jp6"](tmp_path / "orin")
    put(root, "sys/class/hwmon/hwmon9/name", "nvme")
    put(root, "sys/class/hwmon/hwmon9/temp1_label", "Composite")
    put(root, "sys/class/hwmon/hwmon9/temp1_input", 92000)
    r = Sensors(root).read()
    assert r.temps_c["Composite"] == 92.0 and r.hwmon_chips == {"Composite": "nvme"}
    assert Policy(CFG, MEM).watched_temp(r) == ("tj-thermal", 48.3)
    assert Policy(CFG, MEM).update(r, 0).level == Level.NORMAL
    assert Policy(CFG.model_copy(update={"zones": ["Composite"]}), MEM).watched_temp(r) == ("Composite", 92.0)
    pc = tmp_path / "pc"  # no thermal zones: coretemp counts, the drive does not
    for i, (chip, label, milli) in enumerate([("coretemp", "Package id 0", 61000), ("nvme", "Composite", 70000)]):
        put(pc, f"sys/class/hwmon/hwmon{i}/name", chip)
        put(pc, f"sys/class/hwmon/hwmon{i}/temp1_label", label)
        put(pc, f"sys/class/hwmon/hwmon{i}/temp1_input", milli)
    assert Policy(CFG, MEM).watched_temp(Sensors(pc).read()) == ("Package id 0", 61.0)


def test_the_budget_counts_this_process_nvmap_gpu_memory(tmp_path) -> None:
    """On a Jetson, cudaMalloc/TensorRT memory comes from nvmap and is not in RSS: the governor adds this
    process's rows of nvmap's iovmm client table (the file jtop reads) to RSS against the budget."""
    import os

    from edged.daemon.host.sensors import Sensors, nvmap_process_mb
    from tests.sysfs_fixtures import BOARDS, put

    root = BOARDS["orin_nano_jp6"](tmp_path / "orin")
    pid = os.getpid()
    table = (
        "CLIENT                        PROCESS      PID        SIZE\n"
        f"user                          python3      {pid}      409600K\n"
        f"user                          python3      {pid}      204800K\n"
        "user                          gst-launch   1          999999K\n"
        "total                                                 1614399K\n"
    )
    put(root, "sys/kernel/debug/nvmap/iovmm/clients", table)
    assert nvmap_process_mb(pid, root) == 600.0 and nvmap_process_mb(4242424, root) == 0.0
    assert nvmap_process_mb(pid, tmp_path / "nothing") is None  # not a Jetson, or debugfs not readable
    r = Sensors(root).read()
    assert r.gpu_mb == 600.0 and r.spent_mb == round((r.rss_mb or 0) + 600.0, 1)
    # RSS alone is under the soft limit (800 of 1000 MB); with the GPU's 600 MB it is over the hard one
    d = Policy(CFG, MEM).update(reading(50, rss_mb=400.0, gpu_mb=600.0), 0)
    assert d.events[0]["state"] == "hard_limit" and d.events[0]["gpu_mb"] == 600.0
    assert "RSS 400 MB + GPU (nvmap) 600 MB is over the hard limit 950 MB" in d.stop_reason
    d = Policy(CFG, MEM).update(reading(50, rss_mb=400.0, gpu_mb=450.0), 0)
    assert d.events[0]["state"] == "throttled" and d.fps_scale == 0.5
    assert Policy(CFG, MEM).update(reading(50, rss_mb=400.0), 0).events == []  # no nvmap: RSS only


def test_the_rss_slope_is_read_safely_while_the_governor_samples(tmp_path: Path) -> None:
    """Telemetry (the main thread) reads the RSS history while the governor's thread appends to it: a crash
    seen under load was `RuntimeError: deque mutated during iteration` in rss_slope_mb_per_min."""
    gov = Governor(CFG, MEM, Sensors(tmp_path / "none"), Throttle(), lambda e: None, lambda why: None)
    for i in range(3000):
        gov.rss.append((float(i), 100.0 + i / 600))
    stop = threading.Event()
    errors: list[BaseException] = []

    def sample() -> None:
        now = 3000.0
        while not stop.is_set():
            now += 1.0
            gov.step(now)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as a busy device does at its worst
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            try:
                gov.rss_slope_mb_per_min()
            except RuntimeError as exc:
                errors.append(exc)
                break
    finally:
        stop.set()
        t.join(5)
        sys.setswitchinterval(old)
    assert not errors, errors
