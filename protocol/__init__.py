"""The wire contract of edged: everything a subscriber or a pusher sees on the broker (DESIGN §4, §6).

    topics      one builder per topic (status, results, events, telemetry, model state, commands and
                replies, OTA request/data/status, discovery), the response topics a device may use, and
                `TOPICS`, the table of every topic (direction, QoS, retained, who writes and reads) that
                the topic reference and the shipped broker ACLs are made from
    schemas     schema ids, the shipped JSON Schemas (``schemas/*.schema.json``), payload builders
    commands    the command payload rules (strict JSON, ``expires_at``) and the reply document
    ota         OTA framing (offer, chunk request, chunk), transfer states (`OtaState`), the status document
    shadow      a push's shadow ask (`ShadowAsk`, ``--promote-if``), the verdict rules, the shadow report
    config_doc  remote configuration on the wire: the signed document, its envelope, the outcome
    client      the paho client factory (MQTT v5, TLS, last will), connect properties, reconnect bounds
    backoff     full-jitter retry timing

Error codes are `Code` (from `edged.errors`, re-exported here): every ``error.code`` on the wire is one.
Both ends import this package: the daemon, ``edged push`` and ``edged watch``. It imports nothing of
edged but `edged.errors` and the version, and no OpenCV, NumPy or ONNX Runtime.
"""

from __future__ import annotations

from edged.errors import Code

from . import topics
from .ota import OtaState
from .schemas import (
    EVENT_SCHEMA,
    MODEL_STATE_SCHEMA,
    OTA_SCHEMA,
    REPLY_SCHEMA,
    RESULT_SCHEMA,
    STATUS_SCHEMA,
    TELEMETRY_SCHEMA,
    schema,
)

__all__ = [
    "EVENT_SCHEMA",
    "MODEL_STATE_SCHEMA",
    "OTA_SCHEMA",
    "REPLY_SCHEMA",
    "RESULT_SCHEMA",
    "STATUS_SCHEMA",
    "TELEMETRY_SCHEMA",
    "Code",
    "OtaState",
    "schema",
    "topics",
]
