"""The short chaos soak (bench/soak_chaos.py, in the slow set): the daemon as its own process with a looping
file camera and a real RTSP camera, against a real mosquitto, while a seeded schedule kills the broker
twice, SIGSTOPs and SIGCONTs the daemon, SIGHUPs it, restarts the camera server and pushes a new model
version over the air. Nothing may be lost, duplicates only as many as the daemon's MQTT disconnects, and
fds, threads and RSS must end where they were after warm-up, within bounds.

The model push is done at the start, inside the warm-up: a side-by-side hot swap raises RSS once (+20-35 MB
here) and does not give it back, which would otherwise swamp the growth this run measures.

The bounds, against the leak this guards (issue 26, on fb29df4: each GStreamer (re)open leaked 4-6 fds and
1.5-4 MB): in this run the file camera wraps 11 times (every 20 s) and the RTSP camera reopens 11-12 times
(at each end of the served file and at the server's restart). Measured on a 2-core machine shared with
other work (2026-12-02), this plan on this code, twice: fds +0 and +0, threads +0 and +0, RSS +19.1 and
+20.7 MB (after warm-up 309.1 and 316.3, end 328.2 and 337.0); the same plan with fb29df4's GStreamer
close put back into a copy of capture/gstreamer/pipeline.py (the daemon run from that copy through $PYTHONPATH): fds +64
(67 -> 131), RSS +70.8 MB, threads +0.5, and this test failed (on the fd bound, the first checked; the
RSS bound fails too). The fd bound is the sharp one; the RSS bound leaves 19 MB over the highest measured
growth, so a leak of about 1 MB or more per reopen fails it."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))  # the bench scripts import their siblings by name
soak_chaos = importlib.import_module("soak_chaos")
soak_watch = importlib.import_module("soak_watch")
Received, tally = soak_watch.Received, soak_watch.tally

MAX_FDS = 6  # fds at the end over after warm-up (medians of 25 s each)
MAX_THREADS = 4  # GStreamer's streaming threads come and go from a pool
MAX_RSS_MB = 40.0  # RSS at the end over after warm-up (medians of 25 s each)


def short_plan(seed: int) -> Any:
    counts = {"broker_kill": 2, "stop_cont": 1, "sighup": 1, "camera_restart": 1, "ota_push": 0}
    return soak_chaos.Plan(
        minutes=4, seed=seed, warmup_s=60, base_s=25, cooldown_s=45, print_s=30, counts=counts, in_warmup=("ota_push",)
    )


@pytest.mark.slow
@pytest.mark.start_early(260)  # 4 minutes by its plan, most of it waiting: beside a CPU-bound test
@pytest.mark.timeout(1800)  # about 5 minutes here; the start-up and the push take 3x as long on a busy machine
def test_a_short_chaos_soak_loses_nothing_and_keeps_fds_threads_and_memory_flat(tmp_path: Path) -> None:
    res = soak_chaos.Soak(short_plan(seed=26), tmp_path, print).run()
    text = soak_chaos.summary(res)
    print(text)
    (tmp_path / "soak.json").write_text(json.dumps(res, indent=1))
    r, g, done = res["results"], res["growth"], res["action_counts"]
    assert done == {"broker_kill": 2, "stop_cont": 1, "sighup": 1, "camera_restart": 1, "ota_push": 1}, text
    assert all(a["ok"] for a in res["actions"]), text
    assert res["daemon_exit"] == 0 and res["tracebacks_in_log"] == 0, text
    assert len(r["boots"]) == 1, f"the daemon restarted:\n{text}"
    assert r["lost"] == 0 and res["unreceived_tail"] == 0, text
    assert res["mqtt_disconnects"] >= 2, f"each broker kill is a disconnect:\n{text}"
    assert r["duplicates"] <= res["mqtt_disconnects"], text
    assert r["loop_wraps"] >= 1 and r["versions_in_order"] == [1, 2], text
    assert max(r["longest_silence_s"].values()) < 60, f"a camera stopped delivering:\n{text}"
    assert min(r["per_camera"].values()) > 0 and set(r["per_camera"]) == {"lobby", "gate"}, text
    assert g["fds"]["growth"] <= MAX_FDS, text
    assert g["threads"]["growth"] <= MAX_THREADS, text
    assert g["rss_mb"]["growth"] <= MAX_RSS_MB, text


def test_the_soak_counts_a_gap_as_lost_and_a_second_copy_as_a_duplicate() -> None:
    """What the soak's verdict rests on (fast, in the default set): a missing seq is lost, a repeated one a
    duplicate, a new boot starts its own sequence, a file camera's frame index going back is a loop wrap."""

    def got(boot: str, seq: int, camera: str = "lobby", frame: int = 0, at: float = 0.0) -> Any:
        return Received(boot, seq, camera, frame, 1, at)

    items = [got("a", 1, frame=298), got("a", 2, frame=299), got("a", 2, frame=299), got("a", 4, frame=0, at=7.5)]
    items += [got("b", 1, "gate", at=1.0), got("b", 2, "gate", at=3.0)]
    t = tally(items, "lobby")
    assert (t["lost"], t["duplicates"], t["unique"], t["received"]) == (1, 1, 5, 6)
    assert t["boots"]["a"]["missing_first"] == [3] and t["boots"]["b"]["missing"] == 0
    assert t["loop_wraps"] == 1 and t["longest_silence_s"] == {"lobby": 7.5, "gate": 2.0}
    assert t["per_camera"] == {"lobby": 3, "gate": 2}


def test_a_seed_draws_the_same_schedule_and_another_seed_another() -> None:
    counts = {"broker_kill": 3, "stop_cont": 2, "sighup": 1, "camera_restart": 2, "ota_push": 1}
    first = soak_chaos.schedule(7, 60, 600, counts)
    assert first == soak_chaos.schedule(7, 60, 600, counts) != soak_chaos.schedule(8, 60, 600, counts)
    assert sorted(a.kind for a in first) == sorted(k for k, n in counts.items() for _ in range(n))
    assert all(60 <= a.at_s <= 600 for a in first) and [a.at_s for a in first] == sorted(a.at_s for a in first)
