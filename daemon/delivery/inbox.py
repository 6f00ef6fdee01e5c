"""What comes in over MQTT, and where it goes: the device's subscriptions and the routing of each message.

    …/cmd/+      QoS 1   the command handler (Commands.on_message): verbs, their replies
    …/ota/data   QoS 0   a routed topic (OtaReceiver.on_data): OTA chunks
    <prefix>/_groups/<group>/ota   QoS 1   a topic outside the root (`route_topic`): a group's retained offer
    …/config/desired, <prefix>/_groups/<group>/config   QoS 1   signed config documents (lifecycle/remote.py)
    anything else        dropped (a conforming broker sends us nothing else)

Handlers run on paho's network thread and must only queue; one that raises is logged, never reaches paho.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import paho.mqtt.client as mqtt

from edged.protocol import topics

# the MQTT log lines keep the logger name they had before the split (operators and tests grep for it)
logger = logging.getLogger("edged.daemon.delivery.publisher")

MessageHandler = Callable[[mqtt.MQTTMessage], None]


class Inbox:
    def __init__(self, root: str, on_command: MessageHandler | None = None) -> None:
        """`root`: the device's topics (``<prefix>/<device>``); `on_command`: the handler of ``…/cmd/+``."""
        self.root = root
        self._on_command = on_command
        self._routes: dict[str, MessageHandler] = {}  # full topic -> handler, for topics other than cmd/+
        self._qos: dict[str, int] = {}  # full topic -> its subscription's QoS where not 0

    def route(self, suffix: str, handler: MessageHandler) -> None:
        """Subscribe (at every connect) to our topic `suffix` and hand its messages to `handler`."""
        self._routes[f"{self.root}/{suffix}"] = handler

    def route_topic(self, topic: str, handler: MessageHandler, qos: int = 1) -> None:
        """Subscribe (at every connect) to a topic outside our root (a group's offer) at `qos`."""
        self._routes[topic] = handler
        self._qos[topic] = qos

    def subscriptions(self) -> list[tuple[str, int]]:
        """(topic filter, QoS) to subscribe to at every connect."""
        subs = [(topics.commands(self.root), 1)] if self._on_command is not None else []
        return subs + [(topic, self._qos.get(topic, 0)) for topic in self._routes]

    def dispatch(self, msg: mqtt.MQTTMessage) -> None:
        """Hand `msg` to its handler (paho's network thread); nothing escapes to paho."""
        handler = self._routes.get(msg.topic, self._on_command)
        if handler is None:
            return
        try:
            handler(msg)
        except Exception:  # the handler must not raise; if it does, it must not reach paho
            logger.exception("mqtt: command handler failed on %s", msg.topic)
