"""The few MQTT v5 packets bench/fleet.py's simulated devices and consumers speak over raw sockets."""

from __future__ import annotations

import struct


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def mqtt_str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("!H", len(b)) + b


def connect_packet(client_id: str, keepalive: int = 60, receive_maximum: int = 0) -> bytes:
    # protocol name, level 5, flags: clean start; keepalive; properties: Receive Maximum (how many QoS 1
    # messages the broker may send us unacknowledged; mosquitto's default is 20) when given
    props = b"\x21" + struct.pack("!H", receive_maximum) if receive_maximum else b""
    body = (
        mqtt_str("MQTT")
        + bytes([5, 0x02])
        + struct.pack("!H", keepalive)
        + varint(len(props))
        + props
        + mqtt_str(client_id)
    )
    return b"\x10" + varint(len(body)) + body


def subscribe_packet(mid: int, topic: str) -> bytes:
    body = struct.pack("!H", mid) + b"\x00" + mqtt_str(topic) + b"\x01"  # QoS 1
    return b"\x82" + varint(len(body)) + body


def publish_packet(topic_bytes: bytes, mid: int, payload: bytes) -> bytes:
    body = topic_bytes + struct.pack("!H", mid) + b"\x00" + payload  # QoS 1, no properties
    return b"\x32" + varint(len(body)) + body


def puback_packet(mid: int) -> bytes:
    return b"\x40\x02" + struct.pack("!H", mid)


def packets(buf: bytearray) -> list[tuple[int, bytes]]:
    """Take every complete packet off the front of `buf`: (first byte, body)."""
    out: list[tuple[int, bytes]] = []
    start = 0
    while len(buf) - start >= 2:
        length, mult, i = 0, 1, start + 1
        while i < len(buf):
            digit = buf[i]
            length += (digit & 0x7F) * mult
            mult *= 128
            i += 1
            if not digit & 0x80:
                break
        else:
            break  # the length itself is not complete
        if len(buf) < i + length:
            break
        out.append((buf[start], bytes(buf[i : i + length])))
        start = i + length
    del buf[:start]
    return out
