"""``edged model init`` (a package from a detector's ONNX export; the logic is ``edged.models.init``), the
model check that ``pack``, ``verify`` and ``init`` share, and the golden pair writer."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from edged.errors import Code

if TYPE_CHECKING:
    from edged.models.package import Package


def add_parsers(msub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = msub.add_parser(
        "init",
        help="a complete package from a detector's ONNX export (decoder, input spec, labels, golden pair)",
        description="Inspect an ONNX export and its metadata, fix dynamic dimensions, pick the decoder from the "
        "output shapes, write a package folder with every file's size and sha256 and a golden pair; print what "
        "was decided and why, and what to check.",
    )
    p.add_argument("model", type=Path, help="the .onnx export")
    p.add_argument("--out", type=Path, help="package folder to write (default ./NAME)")
    p.add_argument("--name", help="package name (default: the file's stem)")
    p.add_argument("--version", type=int, default=1, help="package version (default 1)")
    p.add_argument("--decoder", help="yolov8, yolov5, yolox, efficient_nms, picodet, ssd_anchors or classify")
    p.add_argument(
        "--batch",
        help="fixed batch, or several (1,2,4: one model file each; the daemon runs the smallest that covers the "
        "frames ready) (default: as exported, the metadata's, else 1)",
    )
    p.add_argument("--input-size", help="W or WxH for dynamic height/width (default: the metadata's imgsz)")
    p.add_argument("--labels", type=Path, help="labels file, one per line (default: the metadata's names)")
    p.add_argument("--color", choices=("RGB", "BGR"), help="colour order the model was trained on")
    p.add_argument("--letterbox", choices=("center", "topleft"), help="where the letterboxed image sits")
    p.add_argument("--image", type=Path, help="a representative frame for the golden pair (default: none)")
    p.set_defaults(func=_init)


def _init(args: argparse.Namespace) -> int:
    from edged.models.init import InitOptions, init_package, parse_batches, parse_size
    from edged.models.package import verify_folder

    batches = parse_batches(args.batch) if args.batch else ()
    opts = InitOptions(
        args.model, args.out, args.name, args.version, args.decoder, batches[-1] if batches else None,
        parse_size(args.input_size) if args.input_size else None, args.labels, args.color, args.letterbox,
        extra_batches=batches[:-1],
    )  # fmt: skip
    done = init_package(opts)
    for line in done.decisions:
        print(f"init: {line}")
    if args.image:
        print(write_golden(done.package.root, args.image, 1e-3, 1e-2))
    check_model(verify_folder(done.package.root))
    for line in done.checks + ([] if args.image else ["no golden pair (--image FRAME adds one)"]):
        print(f"check: {line}")
    print(f"init: {done.package.ref} ready in {done.package.root}; next: edged model pack/sign, edged push")
    return 0


def check_model(pkg: Package) -> None:
    """The model's I/O against its manifest: the input (models/validate.py), the outputs and the class
    count against the decoder (the daemon's own check, with the labels file read)."""
    from edged.models.validate import check_package

    def outputs(p: Package, shapes: dict[str, tuple[int, ...]]) -> None:
        from edged.daemon.decoders import build_decoder  # OpenCV: only where an ONNX model is checked

        m = p.manifest
        build_decoder(m.decoder, m.input, m.labels, shapes)

    check_package(pkg, outputs)


def write_golden(folder: Path, image: Path, atol: float, rtol: float) -> str:
    """Add a golden input/output pair to an unpacked ONNX package folder; what was done, in words."""
    import cv2
    import numpy as np

    from edged.daemon.backends import OnnxRuntimeBackend
    from edged.daemon.preprocess import Preprocessor
    from edged.errors import PackageError
    from edged.models.package import verify_folder, write_package
    from edged.models.signing import SIG_FILE

    pkg = verify_folder(folder)
    m = pkg.manifest
    if m.kind != "onnx":
        raise PackageError(f"{pkg.ref}: golden pairs are made here for ONNX packages; make an engine's on a device")
    frame = cv2.imread(str(image), cv2.IMREAD_COLOR)
    if frame is None:
        raise PackageError(f"{image}: not an image OpenCV can read", code=Code.NOT_FOUND)
    pre = Preprocessor(m.input)
    row = pre.new_row()
    pre.run(frame, row)
    batch = np.ascontiguousarray(np.broadcast_to(row, m.input.shape), dtype=m.input.dtype)
    with OnnxRuntimeBackend(pkg.model_path, threads=1) as backend:
        outputs = backend.infer({m.input.name: batch})
    with open(folder / "golden_input.npy", "wb") as f:
        np.save(f, batch, allow_pickle=False)
    with open(folder / "golden_output.npz", "wb") as f:
        np.savez(f, **outputs)  # type: ignore[arg-type]
    fields = m.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
    if m.labels_file is None:
        fields["labels_file"] = None
    fields["golden"] = {"input": "golden_input.npy", "output": "golden_output.npz", "atol": atol, "rtol": rtol}
    files = {name: folder / name for name in m.files} | {
        "golden_input.npy": folder / "golden_input.npy",
        "golden_output.npz": folder / "golden_output.npz",
    }
    (folder / SIG_FILE).unlink(missing_ok=True)  # the manifest changes: its old signature would not verify
    new = write_package(folder, fields, files)
    return f"golden: {new.ref}: {len(outputs)} outputs for {image.name} (atol {atol:g}, rtol {rtol:g})"
