"""``edged model …``: the package tools (pack, sign, golden, fold); the device's store and the demo models have
modules of their own (``edged.cli.store``, ``edged.cli.demo``) that add their verbs to this group."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from edged.cli import demo, model_init, store


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    model = sub.add_parser(
        "model", help="model packages: pack, sign, verify, fetch-demo; the device store: install, list, rollback"
    )
    msub = model.add_subparsers(dest="model_verb", metavar="MODEL_VERB", required=True)
    mp = msub.add_parser(
        "pack",
        help="a package folder -> one tar (signed with --key)",
        description="Check a package folder (manifest.json and every file it lists, sizes and hashes) and "
        "write a tar: manifest.json, manifest.sig, then the files. The same folder gives the same bytes.",
    )
    mp.add_argument("folder", type=Path)
    mp.add_argument("--out", type=Path, required=True, help="the .tar to write")
    mp.add_argument("--key", type=Path, help="private key (edged keys generate) to sign with")
    mp.set_defaults(func=_pack)
    ms = msub.add_parser("sign", help="sign a package folder or tar in place (adds or replaces manifest.sig)")
    ms.add_argument("package", type=Path)
    ms.add_argument("--key", type=Path, required=True)
    ms.set_defaults(func=_sign)
    store.add_parsers(msub)  # verify, install, list, rollback
    demo.add_parsers(msub)  # fetch-demo
    mg = msub.add_parser(
        "golden",
        help="add a golden input/output pair to a package folder (checked at every swap)",
        description="Run the package's model (ONNX Runtime) on an image, preprocessed as the daemon does, and "
        "store that batch (golden_input.npz: exact, a palette of each channel's values, compressed) "
        "and the outputs (golden_output.npz) in the package folder, named "
        "in manifest.json. A device loads a new version, runs the golden input and refuses to activate it "
        "unless every output is within atol + rtol * |expected|. The manifest changes, so sign again after.",
    )
    mg.add_argument("folder", type=Path, help="an unpacked package folder (its manifest.sig is removed)")
    mg.add_argument("--image", type=Path, required=True, help="a representative frame (JPEG/PNG)")
    mg.add_argument("--atol", type=float, default=1e-3, help="absolute tolerance (default 1e-3)")
    mg.add_argument("--rtol", type=float, default=1e-2, help="relative tolerance (default 1e-2)")
    mg.set_defaults(func=_golden)
    mf = msub.add_parser(
        "fold",
        help="fold a package's preprocessing into its ONNX graph: the model takes uint8 pixels (value-checked)",
        description="Write a new package folder whose ONNX model files (every batch) start with the manifest's "
        "preprocessing as ONNX nodes (colour order, uint8 to float, scale, mean/std, NHWC to NCHW), so the engine "
        "takes uint8 BGR pixels at the model's size and the camera side only letterboxes; the manifest's input "
        "becomes `pixels` (uint8 NHWC) with input.folded recording the model's own input. Refused unless the "
        "folded model gives the unfolded one's outputs within the golden tolerance on the golden input, the "
        "--image frames and random pixels. The golden pair becomes pixels with the unfolded model's outputs. "
        "Sign the new folder before pushing it.",
    )
    mf.add_argument("src", type=Path, help="an unpacked ONNX package folder")
    mf.add_argument("dst", type=Path, help="the folded package folder to write (absent or empty)")
    mf.add_argument(
        "--image",
        type=Path,
        action="append",
        default=[],
        help="a frame (JPEG/PNG) to check on too, letterboxed as the daemon does; repeatable. The first becomes "
        "the golden input when SRC has no golden pair (default: random pixels)",
    )
    mf.add_argument("--version", type=int, help="the new package's version (default: SRC's)")
    mf.set_defaults(func=_fold)
    model_init.add_parsers(msub)


def _pack(args: argparse.Namespace) -> int:
    from edged.models.package import pack_tar, verify_folder
    from edged.models.signing import load_signing_key

    pkg = verify_folder(args.folder)
    model_init.check_model(pkg)
    sig = load_signing_key(args.key).sign(pkg.manifest_bytes) if args.key else None
    pack_tar(pkg, args.out, sig)
    print(f"pack: {pkg.ref} -> {args.out}" + (" (signed)" if sig else " (unsigned: devices refuse it until signed)"))
    return 0


def _fold(args: argparse.Namespace) -> int:
    from edged.models.fold import fold_package
    from edged.models.package import verify_folder

    frames = model_init.letterboxed(verify_folder(args.src), args.image)
    pkg = verify_folder(fold_package(args.src, args.dst, frames, args.version))
    checked = model_init.check_model(pkg)
    print(
        f"fold: {pkg.ref} -> {args.dst}: takes uint8 pixels {pkg.manifest.input.shape}; every batch gives the "
        f"unfolded model's outputs on the golden input, {len(frames)} --image frame(s) and random pixels"
        + (f"; {checked}" if checked else "")
        + "; sign it before pushing"
    )
    return 0


def _golden(args: argparse.Namespace) -> int:
    from edged.cli.model_init import write_golden

    print(write_golden(args.folder, args.image, args.atol, args.rtol) + "; sign the package again")
    return 0


def _sign(args: argparse.Namespace) -> int:
    from edged.models.package import open_package, pack_tar, verify_folder
    from edged.models.signing import SIG_FILE, load_signing_key

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
