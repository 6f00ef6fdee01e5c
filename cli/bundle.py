"""``edged bundle build|verify``: deploy bundles, one file to install on devices or into a rootfs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bundle = sub.add_parser("bundle", help="deploy bundles: one file to install on devices or into a rootfs")
    bsub = bundle.add_subparsers(dest="bundle_verb", metavar="BUNDLE_VERB", required=True)
    bb = bsub.add_parser(
        "build",
        help="build a deploy bundle for a target",
        description="Wheels for the target, the systemd units, sysusers/tmpfiles, a default config, the "
        "pinned public keys, the initial model package(s), install.sh, and a manifest with every file's "
        "sha256 (signed with --key). On the device: tar xf BUNDLE && sudo edged-bundle/install.sh "
        "(or --root ROOTFS before flashing).",
    )
    bb.add_argument("--target", type=_target, choices=("host", "jetson-jp6"), required=True)
    bb.add_argument("--keys", type=Path, required=True, help="folder of *.pub keys devices will trust")
    bb.add_argument("--model", type=Path, action="append", default=[], help="initial model package tar (repeatable)")
    bb.add_argument("--key", type=Path, help="private key to sign the bundle manifest with")
    bb.add_argument("--wheelhouse", type=Path, help="extra wheels (e.g. a prebuilt aarch64 pycuda)")
    bb.add_argument("--out", type=Path, default=Path("."), help="output folder (default: here)")
    bb.add_argument(
        "--machine",
        choices=("aarch64", "x86_64"),
        default="aarch64",
        help="jetson-jp6: the CPU of the wheels (aarch64; x86_64 for an Ubuntu 22.04 PC or test rootfs)",
    )
    bb.set_defaults(func=_build)
    bv = bsub.add_parser(
        "verify",
        help="check a bundle's signature and every file before flashing or copying it",
        description="bundle.sig by one of --keys over the exact bundle.json, then every file's size and "
        "sha256, and nothing in the tar that bundle.json does not list. Exit 0 good, 1 not.",
    )
    bv.add_argument("bundle", type=Path)
    bv.add_argument("--keys", type=Path, required=True, help="folder of trusted *.pub keys")
    bv.set_defaults(func=_verify)


def _target(value: str) -> str:
    """JetPack 5 is not offered (no choice that is always refused), and asking for it says why."""
    if value == "jetson-jp5":
        raise argparse.ArgumentTypeError(
            "jetson-jp5: JetPack 5 ships Python 3.8 (Ubuntu 20.04) and edged needs Python >= 3.10; use JetPack 6 "
            "(--target jetson-jp6), or a device Python 3.10 and --target host on the device"
        )
    return value


def _build(args: argparse.Namespace) -> int:
    from edged.deploy.bundle import build_bundle
    from edged.models.signing import load_signing_key

    built = build_bundle(
        args.out,
        args.target,
        args.keys,
        args.model,
        load_signing_key(args.key) if args.key else None,
        args.wheelhouse,
        progress=lambda m: print(f"bundle: {m}", file=sys.stderr, flush=True),
        machine=args.machine,
    )
    print(f"bundle: {built.path}: {built.files} files, {len(built.wheels)} wheels for {built.target}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from edged.deploy.bundle import verify_bundle

    doc = verify_bundle(args.bundle, args.keys)
    files = doc["files"]
    count = len(files) if isinstance(files, dict) else 0
    print(f"bundle: {args.bundle}: signature and {count} files good (target {doc['target']})")
    return 0
