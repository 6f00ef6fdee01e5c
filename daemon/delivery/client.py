"""The device's paho client: paho-mqtt 2.x with its writes kept on one thread and two per-message costs cut (issue 18).

- Debug log lines: paho formats one for every PUBLISH sent and every PUBACK received and hands it to
  `on_log`, which the session sets for paho's error lines (the reason a TLS session was closed). Here the
  debug lines are skipped unless a logger is attached (`enable_logger`); the others go on as before.
- PUBACKs: paho builds a `ReasonCode` (a lookup through its name table) and an empty `Properties`, twice,
  for every PUBACK (a third of the network thread's time per message). A plain success PUBACK (the packet
  id, then a success reason code, 0 or 16 "No matching subscribers", and a property length of 0, either
  of which a broker may leave out) is handed on with a shared reason code and one shared empty property
  set; any other (a failure code, properties) goes through paho's own decoding. `on_publish` handlers
  must not modify what they are given.

- Writes: only the network thread writes the socket. paho, when its network thread is not its own
  (`loop_start`) but ours, writes a packet in whichever thread publishes it, concurrently with the
  network thread: two threads writing one stream interleave a big packet written in part with another
  (mosquitto then drops us for a malformed packet; with TLS, one SSL object is used by two threads at
  once), and the publisher thread, the busiest on an idle machine, pays a system call per message. A
  registered write callback makes paho queue the packet and wake the network thread's select through its
  socket pair instead; that thread writes it, as it writes those it sends on each PUBACK.

Everything else is paho's: the PUBACK is matched, the message released and the next queued one sent by
paho's `_do_on_publish`, as for any PUBACK. The hooks are paho 2.x's (pinned < 3 in pyproject.toml);
tests/test_mqtt_client.py checks both paths against a real broker.
"""

from __future__ import annotations

from typing import Any, Literal

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

__all__ = ["DeviceClient"]

# PUBACK's success codes: 0 Success, 16 No matching subscribers (a failure is 0x80 or more)
_SUCCESS = {code: ReasonCode(PacketTypes.PUBACK, identifier=code) for code in (0x00, 0x10)}
_NO_PROPERTIES = Properties(PacketTypes.PUBACK)  # type: ignore[no-untyped-call]


def _written_by_the_network_thread(client: mqtt.Client, userdata: Any, sock: Any) -> None:
    """paho's write callback: registered, it keeps paho from writing in the publishing thread (nothing to do:
    the socket pair has woken the network thread)."""


class DeviceClient(mqtt.Client):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_socket_register_write = _written_by_the_network_thread

    def _easy_log(self, level: Any, fmt: str, *args: Any) -> None:
        if level == mqtt.MQTT_LOG_DEBUG and self._logger is None:
            return
        super()._easy_log(level, fmt, *args)

    def _handle_pubackcomp(self, cmd: Literal["PUBACK", "PUBCOMP"]) -> MQTTErrorCode:
        packet = self._in_packet["packet"]
        n = len(packet)
        # the packet id, then (optional) a success reason code and (optional) a property length of 0
        plain = cmd == "PUBACK" and self._protocol == MQTTProtocolVersion.MQTTv5 and 2 <= n <= 4
        code = _SUCCESS.get(packet[2] if n > 2 else 0x00) if plain and (n < 4 or packet[3] == 0) else None
        if code is None:  # a refusal, properties, a malformed packet: paho's own decoding
            return super()._handle_pubackcomp(cmd)
        mid = (packet[0] << 8) | packet[1]
        self._easy_log(mqtt.MQTT_LOG_DEBUG, "Received %s (Mid: %d)", cmd, mid)  # (nothing without a logger)
        with self._out_message_mutex:
            if mid in self._out_messages:
                return self._do_on_publish(mid, code, _NO_PROPERTIES)
        return MQTTErrorCode.MQTT_ERR_SUCCESS
