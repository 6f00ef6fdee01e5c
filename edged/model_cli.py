"""``edged model pack|sign|verify|install|list|rollback``: the package tools and the device's store."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from edged.errors import PackageError, StateDirError
from edged.models.compat import detect
from edged.models.package import open_package, pack_tar, verify_folder
from edged.models.signing import SIG_FILE, TrustStore, load_signing_key
from edged.models.store import Store, read_head


def _recover_unless_served(store: Store, state_dir: Path) -> None:
    """What a start of the daemon does (a consistent store, staging wiped), but only when no daemon holds
    the state directory's lock: a running one recovered the store at its start, and its staging/ may hold
    an over-the-air transfer being installed right now."""
    from edged.daemon.startup import StateLock

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


def run(args: argparse.Namespace) -> int:
    verb = args.model_verb
    if verb == "pack":
        return _pack(args)
    if verb == "sign":
        return _sign(args)
    if verb == "golden":
        return _golden(args)
    from edged.daemon.config import load_config

    cfg = load_config(args.config)
    store = Store(cfg.state_dir, keep=cfg.model.keep_versions)
    _recover_unless_served(store, cfg.state_dir)
    if verb == "list":
        return _list(store, args.json)
    if verb == "rollback":
        name = args.name or cfg.model.name
        if name is None:
            raise PackageError("which model? give its name (the config uses model.package, not the store)")
        cur = store.pointer(name, "current")
        if args.if_probation and (cur is None or store.state(name).pending != cur):
            # exit 1: edged-rollback.service then skips its restart, and a daemon that crash-loops on
            # a model that already passed probation stays stopped for someone to look at
            print(f"model {name}: current version {cur} is not on probation; nothing rolled back", file=sys.stderr)
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
    trust = TrustStore.load(cfg.model.keys_dir)
    if not trust.keys:
        raise PackageError(
            f"model.keys_dir {cfg.model.keys_dir}: no *.pub keys, so no package can be trusted", code="unknown_key"
        )
    if verb == "verify":
        return _verify(store, trust, args.package)
    done = store.install(args.package, trust, progress=lambda m: print(f"install: {m}"))
    if done.status == "unchanged":
        print(f"model {done.name}@{done.version}: already installed; nothing to do")
    else:
        print(f"model {done.name}@{done.version}: installed, current (on probation); previous {done.previous}")
    return 0


def _pack(args: argparse.Namespace) -> int:
    pkg = verify_folder(args.folder)
    sig = load_signing_key(args.key).sign(pkg.manifest_bytes) if args.key else None
    pack_tar(pkg, args.out, sig)
    print(f"pack: {pkg.ref} -> {args.out}" + (" (signed)" if sig else " (unsigned: devices refuse it until signed)"))
    return 0


def _golden(args: argparse.Namespace) -> int:
    import cv2
    import numpy as np

    from edged.daemon.backends import OnnxRuntimeBackend
    from edged.daemon.preprocess import Preprocessor
    from edged.models.package import write_package

    pkg = verify_folder(args.folder)
    m = pkg.manifest
    if m.kind != "onnx":
        raise PackageError(f"{pkg.ref}: golden pairs are made here for ONNX packages; make an engine's on a device")
    frame = cv2.imread(str(args.image), cv2.IMREAD_COLOR)
    if frame is None:
        raise PackageError(f"{args.image}: not an image OpenCV can read", code="not_found")
    pre = Preprocessor(m.input)
    row = pre.new_row()
    pre.run(frame, row)
    batch = np.ascontiguousarray(np.broadcast_to(row, m.input.shape), dtype=m.input.dtype)
    with OnnxRuntimeBackend(pkg.model_path, threads=1) as backend:
        outputs = backend.infer({m.input.name: batch})
    with open(args.folder / "golden_input.npy", "wb") as f:
        np.save(f, batch, allow_pickle=False)
    with open(args.folder / "golden_output.npz", "wb") as f:
        np.savez(f, **outputs)  # type: ignore[arg-type]
    fields = m.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
    fields["golden"] = {
        "input": "golden_input.npy",
        "output": "golden_output.npz",
        "atol": args.atol,
        "rtol": args.rtol,
    }
    files = {name: args.folder / name for name in m.files} | {
        "golden_input.npy": args.folder / "golden_input.npy",
        "golden_output.npz": args.folder / "golden_output.npz",
    }
    (args.folder / SIG_FILE).unlink(missing_ok=True)  # the manifest changes: its old signature would not verify
    new = write_package(args.folder, fields, files)
    print(
        f"golden: {new.ref}: {len(outputs)} outputs for {args.image.name} (atol {args.atol:g}, rtol {args.rtol:g}); "
        "sign the package again"
    )
    return 0


def _sign(args: argparse.Namespace) -> int:
    key = load_signing_key(args.key)
    if args.package.is_dir():
        pkg = verify_folder(args.package)
        (args.package / SIG_FILE).write_bytes(key.sign(pkg.manifest_bytes))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            pkg = open_package(args.package, scratch=Path(tmp))
            pack_tar(pkg, args.package, key.sign(pkg.manifest_bytes))
    print(f"sign: {pkg.ref} signed with key {key.key_id}")
    return 0


def _verify(store: Store, trust: TrustStore, package: Path) -> int:
    manifest_bytes, sig_bytes = read_head(package)
    offer = store.check_offer(manifest_bytes, sig_bytes, trust, str(package), detect())
    with tempfile.TemporaryDirectory() as tmp:
        open_package(package, scratch=Path(tmp))  # every file's size and hash
    m = offer.manifest
    what = "already installed (a no-op)" if offer.same_version else "would install"
    print(f"verify: {m.name}@{m.version} signed by {offer.key_id}: every check passed; {what}")
    return 0


def _list(store: Store, as_json: bool) -> int:
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
    if as_json:
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
