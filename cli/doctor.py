"""``edged doctor``: can this device run edged? One line per check, with the fix (edged.daemon.doctor)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_CONFIG = Path("/etc/edged/edged.yaml")


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doc = sub.add_parser(
        "doctor",
        help="check this device: Python, numpy, OpenCV, GStreamer and each camera's capture path, TensorRT, GPU, "
        "L4T, sensors, journald, state, broker, model",
        description="One line per check, with the fix: ok, FAIL (required: edged cannot serve this config here), "
        "warn (advisory) or n/a (not present on this machine, and what that means). Exit 0 when no required "
        "check fails, 1 when one does. install.sh and edged-firstboot.service run it and leave the daemon "
        "disabled on a failure.",
    )
    doc.add_argument("-c", "--config", type=Path, help=f"the device config (default: {DEFAULT_CONFIG} when it exists)")
    doc.add_argument("--json", action="store_true", help="print the checks as JSON (schema edged.doctor/1)")
    doc.add_argument("--strict", action="store_true", help="advisory warnings fail too")
    doc.add_argument("--broker-timeout", type=float, default=5.0, metavar="S", help="MQTT connect timeout (default 5)")
    doc.add_argument(
        "--root", type=Path, default=Path("/"), help="read /etc, /proc, /sys and /dev under this folder (default /)"
    )
    doc.set_defaults(func=_doctor)


def _doctor(args: argparse.Namespace) -> int:
    from edged.daemon.config import Config, load_config
    from edged.daemon.doctor import Check, failed, run_checks, to_json
    from edged.errors import EdgedError

    path: Path | None = args.config or (DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None)
    cfg: Config | None = None
    pre: list[Check] = []
    if path is not None:
        try:
            cfg = load_config(path)
            pre.append(Check("config", "ok", f"{path}: valid", required=True))
        except EdgedError as exc:
            pre.append(Check("config", "fail", str(exc), "edged check-config -c CONFIG", True))
    checks = pre + run_checks(cfg, args.root, args.broker_timeout)
    if cfg is None and path is not None:  # the config failed: its own line says why; drop "no config given"
        checks = [c for c in checks if c.name != "config" or c in pre]
    bad = failed(checks, args.strict)
    if args.json:
        print(json.dumps(to_json(checks, args.strict), indent=2))
    else:
        for c in checks:
            print(c.line())
        fails = sum(c.status == "fail" for c in bad)
        warns = len(bad) - fails
        parts = [f"{fails} required check(s) failed"] if fails else []
        parts += [f"{warns} warning(s) (--strict)"] if warns else []
        print(f"doctor: {', '.join(parts)}" if bad else "doctor: edged can run here")
    sys.stdout.flush()
    return 1 if bad else 0
