"""``edged model init`` (a package from a detector's ONNX export; the logic is ``edged.models.init``), the
model check that ``pack``, ``verify`` and ``init`` share, and the golden pair writer."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    # edged.models.init.recognise.DECODERS, written out: the parser loads no part (tests/test_layout.py);
    # tests/test_decoder_names.py holds this help to that list
    p.add_argument("--decoder", help="yolov8, yolov5, yolox, efficient_nms, picodet, ssd_anchors, classify or ctc")
    p.add_argument(
        "--batch",
        help="fixed batch, or several (1,2,4: one model file each; the daemon runs the smallest that covers the "
        "frames ready) (default: as exported, the metadata's, else 1)",
    )
    p.add_argument("--input-size", help="W or WxH for dynamic height/width (default: the metadata's imgsz)")
    p.add_argument("--labels", type=Path, help="labels file, one per line (default: the metadata's names)")
    p.add_argument("--color", choices=("RGB", "BGR"), help="colour order the model was trained on")
    p.add_argument("--letterbox", choices=("center", "topleft"), help="where the letterboxed image sits")
    p.add_argument(
        "--pad-value",
        type=int,
        metavar="0-255",
        help="grey level of the letterbox's border, as the model was trained (default: the decoder family's, "
        "114 for Ultralytics' YOLO; some exports pad with 0)",
    )
    p.add_argument("--image", type=Path, help="a representative frame for the golden pair (default: none)")
    p.add_argument(
        "--fold",
        action="store_true",
        help="fold the preprocessing into the graph (as `edged model fold`): the model takes uint8 pixels, "
        "checked on values against the unfolded model",
    )
    p.set_defaults(func=_init)


def _init(args: argparse.Namespace) -> int:
    from edged.errors import PackageError
    from edged.models.init import InitOptions, init_package, parse_batches, parse_size
    from edged.models.package import verify_folder

    batches = parse_batches(args.batch) if args.batch else ()
    said: list[str] = []

    def finish(folder: Path) -> None:  # on the laid-out package, before it takes its name
        if args.image:
            said.append(write_golden(folder, args.image, 1e-3, 1e-2))
        checked = check_model(verify_folder(folder))
        if checked:
            said.append(checked)

    out, scratch = args.out, None
    if args.fold:  # init into a scratch folder, fold from it into --out (checked empty first)
        if args.out is not None and args.out.exists() and any(args.out.iterdir()):
            raise PackageError(f"{args.out}: exists and is not empty; give --out or remove it", code=Code.INIT_FAILED)
        scratch = Path(tempfile.mkdtemp(prefix="edged-init-"))
        out = scratch / "unfolded"
    opts = InitOptions(
        args.model, out, args.name, args.version, args.decoder, batches[-1] if batches else None,
        parse_size(args.input_size) if args.input_size else None, args.labels, args.color, args.letterbox,
        extra_batches=batches[:-1], pad_value=args.pad_value, finish=finish,
    )  # fmt: skip
    try:
        done = init_package(opts)
        if args.fold:
            done.package = _fold_made(done.package, args.out, args.image)
            done.decisions = [d for d in done.decisions if not d.startswith("package ")]
            said.append(f"fold: {done.package.ref} takes uint8 pixels {done.package.manifest.input.shape}, its "
                        "outputs checked against the unfolded model's")  # fmt: skip
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    for line in done.decisions:
        print(f"init: {line}")
    for line in said:
        print(line)
    for line in done.checks + ([] if args.image else ["no golden pair (--image FRAME adds one)"]):
        print(f"check: {line}")
    print(f"init: {done.package.ref} ready in {done.package.root}; next: edged model pack/sign, edged push")
    return 0


def _fold_made(made: Package, out: Path | None, image: Path | None) -> Package:
    from edged.models.fold import fold_package
    from edged.models.package import verify_folder

    dst = out or Path(made.manifest.name)
    fold_package(made.root, dst, letterboxed(made, [image] if image else []))
    pkg = verify_folder(dst)
    check_model(pkg)
    return pkg


def letterboxed(pkg: Package, images: list[Path]) -> list[Any]:
    """Each image as the daemon hands a folded model its pixels: letterboxed (or stretched) to the model's
    size, uint8 BGR [H, W, 3]."""
    import cv2

    from edged.daemon.capture.preprocess import Preprocessor
    from edged.errors import PackageError
    from edged.models.fold import folded_spec

    spec = pkg.manifest.input
    pre = Preprocessor(spec if spec.folded is not None else folded_spec(spec))
    rows = []
    for image in images:
        frame = cv2.imread(str(image), cv2.IMREAD_COLOR)
        if frame is None:
            raise PackageError(f"{image}: not an image OpenCV can read", code=Code.NOT_FOUND)
        row = pre.new_row()
        pre.run(frame, row)
        rows.append(row)
    return rows


def check_model(pkg: Package) -> str | None:
    """The model's I/O against its manifest: the input (models/validate.py), the outputs and the class
    count against the decoder (the daemon's own check, with the labels file read); then, for an ONNX package
    of several batches, each batch against its smallest on values (models/batchcheck.py), and for a folded
    one its golden pair at every batch (models/fold.py). Returns what the
    value check did, in words, or None when there was none."""
    from edged.models.validate import check_package

    def outputs(p: Package, shapes: dict[str, tuple[int, ...]]) -> None:
        from edged.daemon.decoders import build_decoder  # OpenCV: only where an ONNX model is checked

        m = p.manifest
        build_decoder(m.decoder, m.input, m.labels, shapes)

    check_package(pkg, outputs)
    from edged.models.fold import check_folded

    said = [s for s in (check_batch_values(pkg), check_folded(pkg)) if s]
    return "; ".join(said) or None


def check_batch_values(pkg: Package) -> str | None:
    """Each larger batch of an ONNX package against its smallest, row for row, on the golden image (when the
    package has one) and random rows, within the golden pair's tolerance; PackageError(batch_mismatch) naming
    the batch, the output and the largest difference."""

    from edged.daemon.backends import OnnxRuntimeBackend
    from edged.models.batchcheck import ATOL, RTOL, Run, check_batches
    from edged.models.golden import load_input

    m = pkg.manifest
    paths = pkg.batch_paths
    if m.kind != "onnx" or len(paths) < 2:
        return None
    g = m.golden
    golden = load_input(pkg.root / g.input) if g is not None else None
    backends = {b: OnnxRuntimeBackend(path, threads=1) for b, path in paths.items()}
    try:

        def runner(b: int) -> Run:
            return lambda x: backends[b].infer({m.input.name: x})

        smallest = min(backends)
        checked = check_batches(
            {b: runner(b) for b in backends if b != smallest}, (smallest, runner(smallest)), m.input.shape,
            m.input.dtype, golden, g.atol if g else ATOL, g.rtol if g else RTOL, where=pkg.ref,
        )  # fmt: skip
    finally:
        for backend in backends.values():
            backend.close()
    return (
        f"batches: {pkg.ref} at batch {', '.join(map(str, checked))} gives row for row what batch {smallest} gives"
        + (" (the golden image and random rows)" if golden is not None else " (random rows)")
    )


def write_golden(folder: Path, image: Path, atol: float, rtol: float) -> str:
    """Add a golden input/output pair to an unpacked ONNX package folder; what was done, in words."""
    import cv2
    import numpy as np

    from edged.daemon.backends import OnnxRuntimeBackend
    from edged.daemon.capture.preprocess import Preprocessor
    from edged.errors import PackageError
    from edged.models.golden import INPUT_FILE, OUTPUT_FILE, save_input
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
    save_input(folder / INPUT_FILE, batch, 1 if m.input.layout == "NCHW" else 3)  # exact, and small
    with open(folder / OUTPUT_FILE, "wb") as f:
        np.savez_compressed(f, **outputs)  # type: ignore[arg-type]
    fields = m.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
    if m.labels_file is None:
        fields["labels_file"] = None
    fields["golden"] = {"input": INPUT_FILE, "output": OUTPUT_FILE, "atol": atol, "rtol": rtol, "encoding": "palette"}
    stale = {m.golden.input, m.golden.output} - {INPUT_FILE, OUTPUT_FILE} if m.golden is not None else set()
    files = {name: folder / name for name in m.files if name not in stale} | {
        INPUT_FILE: folder / INPUT_FILE,
        OUTPUT_FILE: folder / OUTPUT_FILE,
    }
    (folder / SIG_FILE).unlink(missing_ok=True)  # the manifest changes: its old signature would not verify
    new = write_package(folder, fields, files)
    for name in stale:  # an older pair's files (golden_input.npy), no longer listed: not sent with the package
        (folder / name).unlink(missing_ok=True)
    return f"golden: {new.ref}: {len(outputs)} outputs for {image.name} (atol {atol:g}, rtol {rtol:g})"
