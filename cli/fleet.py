"""``edged fleet`` (every device under a prefix, one line each) and ``edged diagnose`` (one device's doctor,
logs, effective config, spool and store, asked over MQTT). The readers are ``edged.deploy.fleet`` and
``edged.cli.diagnose``; neither loads the device runtime."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .broker import add_broker_flags, broker_flags

if TYPE_CHECKING:
    from edged.daemon.config import MqttConfig


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    f = sub.add_parser(
        "fleet",
        help="every device under a topic prefix in one table: state, model, probation, heat, spool, last error",
        description="Read the broker's retained statuses, model states and telemetry of every device under the "
        "prefix and print one line per device: online/offline/stopped and since when (an offline device: when "
        "the broker published its last will), edged's version, the model and version, probation, the hottest "
        "sensor, the governor's level, the spool's backlog and the last error. The read ends when a fence "
        "message comes back (every retained message has arrived), or after --wait.",
        epilog="examples:\n  edged fleet -c operator.yaml\n  edged fleet -c operator.yaml --offline --format csv\n"
        "  edged fleet -c operator.yaml --group dock --version faces@4 --format json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    f.add_argument("-c", "--config", type=Path, help="a YAML file whose mqtt section to use")
    add_broker_flags(f)
    f.add_argument("--format", choices=("table", "json", "csv"), default="table", help="output (default: table)")
    f.add_argument("--offline", action="store_true", help="only devices that are not online (offline, stopped)")
    f.add_argument("--version", metavar="V", help="only devices running model V (name@version or version) or edged V")
    f.add_argument("--group", metavar="G", help="only devices whose status lists group G (the config's groups)")
    f.add_argument("--error", action="store_true", help="only devices that report an error")
    f.add_argument("--wait", type=float, default=10.0, metavar="S", help="the longest wait for the fence (default 10)")
    f.set_defaults(func=_fleet)

    d = sub.add_parser(
        "diagnose",
        help="ask a device for its diagnostics over MQTT: doctor, recent logs, effective config, spool, store",
        description="Send the `diagnose` command to a device and print its reply: `edged doctor`'s checks, the "
        "daemon's last log lines (credentials scrubbed), the config in force with secrets removed, the spool's "
        "and the model store's state. A large reply comes in parts, asked for one by one and reassembled. "
        "Needs the backend's identity on a site with the shipped ACL.",
        epilog="examples:\n  edged diagnose orin-07 -c operator.yaml\n  edged diagnose orin-07 -c operator.yaml "
        "--lines 500 --json > orin-07.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.add_argument("device", metavar="DEVICE", help="the device id")
    d.add_argument("-c", "--config", type=Path, help="a YAML file whose mqtt section to use")
    add_broker_flags(d)
    d.add_argument("--lines", type=int, default=200, metavar="N", help="log lines to ask for (default 200)")
    d.add_argument("--json", action="store_true", help="print the reassembled document as JSON")
    d.add_argument(
        "--part-size",
        type=int,
        metavar="CHARS",
        help="characters of the document per reply, 1024 to 98304 (the default): smaller for a broker whose "
        "message_size_limit is lower",
    )
    d.add_argument("--timeout", type=float, default=60.0, metavar="S", help="the longest wait for each part")
    d.set_defaults(func=_diagnose)


def _broker(args: argparse.Namespace) -> MqttConfig:
    from edged.daemon.config import MqttConfig, load_mqtt_config
    from edged.daemon.config.mqtt import with_flags

    return with_flags(load_mqtt_config(args.config) if args.config else MqttConfig(), args.config, broker_flags(args))


def _fleet(args: argparse.Namespace) -> int:
    from edged.deploy.fleet import FleetReader, render, rows, select

    reader = FleetReader(_broker(args))
    seen, fenced = reader.read(args.wait)
    table = select(rows(seen), args.offline, args.version, args.group, args.error)
    print(render(table, args.format))
    if args.format == "table":
        offline = sum(r.state != "online" for r in table)
        print(f"fleet: {len(table)} device(s), {offline} not online" + ("" if fenced else " (fence missing)"),
              file=sys.stderr)  # fmt: skip
    return 0


def _diagnose(args: argparse.Namespace) -> int:
    from edged.cli.diagnose import ask, show

    doc = ask(_broker(args), args.device, args.lines, args.timeout, args.part_size)
    show(doc, args.json)
    return 0
