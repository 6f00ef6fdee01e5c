"""mosquitto ACLs made from the topic table (``edged.protocol.topics.TOPICS``): a site's (``edged certs acl``,
the shipped systemd/mosquitto/edged.acl) and a central broker's (the shipped systemd/mosquitto/central.acl).

A layout below says in which order and under which comments an ACL grants its principals the table's rows;
each grant's filter and its read/write come from the row (``read`` when the principal is among the row's
readers, ``write`` when it is the row's writer). tests/test_topic_table.py compares the shipped files with
`site_acl` and `central_acl`, and checks that every right the table gives is granted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from edged.protocol.topics import BY_KEY, TOPICS, Topic

# a layout: lines as they are (comments, `user`, broad grants; ``{p}`` is the prefix) and grants of a row,
# (``pattern``/``topic``, the principal whose rights it grants, the row's key)
Grant = tuple[str, str, str]
Layout = Sequence[str | Grant]

_DEVICE_ROWS = ("command", "ota_data", "status", "results", "events", "telemetry", "model_state", "snapshot")
_BACKEND_ROWS: tuple[Grant, ...] = (
    ("topic", "backend", "command"),
    ("topic", "backend", "ota_data"),
    ("topic", "backend", "group_offer"),
    ("topic", "backend", "config_desired"),
    ("topic", "backend", "config_group"),
    ("topic", "backend", "push_sync"),
    ("topic", "backend", "backend"),
)

SITE: Layout = (
    """\
# mosquitto ACL for an edged site (acl_file in edged.conf), topic prefix `{p}`: made by
# `edged certs acl --prefix {p}`. A site whose devices set another mqtt.topic_prefix makes its own
# with `edged certs acl --prefix PREFIX > /etc/mosquitto/edged.acl` (then SIGHUP mosquitto). Every
# client's user name is its certificate's CN (use_identity_as_username). The topics are those edged's
# daemon, `edged push` and `edged watch` use (docs/operator.md, Broker security).
#
# A device (CN = its device id) reads its own commands and OTA chunks, and writes only what the
# daemon publishes, under its own prefix: it can neither publish into another device's topics, read
# another device's commands, nor send commands (an OTA offer is cmd/ota) or OTA data, not even to
# itself. `pattern` lines apply to every client, the backend included.""",
    *(("pattern", "device", key) for key in _DEVICE_ROWS),
    ("pattern", "device", "ota_request"),
    ("pattern", "device", "ota_status"),
    ("pattern", "device", "shadow"),
    """\
# replies: the default one (…/cmd/<verb>/reply) and a response topic in the device's own namespace,
# an `edged push` offer's included (…/reply/_push/<transfer>); a command's response topic is confined to
# these (docs/subscriber.md, Commands).""",
    ("pattern", "device", "command_reply"),
    ("pattern", "device", "reply"),  # push_reply is within it
    """\
# Home Assistant discovery (homeassistant.enabled, discovery prefix `homeassistant`): the device's
# per-camera states and its own discovery configs (the node id is the device id).""",
    ("pattern", "device", "ha_state"),
    ("pattern", "device", "ha_discovery"),
    "# Home Assistant's pause switches and snapshot buttons (within the commands above)",
    ("pattern", "device", "ha_pause"),
    ("pattern", "device", "ha_snapshot"),
    "# a rollout's retained offer to a group (…/_groups/<group>/ota): read by every device, signed as every offer",
    ("pattern", "device", "group_offer"),
    """\
# remote configuration (`edged config push`): a signed document for the device itself and for each group,
# both retained, read by the device (which checks the signature); the outcome on its own …/config/state""",
    ("pattern", "device", "config_desired"),
    ("pattern", "device", "config_group"),
    ("pattern", "device", "config_state"),
    """
# The site's backend (CN = backend, `edged certs backend`; no device may be named so): reads every
# device (results, status and its last will, group discovery, replies, OTA requests and status), sends
# commands (cmd/ota is an OTA offer) and serves OTA chunks (`edged push`). It cannot forge what a
# device publishes.
user backend
topic read {p}/#""",
    *_BACKEND_ROWS,
    """
# Home Assistant's MQTT integration (CN = homeassistant, `edged certs device homeassistant`): reads the
# discovery configs, the devices' states, availability, telemetry and snapshots, announces its own birth
# (its status), and sends two verbs and no other: a camera's pause switch and its snapshot button.
user homeassistant
topic read homeassistant/#""",
    ("topic", "homeassistant", "ha_birth"),
    ("topic", "homeassistant", "status"),
    ("topic", "homeassistant", "ha_state"),
    ("topic", "homeassistant", "telemetry"),
    ("topic", "homeassistant", "snapshot"),
    ("topic", "homeassistant", "ha_pause"),
    ("topic", "homeassistant", "ha_snapshot"),
)

_CENTRAL_HEAD = """\
# mosquitto ACL for a CENTRAL broker that site brokers bridge up to (bridge.conf; docs/fleet.md, Broker
# tiers). Run the central broker with edged.conf (TLS, client certificates from the central CA, CN = user
# name) whose acl_file names this file. No device connects here: each site's bridge does, with its own
# identity, and the backend and consumers do.
#
# A site's bridge (CN = bridge-{site}): writes what that site's devices publish, reads the commands, OTA
# offers and chunks the backend sends them, the groups' retained offers (`edged push --group`), and its own
# state notification. One block per site; a site
# whose devices set another mqtt.topic_prefix names it in place of `{p}` (and so no site can write
# another site's topics: give each site its own prefix where sites do not trust each other).
user bridge-{site}"""
# the bridge carries each bridged row the way its devices would: what they write, then what they read
_BRIDGE_ROWS = [t.key for t in TOPICS if t.bridged and t.writer == "device" and t.key != "push_reply"]
_BRIDGE_ROWS += [t.key for t in TOPICS if t.bridged and "device" in t.readers]
CENTRAL: Layout = (
    _CENTRAL_HEAD,
    *(("topic", "device", key) for key in _BRIDGE_ROWS),
    ("topic", "bridge", "bridge_state"),
    """
# The backend and its consumers (CN = backend, `edged certs backend` from the central CA): as on a site
# (edged.acl), for every device of every site; consumers share the load with shared subscriptions
# ($share/<group>/{p}/+/results/+, docs/subscriber.md), which this ACL allows as the plain filter.
user backend
topic read {p}/#""",
    *_BACKEND_ROWS,
    ("topic", "backend", "bridge_state"),
)


def site_acl(prefix: str) -> str:
    """The ACL of a site broker whose devices use `prefix` (mqtt.topic_prefix); not checked here (certs.acl)."""
    return render(SITE, prefix)


def central_acl(prefix: str = "edged", site: str = "site1") -> str:
    """The ACL of a central broker with one site's bridge (user ``bridge-<site>``)."""
    return render(CENTRAL, prefix, site)


def render(layout: Layout, prefix: str, site: str = "site1", rows: Mapping[str, Topic] = BY_KEY) -> str:
    """`layout` as ACL text. A device's id is ``%u`` in a `pattern` line (the client's own) and ``+`` in a
    `topic` line (every device); a site is `site` in the bridge's own grants and ``+`` in others'. A row a
    layout names for a principal that neither writes nor reads it is a ValueError. `rows`: the table by key."""
    out = []
    for item in layout:
        if isinstance(item, str):
            out.append(item.format(p=prefix, site=site))
            continue
        keyword, who, key = item
        row = rows[key]
        rights = ("read" if who in row.readers else "") + ("write" if who == row.writer else "")
        if not rights:
            raise ValueError(f"ACL layout: {who} neither reads nor writes {key}")
        device = "%u" if keyword == "pattern" else "+"
        out.append(f"{keyword} {rights} {row.filter.format(p=prefix, d=device, site=site if who == 'bridge' else '+')}")
    return "\n".join(out) + "\n"


def granted(layout: Layout) -> set[tuple[str, str]]:
    """(principal, row key) of every grant in a layout."""
    return {(item[1], item[2]) for item in layout if not isinstance(item, str)}
