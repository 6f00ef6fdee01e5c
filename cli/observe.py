"""``edged watch`` (what a device publishes) and ``edged telemetry`` (what its sensors read, once).

The subscriber itself is ``edged.cli.watch``; it is imported only when ``edged watch`` runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .broker import add_broker_flags, broker_flags


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    w = sub.add_parser(
        "watch",
        help="subscribe to a device's topics and print them",
        description="Subscribe to <prefix>/<device>/# and print one line per message. Only broker settings are "
        "needed: flags, or -c with any YAML that has an mqtt: section (a device config will do; its device_id is "
        "the default --device). Flags override the file.",
        epilog="examples:\n  edged watch --host 127.0.0.1 --device orin-07\n"
        "  edged watch --host broker.site --port 8883 --device orin-07 --cafile pki/ca.crt \\\n"
        "      --cert pki/backend.crt --key pki/backend.key\n  edged watch -c operator.yaml --device orin-07\n"
        "  edged watch -c operator.yaml --device orin-07 --snapshot gate.jpg --camera gate",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    w.add_argument("-c", "--config", type=Path, help="a YAML file whose mqtt section to use (and device_id, if any)")
    w.add_argument("--device", metavar="ID", help="the device to watch (default: the config's device_id)")
    add_broker_flags(w)
    w.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
    w.add_argument("--count", type=int, metavar="N", help="stop after N results")
    w.add_argument("--only-detections", action="store_true", help="print only results that have detections")
    w.add_argument(
        "--snapshot",
        type=Path,
        metavar="OUT.jpg",
        help="ask the device for a camera's last frame with its detections drawn (the snapshot command) and "
        "write it; without --duration or --count, stop once written",
    )
    w.add_argument("--camera", metavar="NAME", help="the camera to snapshot (default: the first the device reports)")
    w.add_argument(
        "--video",
        type=Path,
        metavar="FILE",
        help="offline: draw the newest result with detections onto its frame of FILE (the video a file:// camera "
        "plays) instead of asking the device",
    )
    w.set_defaults(func=_watch)

    tel = sub.add_parser(
        "telemetry",
        help="print one reading of thermals, power, GPU load, power mode and memory",
        description="Read the sensors the governor uses, once, and print them.",
    )
    tel.add_argument("--root", type=Path, default=Path("/"), help="where sys/, proc/meminfo, var/lib/nvpmodel are")
    tel.add_argument("--json", action="store_true", help="print JSON")
    tel.set_defaults(func=_telemetry)


def _watch(args: argparse.Namespace) -> int:
    from edged.cli.watch import watch
    from edged.daemon.config import watch_settings

    cfg, device = watch_settings(args.config, broker_flags(args), device=args.device)
    logging.getLogger().setLevel(logging.WARNING)
    n = watch(
        cfg,
        device,
        args.duration,
        args.count,
        args.snapshot,
        args.video,
        only_detections=args.only_detections,
        camera=args.camera,
    )
    print(f"watch: {n} results", file=sys.stderr)
    return 0


def _telemetry(args: argparse.Namespace) -> int:
    import json

    from edged.daemon.host.sensors import Sensors

    r = Sensors(args.root).read()
    if args.json:
        print(json.dumps({**r.to_json(), "rss_mb": r.rss_mb}, indent=2))
        return 0
    temps = ", ".join(f"{k} {v:.1f} °C" for k, v in r.temps_c.items()) or "none"
    rails = ", ".join(f"{k} {v:.2f} W" for k, v in r.rails_w.items()) or "none"
    print(f"thermal: {temps}")
    total = "n/a" if r.power_w is None else f"{r.power_w:.2f} W ({r.power_source})"
    print(f"power: {total}; rails: {rails}")
    if r.oc_events:
        print("over-current events: " + ", ".join(f"{k} {v}" for k, v in r.oc_events.items()))
    if r.gpu:
        print(f"gpu: {r.gpu} load {r.gpu_load_pct} %, {r.gpu_freq_mhz} MHz")
    print(f"power mode: {r.power_mode or 'n/a'}")
    print(f"memory: this process {r.rss_mb} MB, available {r.mem_available_mb} MB, nvmap {r.nvmap_mb} MB")
    if r.missing:
        print(f"not on this machine: {', '.join(r.missing)}")
    return 0
