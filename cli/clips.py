"""``edged clips -d DEVICE``: a device's stored clips, asked over MQTT with the ``clips`` command (the device's
clip store, daemon/record/store.py), one line each; ``--fetch ID --http URL`` downloads one from the device's
local HTTP server and checks it against its SHA-256. Replies come to a response topic under the device's own
``…/reply/`` with correlation data, through the asker ``edged diagnose`` uses (cli/ask.py). Nothing of the
device runtime is loaded."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, TextIO

from .broker import add_broker_flags, broker_flags


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "clips",
        help="a device's stored event clips over MQTT (the clips command), and fetching one over HTTP",
        description="Send the `clips` command to a device and print its stored clips, newest first: id, camera, "
        "start, duration, size and whether it was uploaded, with the path of each MP4 on the device's local HTTP "
        "server (health:). With --fetch ID and --http URL, download that clip and check its SHA-256 against the "
        "device's sidecar. Needs the backend's identity on a site with the shipped ACL.",
        epilog="examples:\n  edged clips -d orin-07 -c operator.yaml\n  edged clips -d orin-07 -c operator.yaml "
        "--camera door --since 2026-12-01T00:00:00Z --json\n  edged clips -d orin-07 -c operator.yaml --fetch "
        "door-20261201T101500.250Z --http http://orin-07:9400 --token-file token --out clip.mp4",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-d", "--device", required=True, metavar="DEVICE", help="the device id")
    p.add_argument("-c", "--config", type=Path, help="a YAML file whose mqtt section to use")
    add_broker_flags(p)
    p.add_argument("--camera", help="this camera's clips only")
    p.add_argument("--since", metavar="ISO", help="clips that end after this time (ISO-8601 with its offset)")
    p.add_argument("--limit", type=int, default=50, metavar="N", help="at most N clips (default 50, at most 500)")
    p.add_argument("--json", action="store_true", help="print the reply's sidecars as JSON")
    p.add_argument("--timeout", type=float, default=30.0, metavar="S", help="the longest wait for the reply")
    p.add_argument("--fetch", metavar="ID", help="download this clip (with --http)")
    p.add_argument("--http", metavar="URL", help="the device's health endpoint, e.g. http://orin-07:9400")
    p.add_argument("--token-file", type=Path, metavar="FILE", help="the device's health.token_file (not loopback)")
    p.add_argument("--out", type=Path, metavar="FILE", help="where the fetched clip goes (default: ID.mp4)")
    p.set_defaults(func=_clips)


def _clips(args: argparse.Namespace) -> int:
    from edged.daemon.config import MqttConfig, load_mqtt_config
    from edged.daemon.config.mqtt import with_flags

    cfg = with_flags(load_mqtt_config(args.config) if args.config else MqttConfig(), args.config, broker_flags(args))
    asked: dict[str, Any] = {"limit": args.limit}
    if args.camera:
        asked["camera"] = args.camera
    if args.since:
        asked["since"] = args.since
    result = ask(cfg, args.device, asked, args.timeout)
    if args.fetch:
        clip = next((c for c in result["clips"] if c["id"] == args.fetch), None)
        if clip is None:
            where = "within --limit, --camera, --since"
            print(f"clips: {args.device} lists no clip {args.fetch} ({where})", file=sys.stderr)
            return 1
        if not args.http:
            print(f"clips: fetch it from the device's health endpoint: <http://host:port>{clip['url_path']}")
            return 2
        out = args.out or Path(f"{clip['id']}.mp4")
        token = args.token_file.read_text().strip() if args.token_file else None
        fetch(args.http.rstrip("/") + clip["url_path"], out, clip["sha256"], token, args.timeout)
        print(f"clips: {clip['id']} -> {out} ({clip['bytes']} bytes, SHA-256 checked)")
        return 0
    show(result, args.json)
    return 0


def ask(cfg: Any, device: str, asked: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """The device's reply result to ``clips`` with `asked`: {"clips": [...], "more", "stored"}."""
    from edged.protocol.commands import CLIPS_VERB

    from .ask import Asker

    with Asker(cfg, device, "clips", timeout_s) as asker:
        return asker.ask(CLIPS_VERB, asked)


def fetch(url: str, out: Path, sha256: str, token: str | None, timeout_s: float) -> None:
    """Download `url` to `out` (through ``out.part``) and check its SHA-256; EdgedError naming the cause."""
    from edged.errors import EdgedError

    if not url.startswith(("http://", "https://")):
        raise EdgedError(f"--http: {url!r} is not an http(s) URL")
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})  # noqa: S310
    part = out.with_name(out.name + ".part")
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp, open(part, "wb") as f:  # noqa: S310
            while chunk := resp.read(1 << 20):
                h.update(chunk)
                f.write(chunk)
    except (urllib.error.URLError, OSError) as exc:
        part.unlink(missing_ok=True)
        raise EdgedError(f"{url}: {exc}") from exc
    if h.hexdigest() != sha256:
        part.unlink(missing_ok=True)
        raise EdgedError(f"{url}: the download's SHA-256 {h.hexdigest()} is not the clip's {sha256}")
    part.replace(out)


def show(result: dict[str, Any], as_json: bool = False, out: TextIO = sys.stdout) -> None:
    clips = result.get("clips") or []
    if as_json:
        print(json.dumps(clips, indent=2), file=out)
        return
    for c in clips:
        up = "uploaded" if c.get("uploaded") else "on device"
        print(
            f"{c['id']:<48} {c['camera']:<12} {c['start']}  {c['duration_s']:>7.1f} s  {c['bytes'] / 2**20:>7.2f} MB  "
            f"{up:<9} {c['url_path']}",
            file=out,
        )
    more = " (more: narrow with --camera/--since or raise --limit)" if result.get("more") else ""
    print(f"clips: {len(clips)} listed of {result.get('stored')} stored{more}", file=sys.stderr)
