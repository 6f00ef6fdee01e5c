"""``edged config push | show | clear``: remote configuration (docs/operator.md, "Remote configuration").

push   (operator side) sign an overlay file and publish it, retained, to one device or a group; report each
       device's outcome (applied, refused with reasons, reverted with why) like `edged push`
show   (on the device) the documents in force from the state dir: source, version, signer, overlay
clear  (on the device) drop them (each source keeps its version floor); a reload then serves the file alone
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from .broker import add_broker_flags, broker_flags


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    config = sub.add_parser("config", help="remote configuration: signed overlays for a device or a group")
    csub = config.add_subparsers(dest="config_verb", metavar="CONFIG_VERB", required=True)
    push = csub.add_parser(
        "push",
        help="sign an overlay (a YAML file of the keys it changes) and publish it to a device or a group",
        description="Sign FILE (the config keys it changes: detection, zones, masks, publish, motion, fps_max, "
        "camera URIs of the allowed schemes, telemetry, governor thresholds; cameras as a mapping by name) "
        "and publish it retained; each device checks the signature, the version and the keys, applies it "
        "with a reload, and reverts when it is not ready again within remote_config.ready_timeout_s. Exit 0 "
        "when every device awaited applied it, 1 when any refused or reverted it or did not answer.",
        epilog="examples:\n  edged config push --device orin-07 --signing-key signer.key zones.yaml\n"
        "  edged config push --group dock --signing-key signer.key thresholds.yaml --timeout 120",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    who = push.add_mutually_exclusive_group(required=True)
    who.add_argument("--device", metavar="ID", help="one device")
    who.add_argument("--group", metavar="G", help="every device whose config `groups` lists G (now and later)")
    push.add_argument("file", type=Path, help="the overlay: a YAML (or JSON) mapping of the keys it changes")
    push.add_argument("--signing-key", type=Path, required=True, help="the Ed25519 private key (edged keys generate)")
    push.add_argument(
        "--version", type=int, help="the document's version, higher than the last (default: the time in seconds)"
    )
    push.add_argument("--comment", default="", help="a line kept with the document (who, why)")
    push.add_argument("--timeout", type=float, default=120.0, metavar="S", help="wait this long for outcomes (120)")
    push.add_argument("--no-wait", action="store_true", help="publish and exit")
    push.add_argument("-c", "--config", type=Path, help="a config file whose mqtt section to use (TLS, credentials)")
    add_broker_flags(push)
    push.set_defaults(func=_push)
    for verb, text in (
        ("show", "the documents in force on this device (its state dir)"),
        ("clear", "drop them; a reload (systemctl reload edged) then serves the config file alone"),
    ):
        p = csub.add_parser(verb, help=text)
        p.add_argument("-c", "--config", type=Path, default=Path("/etc/edged/edged.yaml"), help="the device's config")
        p.set_defaults(func=_show if verb == "show" else _clear)


def _push(args: argparse.Namespace) -> int:
    import yaml

    from edged.daemon.config import MqttConfig, load_mqtt_config
    from edged.daemon.config.mqtt import with_flags
    from edged.deploy.config_push import ConfigPusher
    from edged.errors import ConfigError
    from edged.models.signing import load_signing_key

    try:
        overlay = yaml.safe_load(args.file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{args.file}: {exc}") from exc
    if not isinstance(overlay, dict) or not overlay:
        raise ConfigError(f"{args.file}: an overlay is a non-empty mapping of config keys")
    key = load_signing_key(args.signing_key)
    mqtt_cfg = with_flags(
        load_mqtt_config(args.config) if args.config else MqttConfig(), args.config, broker_flags(args)
    )
    version = args.version if args.version is not None else int(time.time())
    target = {"device": args.device} if args.device else {"group": args.group}
    pusher = ConfigPusher(mqtt_cfg)
    pusher.connect()
    try:
        offline: list[str] = []
        if args.no_wait:
            devices = []
        elif args.device:
            devices = [args.device]
        else:
            devices, offline = pusher.discover(args.group)
            print(f"config: group {args.group}: {len(devices)} online, {len(offline)} offline", file=sys.stderr)
        outcomes = pusher.push(key, target, version, overlay, devices, args.timeout, args.comment)
    finally:
        pusher.close()
    ok = True
    for dev, o in sorted(outcomes.items()):
        why = f": {'; '.join(o.reasons)}" if o.reasons else ""
        print(f"  {dev}: {o.state if o.state != 'waiting' else 'no answer within the timeout'}{why}")
        ok = ok and o.state == "applied"
    for dev in offline:
        print(f"  {dev}: offline: takes the retained document when it comes back")
    return 0 if ok else 1


def _state(args: argparse.Namespace) -> tuple[Any, Any]:
    from edged.daemon.config import load_config
    from edged.daemon.lifecycle.remote import DocumentStore

    cfg = load_config(args.config)
    return cfg, DocumentStore(cfg)


def _show(args: argparse.Namespace) -> int:
    from edged.protocol.config_doc import ConfigDocument

    _, store = _state(args)
    state = store.read()
    checked = store.documents()
    out: dict[str, Any] = {"file": str(store.path), "documents": {}, "floor": state["floor"]}
    for source, env in state["documents"].items():
        doc = ConfigDocument.model_validate_json(env["document"])
        sig = json.loads(env["sig"])
        out["documents"][source] = {
            "version": doc.version,
            "issued_at": doc.issued_at,
            "comment": doc.comment,
            "signed_by": sig.get("key_id"),
            "in_force": source in checked,
            "overlay": doc.overlay,
        }
    out["overlay_in_force"] = store.overlay()
    print(json.dumps(out, indent=2))
    return 0


def _clear(args: argparse.Namespace) -> int:
    _, store = _state(args)
    state = store.read()
    dropped = sorted(state["documents"])
    state["documents"] = {}
    store.write(state)
    print(f"config: dropped {', '.join(dropped) or 'nothing'} from {store.path}; the versions stay refused")
    if dropped:
        print("config: `systemctl reload edged` (or SIGHUP, or `edged` cmd/reload) serves the config file alone now")
    return 0
