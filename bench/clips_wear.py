"""Flash wear of event clips: bytes the clip store writes per hour at a given event rate.

The demo video encoded once to H.264 as a camera sends it (openh264enc, 2 Mbit/s, a keyframe a second, 960x540
at 15 fps), looped into an hour of packets with their wall times; the real planner (daemon/record/planner.py),
the real muxer (record/mux.py) and the real store (record/store.py) on a clock of the script's, so an hour
runs in a minute or two: events of `--event-s` seconds arrive at each rate, with ``pre_s`` and ``post_s``
around them; overlapping ones merge. What the store wrote (`written_bytes`: MP4s and sidecars) is the flash
figure, beside the stream's own bytes per hour (what recording everything would write) and the muxing time.

    python bench/clips_wear.py [--rates 6,60,360] [--hours 1] [--pre 5] [--post 5] [--event-s 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from edged.daemon.capture.encoded import EncodedRing, Packet
from edged.daemon.capture.gstreamer.pipeline import modules
from edged.daemon.config.cameras import RecordConfig
from edged.daemon.record.mux import write_mp4
from edged.daemon.record.planner import ClipPlanner
from edged.daemon.record.store import ClipStore
from edged.models.demo import default_dir, fetch_demo
from edged.protocol.schemas import iso

FPS = 15
T0 = 1_790_000_000.0


def encode(video: Path, bitrate: int) -> tuple[str, list[tuple[int, int, bool, bytes]]]:
    g, _ = modules()
    p = g.parse_launch(
        f'filesrc location="{video}" ! qtdemux ! decodebin ! videoconvert ! openh264enc complexity=low '
        f"bitrate={bitrate} gop-size={FPS} ! h264parse ! video/x-h264,stream-format=avc,alignment=au ! "
        "appsink name=sink sync=false"
    )
    sink = p.get_by_name("sink")
    p.set_state(g.State.PLAYING)
    out, caps = [], ""
    while (s := sink.emit("try-pull-sample", 30 * g.SECOND)) is not None:
        b = s.get_buffer()
        _, m = b.map(g.MapFlags.READ)
        out.append((b.pts, b.duration, not b.has_flags(g.BufferFlags.DELTA_UNIT), bytes(m.data)))
        b.unmap(m)
        caps = s.get_caps().to_string()
    p.set_state(g.State.NULL)
    return caps, out


def run(
    caps: str, units: list[Any], rate_per_h: float, hours: float, rec: RecordConfig, event_s: float
) -> dict[str, Any]:
    loop_ns = units[-1][0] + units[-1][1]
    ring = EncodedRing(int(rec.ring_mb * 2**20), rec.pre_s + rec.max_clip_s + rec.post_s + 30.0)
    ring.new_segment(caps)
    now = [T0]
    mux_s: list[float] = []

    def timed_write(c: str, packets: Any, path: Path) -> Any:
        t = time.perf_counter()
        m = write_mp4(c, packets, path)
        mux_s.append(time.perf_counter() - t)
        return m

    with tempfile.TemporaryDirectory(prefix="clips-wear-") as tmp:
        store = ClipStore(Path(tmp), 1 << 40, 1e9, clock=lambda: now[0])
        store.recover()
        emitted: list[dict[str, Any]] = []
        planner = ClipPlanner({"cam": ring}, {"cam": rec}, store, timed_write, emitted.append, 64 << 20,
                              clock=lambda: now[0])  # fmt: skip
        rng = random.Random(7)
        n_frames = int(hours * 3600 * FPS)
        next_event = T0 + rng.expovariate(rate_per_h / 3600.0) if rate_per_h > 0 else float("inf")
        open_tracks: list[tuple[int, float, float]] = []  # (track, first, end)
        track = 0
        stream_bytes = 0
        for i in range(n_frames):
            loop, k = divmod(i, len(units))
            pts, dur, key, data = units[k]
            pts += loop * loop_ns
            wall = T0 + pts / 1e9
            now[0] = wall
            ring.add(Packet(wall, pts, dur, key, data))
            stream_bytes += len(data)
            while next_event <= wall:
                track += 1
                open_tracks.append((track, next_event, next_event + event_s))
                planner.observe(_event("object_appeared", track, next_event, next_event))
                next_event += rng.expovariate(rate_per_h / 3600.0)
            for t in [t for t in open_tracks if t[2] <= wall]:
                open_tracks.remove(t)
                planner.observe(_event("object_ended", t[0], t[1], t[2]))
            if i % (FPS // 2) == 0:
                planner.tick()
        for t in open_tracks:
            planner.observe(_event("object_ended", t[0], t[1], now[0]))
        planner.flush()
        s = store.stats
        return {
            "events_per_h": rate_per_h,
            "events": track,
            "clips": s.added,
            "merged": planner.stats.merged,
            "written_mb_per_h": round(s.written_bytes / 2**20 / hours, 1),
            "written_gb_per_day": round(s.written_bytes / 2**30 / hours * 24, 2),
            "stream_mb_per_h": round(stream_bytes / 2**20 / hours, 1),
            "share_of_stream": round(s.written_bytes / stream_bytes, 3),
            "mb_per_clip": round(s.written_bytes / 2**20 / max(1, s.added), 2),
            "mux_ms_p50": round(statistics.median(mux_s) * 1000, 1) if mux_s else None,
            "gaps": planner.stats.gaps,
        }


def _event(kind: str, track: int, first: float, last: float) -> dict[str, Any]:
    return {"type": kind, "camera": "cam", "track_id": track, "label": "face",
            "first_seen": iso(first), "last_seen": iso(last)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="6,60,360", help="events per hour, comma-separated")
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--pre", type=float, default=5.0)
    ap.add_argument("--post", type=float, default=5.0)
    ap.add_argument("--event-s", type=float, default=3.0)
    ap.add_argument("--bitrate", type=int, default=2_000_000)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "clips_wear.json")
    args = ap.parse_args()
    demo = fetch_demo(default_dir())
    caps, units = encode(demo.video, args.bitrate)
    rec = RecordConfig(pre_s=args.pre, post_s=args.post)
    rows = []
    for rate in (float(r) for r in args.rates.split(",")):
        t = time.monotonic()
        row = run(caps, units, rate, args.hours, rec, args.event_s)
        row["wall_s"] = round(time.monotonic() - t, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    doc = {
        "what": "bytes the clip store writes per hour (MP4s and sidecars) at each event rate",
        "stream": f"demo video, openh264enc {args.bitrate // 1000} kbit/s, keyframe every 1 s, 960x540@{FPS}",
        "record": {"pre_s": args.pre, "post_s": args.post, "event_s": args.event_s, "max_clip_s": rec.max_clip_s},
        "hours": args.hours,
        "rows": rows,
        "note": "simulated clock; muxing times on a 2-core machine shared with other work",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{'events/h':>9} {'clips':>6} {'MB/h':>8} {'GB/day':>7} {'of stream':>9} {'MB/clip':>8} {'mux ms':>7}")
    for r in rows:
        print(
            f"{r['events_per_h']:>9.0f} {r['clips']:>6} {r['written_mb_per_h']:>8.1f} "
            f"{r['written_gb_per_day']:>7.2f} {r['share_of_stream']:>9.3f} {r['mb_per_clip']:>8.2f} "
            f"{r['mux_ms_p50']!s:>7}"
        )
    print(f"stream: {rows[0]['stream_mb_per_h']} MB/h; written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
