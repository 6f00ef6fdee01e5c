"""The broker flags of the operator tools (`edged watch`, `edged push`): added to a parser in one place,
read back as one ``BrokerFlags``. Nothing of the daemon's runtime is imported."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edged.daemon.config.mqtt import BrokerFlags


def add_broker_flags(p: argparse.ArgumentParser) -> None:
    """--host, --port, --prefix, the TLS files and the credentials; each overrides the -c file's mqtt section."""
    p.add_argument("--host", help="broker host (default: the config's, else 127.0.0.1)")
    p.add_argument("--port", type=int, help="broker port (default: the config's, else 1883; 8883 with --cafile)")
    p.add_argument("--prefix", help="topic prefix (default: the config's, else edged)")
    p.add_argument("--cafile", type=Path, metavar="FILE", help="TLS: the CA that signed the broker's certificate")
    p.add_argument("--cert", type=Path, metavar="FILE", help="TLS: our client certificate (with --key)")
    p.add_argument("--key", type=Path, metavar="FILE", help="TLS: our client key (with --cert)")
    p.add_argument("--username", help="MQTT user name")
    p.add_argument("--password-file", type=Path, metavar="FILE", help="a file holding the MQTT password")


def broker_flags(args: argparse.Namespace) -> BrokerFlags:
    from edged.daemon.config.mqtt import BrokerFlags

    return BrokerFlags(
        host=args.host,
        port=args.port,
        prefix=args.prefix,
        cafile=args.cafile,
        cert=args.cert,
        key=args.key,
        username=args.username,
        password_file=args.password_file,
    )
