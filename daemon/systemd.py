"""The sd_notify protocol: one datagram to $NOTIFY_SOCKET (no libsystemd needed).

Used for the one-line ``STATUS=`` that ``systemctl status edged`` shows. Outside systemd
(no $NOTIFY_SOCKET) every call is a no-op that returns False.
"""

from __future__ import annotations

import os
import socket


def notify(message: str, environ: dict[str, str] | None = None) -> bool:
    addr = (environ if environ is not None else os.environ).get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]  # an abstract socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(message.encode())
    except OSError:
        return False
    return True
