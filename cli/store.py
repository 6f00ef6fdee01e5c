"""``edged model verify|install|list|rollback``: the device's model store, from the command line.

Each verb opens the store named by the device config and, unless a running daemon holds the state
directory, first does what a start of the daemon does (a consistent store, staging wiped).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edged.errors import Code

if TYPE_CHECKING:
    from edged.daemon.config import Config
    from edged.models.signing import TrustStore
    from edged.models.store import Store


def add_parsers(msub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the store's verbs to the ``edged model`` group (``msub``)."""
    mv = msub.add_parser(
        "verify",
        help="run a device's checks on a package without installing it",
        description="The checks a device runs, in order: size caps, key pinned, signature, manifest, "
        "expiry, version against this store, compatibility, space, every file's size and hash. Exit 0 "
        "if it would install, 1 with the failing check's code if not.",
    )
    mv.add_argument("package", type=Path)
    mv.add_argument("-c", "--config", type=Path, required=True, help="the device config (keys, state_dir)")
    mv.set_defaults(func=_verify)
    mi = msub.add_parser("install", help="verify and install into the store (current on probation)")
    mi.add_argument("package", type=Path)
    mi.add_argument("-c", "--config", type=Path, required=True)
    mi.set_defaults(func=_install)
    ml = msub.add_parser("list", help="models in the store: versions, current, previous, probation, bad")
    ml.add_argument("-c", "--config", type=Path, required=True)
    ml.add_argument("--json", action="store_true")
    ml.set_defaults(func=_list)
    mr = msub.add_parser(
        "rollback",
        help="make previous current again; the current version is marked bad",
        description="current -> previous in the store; the version that was current is marked bad and never "
        "installed again. With --if-probation (what edged-rollback.service runs after a crash loop) it only "
        "acts while the current version is still on probation, so it rolls each version back at most once.",
    )
    mr.add_argument("name", nargs="?", help="the model (default: the config's model.name)")
    mr.add_argument("--if-probation", action="store_true", help="only if the current version is on probation")
    mr.add_argument("-c", "--config", type=Path, required=True)
    mr.set_defaults(func=_rollback)


def _open_store(config: Path) -> tuple[Config, Store]:
    from edged.daemon.config import load_config
    from edged.models.store import Store

    cfg = load_config(config)
    store = Store(cfg.state_dir, keep=cfg.model.keep_versions)
    _recover_unless_served(store, cfg.state_dir)
    return cfg, store


def _recover_unless_served(store: Store, state_dir: Path) -> None:
    """What a start of the daemon does (a consistent store, staging wiped), but only when no daemon holds
    the state directory's lock: a running one recovered the store at its start, and its staging/ may hold
    an over-the-air transfer being installed right now."""
    from edged.daemon.host.startup import StateLock
    from edged.errors import StateDirError

    try:
        lock = StateLock(state_dir)
    except StateDirError as exc:
        if exc.code != "locked":  # a read-only look (`edged model list` as another user): nothing to recover
            print(f"store: not recovered: {exc}", file=sys.stderr)
        return
    try:
        for line in store.recover():
            print(f"store: {line}", file=sys.stderr)
    finally:
        lock.release()


def _trust(cfg: Config) -> TrustStore:
    from edged.errors import PackageError
    from edged.models.signing import TrustStore

    trust = TrustStore.load(cfg.model.keys_dir)
    if not trust.keys:
        raise PackageError(
            f"model.keys_dir {cfg.model.keys_dir}: no *.pub keys, so no package can be trusted", code=Code.UNKNOWN_KEY
        )
    return trust


def _verify(args: argparse.Namespace) -> int:
    from edged.cli.model_init import check_model
    from edged.models.compat import detect
    from edged.models.package import open_package
    from edged.models.store.files import read_head

    cfg, store = _open_store(args.config)
    trust = _trust(cfg)
    package: Path = args.package
    manifest_bytes, sig_bytes = read_head(package)
    offer = store.check_offer(manifest_bytes, sig_bytes, trust, str(package), detect())
    with tempfile.TemporaryDirectory() as tmp:
        check_model(open_package(package, scratch=Path(tmp)))  # every file's size and hash, then the model
    m = offer.manifest
    what = "already installed (a no-op)" if offer.same_version else "would install"
    print(f"verify: {m.name}@{m.version} signed by {offer.key_id}: every check passed; {what}")
    return 0


def _install(args: argparse.Namespace) -> int:
    cfg, store = _open_store(args.config)
    trust = _trust(cfg)
    done = store.install(args.package, trust, progress=lambda m: print(f"install: {m}"))
    if done.status == "unchanged":
        print(f"model {done.name}@{done.version}: already installed; nothing to do")
    else:
        previous = f"previous {done.previous}" if done.previous is not None else "no previous version"
        print(f"model {done.name}@{done.version}: installed, current (on probation); {previous}")
    return 0


def _rollback(args: argparse.Namespace) -> int:
    from edged.errors import PackageError

    cfg, store = _open_store(args.config)
    name = args.name or cfg.model.name
    if name is None:
        raise PackageError("which model? give its name (the config uses model.package, not the store)")
    cur = store.pointer(name, "current")
    if args.if_probation and (cur is None or store.state(name).pending != cur):
        # exit 1: edged-rollback.service then skips its restart, and a daemon that crash-loops on
        # a model that already passed probation stays stopped for someone to look at
        what = f"current version {cur} is not on probation" if cur is not None else "no current version"
        print(f"model {name}: {what}; nothing rolled back", file=sys.stderr)
        return 1
    if args.if_probation and not store.probation_blames(name):
        # the failed starts never got as far as the model (a bad config, a locked or unwritable state dir)
        print(
            f"model {name}: {cur} is on probation, but no run died with it loaded; nothing rolled back",
            file=sys.stderr,
        )
        return 1
    was, now = store.rollback(name)
    print(f"model {name}: rolled back from {was} (marked bad) to {now}")
    return 0


def _list(args: argparse.Namespace) -> int:
    _, store = _open_store(args.config)
    out: list[dict[str, Any]] = []
    for name in store.names():
        st = store.state(name)
        out.append(
            {
                "name": name,
                "versions": store.versions(name),
                "current": store.pointer(name, "current"),
                "previous": store.pointer(name, "previous"),
                "probation": st.pending,
                "bad": st.bad,
                "highest_accepted": st.highest_accepted,
            }
        )
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    if not out:
        print(f"no models in {store.root}")
    for m in out:
        marks = []
        for v in m["versions"]:
            tags = [
                t
                for t, on in (
                    ("current", v == m["current"]),
                    ("previous", v == m["previous"]),
                    ("probation", v == m["probation"]),
                    ("bad", v in m["bad"]),
                )
                if on
            ]
            marks.append(f"{v}" + (f" ({', '.join(tags)})" if tags else ""))
        print(f"{m['name']}: " + ", ".join(marks))
    return 0
