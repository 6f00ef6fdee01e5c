"""``edged keys generate``: Ed25519 signing keys for model packages and bundles."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser("keys", help="Ed25519 signing keys for model packages and bundles")
    ksub = keys.add_subparsers(dest="keys_verb", metavar="KEYS_VERB", required=True)
    kg = ksub.add_parser(
        "generate",
        help="a new key pair: ID.key (private, 0600) and ID.pub (copy it to devices' model.keys_dir)",
    )
    kg.add_argument("--dir", type=Path, required=True, help="where to write the pair")
    kg.add_argument("--name", help="file name instead of the key id")
    kg.set_defaults(func=_generate)


def _generate(args: argparse.Namespace) -> int:
    from edged.models.signing import generate_key

    key, pub = generate_key(args.dir, args.name)
    print(f"keys: wrote {key} (private: keep it off devices) and {pub} (put it in devices' model.keys_dir)")
    return 0
