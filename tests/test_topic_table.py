"""Wire nouns as data: the topic table (``edged.protocol.topics.TOPICS``) is the one source of the shipped broker
ACLs and of the topic reference (issue 28). docs/reference/topics.md is checked by tests/test_docs.py's
regeneration; the ACLs here."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from edged.deploy import acl
from edged.deploy.certs import acl as certs_acl
from edged.protocol import topics
from edged.protocol.topics import BY_KEY, TOPICS, Topic

from .conftest import REPO

SHIPPED = REPO / "systemd" / "mosquitto"
# Rights the ACLs give through a broader line than the row's own, each with that line
COVERED = {
    ("device", "push_reply"): "pattern write {p}/%u/reply/# (the reply row)",
    ("homeassistant", "ha_discovery"): "topic read homeassistant/#",
}


def test_the_shipped_acls_are_made_from_the_table() -> None:
    assert (SHIPPED / "edged.acl").read_text() == acl.site_acl("edged") == certs_acl("edged"), (
        "systemd/mosquitto/edged.acl: run `edged certs acl` > it"
    )
    assert (SHIPPED / "central.acl").read_text() == acl.central_acl("edged", "site1"), (
        "systemd/mosquitto/central.acl: write edged.deploy.acl.central_acl() to it"
    )


def _rights(rows: tuple[Topic, ...], principals: set[str]) -> set[tuple[str, str]]:
    """(principal, row) for every right the table gives one of `principals`, less the backend's reads under
    the prefix (its `topic read {p}/#`) and what COVERED grants through a broader line."""
    found: set[tuple[str, str]] = set()
    for t in rows:
        for who in {t.writer, *t.readers} & principals:
            if who == "backend" and t.writer != "backend" and t.scope != "other":
                continue
            found.add((who, t.key))
    return found - set(COVERED)


def test_every_right_the_table_gives_is_granted_in_the_acls() -> None:
    site_rows = tuple(t for t in TOPICS if t.writer != "bridge")  # a bridge's own topic is on a central broker
    assert acl.granted(acl.SITE) == _rights(site_rows, {"device", "backend", "homeassistant"})
    bridged = {("device", t.key) for t in TOPICS if t.bridged} - set(COVERED)
    central = _rights(TOPICS, {"backend", "bridge"})
    assert acl.granted(acl.CENTRAL) == bridged | central


def test_a_row_the_acls_leave_out_is_found() -> None:
    """Not vacuous: a new device topic in the table and no grant for it, or a grant the table does not give."""
    extra = Topic("x", "…/x", "{p}/{d}/x", "out", "1", False, "device", (), "a new topic")
    site_rows = tuple(t for t in TOPICS if t.writer != "bridge")
    assert acl.granted(acl.SITE) - _rights((*site_rows, extra), {"device", "backend", "homeassistant"}) == set()
    assert _rights((*site_rows, extra), {"device"}) - acl.granted(acl.SITE) == {("device", "x")}
    with pytest.raises(ValueError, match="device neither reads nor writes push_sync"):
        acl.render([("pattern", "device", "command"), ("pattern", "device", "push_sync")], "edged")
    # a table that took the device's read of its commands away: the site ACL no longer renders it
    taken = replace(BY_KEY["command"], readers=())
    with pytest.raises(ValueError, match="device neither reads nor writes command"):
        acl.render([("pattern", "device", "command")], "edged", rows={"command": taken})


def test_the_bridge_forwards_what_the_table_bridges() -> None:
    """systemd/mosquitto/bridge.conf's `topic` lines: every bridged row once, up (`out`) what devices write and
    down (`in`) what they read, at the row's QoS (``1*``: at most 1)."""
    conf = (SHIPPED / "bridge.conf").read_text()
    lines = re.findall(r"^topic (\S+) (in|out) (\d)$", conf, re.M)
    want = [
        (t.filter.format(p="edged", d="+"), "out" if t.writer == "device" else "in", t.qos.rstrip("*"))
        for t in TOPICS
        if t.bridged and t.key != "push_reply"  # within …/reply/#
    ]
    assert sorted(lines) == sorted(want)


def test_every_row_is_built_by_its_builder() -> None:
    """The table's filters and the builders agree: each builder's topic matches its row's filter."""
    root = topics.device_root("edged", "cam-1")
    built = {
        "status": topics.status(root),
        "results": topics.results(root, "door"),
        "events": topics.events(root),
        "telemetry": topics.telemetry(root),
        "model_state": topics.model_state(root),
        "snapshot": topics.snapshot(root, "door"),
        "command": topics.command(root, "ping"),
        "command_reply": topics.command_reply(root, "ping"),
        "reply": root + "/reply/x/y",
        "push_reply": topics.push_reply(root, "t1"),
        "ota_request": topics.ota_request(root),
        "ota_data": topics.ota_data(root),
        "ota_status": topics.ota_status(root),
        "shadow": topics.shadow(root),
        "ha_state": topics.ha_state(root, "door"),
        "ha_discovery": topics.ha_discovery("homeassistant", "sensor", "cam-1", "cam-1_door"),
        "group_offer": topics.group_offer("edged", "lobby"),
        "push_sync": topics.push_sync("edged", "t1"),
        "config_desired": topics.config_desired(root),
        "config_group": topics.config_group("edged", "lobby"),
        "config_state": topics.config_state(root),
        "ha_pause": topics.command(root, "pause"),
        "ha_snapshot": topics.command(root, "snapshot"),
    }
    for key, topic in built.items():
        row = BY_KEY[key]
        pattern = re.escape(row.filter.format(p="edged", d="cam-1", site="+"))
        pattern = pattern.replace(r"\+", "[^/]+").replace("/\\#", "(/.+)?")
        assert re.fullmatch(pattern, topic), f"{key}: {topic} does not match {row.filter}"
    assert set(BY_KEY) - set(built) == {"ha_birth", "backend", "bridge_state"}  # not edged's to build
