"""The model package: a folder or a tar file holding ``manifest.json``, the model and its labels.

``manifest.json`` (schema ``edged.model/1``) says how to feed the model (input spec), how to read
its outputs (decoder), what it needs (compatibility) and every file's size and sha256. Loading a
package checks sizes and hashes before anything is handed to a backend, so a truncated or
tampered model file is refused with a clear error instead of crashing inside ONNX Runtime.
``manifest.sig`` (signing.py) signs the exact manifest bytes this module reads; the on-device
store is store.py.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from edged.errors import Code, PackageError

from .labels import package_labels
from .labels import read_labels as read_labels
from .signing import MAX_SIG_BYTES, SIG_FILE

SCHEMA = "edged.model/1"
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 256 * 1024
_CHUNK = 1 << 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Folded(_Strict):
    """The model's own input before its preprocessing was folded into the graph (models/fold.py): what the
    graph's first nodes now compute from uint8 BGR pixels, NHWC, at the model's size."""

    name: str
    dtype: Literal["float32", "float16", "uint8"]
    layout: Literal["NCHW", "NHWC"]
    color: Literal["RGB", "BGR"]
    scale: float
    mean: list[float] = Field(min_length=3, max_length=3)
    std: list[float] = Field(min_length=3, max_length=3)


class InputSpec(_Strict):
    """How a camera frame becomes one row of the model's input tensor.

    value = (pixel * scale - mean[c]) / std[c], per channel in `color` order. A uint8 input takes the pixels
    as they are (scale, mean and std unused). `folded`: the preprocessing is in the graph (models/fold.py);
    the input is then uint8 BGR pixels, NHWC, and the camera side only letterboxes.
    """

    name: str
    shape: list[int] = Field(min_length=4, max_length=4)
    dtype: Literal["float32", "float16", "uint8"] = "float32"
    layout: Literal["NCHW", "NHWC"]
    color: Literal["RGB", "BGR"] = "RGB"
    scale: float = 1.0
    mean: list[float] = [0.0, 0.0, 0.0]
    std: list[float] = [1.0, 1.0, 1.0]
    resize: Literal["letterbox", "stretch"] = "letterbox"
    pad_value: int = Field(0, ge=0, le=255)
    # where a letterboxed image sits: centred, its size rounded (edged's default, as Ultralytics'
    # LetterBox; absent from the manifest), or at the top left with the padding bottom/right and its
    # size truncated (YOLOX's own preproc, int(w * r))
    letterbox: Literal["center", "topleft"] | None = None
    # the preprocessing folded into the graph (absent: as the fields above say, done on the camera side).
    # Also the gate for older devices: their manifests forbid unknown keys, so they refuse a folded package
    # at its offer, naming input.folded
    folded: Folded | None = None

    @field_validator("shape")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(d <= 0 for d in v):
            raise ValueError("every dimension must be a fixed positive size (the batch too)")
        return v

    @model_validator(mode="after")
    def _channels(self) -> InputSpec:
        want = 3
        if self.channels != want:
            raise ValueError(
                f"{self.layout} shape {self.shape} has {self.channels} channels, {self.color} needs {want}"
            )
        if len(self.mean) != want or len(self.std) != want or any(s == 0 for s in self.std):
            raise ValueError(f"mean and std need {want} values each, std non-zero")
        if self.folded is not None:
            plain = (self.dtype, self.layout, self.color, self.scale, self.mean, self.std)
            if plain != ("uint8", "NHWC", "BGR", 1.0, [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]):
                raise ValueError(
                    "a folded input takes uint8 BGR pixels, NHWC, scale 1, mean 0, std 1 (the graph does the rest: "
                    f"folded says what), not {self.dtype} {self.layout} {self.color} scale {self.scale:g} "
                    f"mean {self.mean} std {self.std}"
                )
            if any(s == 0 for s in self.folded.std):
                raise ValueError("folded.std must be non-zero")
        return self

    def unfolded(self) -> InputSpec:
        """The spec of the model before its preprocessing was folded in (itself when it was not)."""
        f = self.folded
        if f is None:
            return self
        b, h, w = self.batch, self.height, self.width
        shape = [b, 3, h, w] if f.layout == "NCHW" else [b, h, w, 3]
        fields = f.model_dump() | {"shape": shape, "folded": None}
        return self.model_copy(update=fields)

    @property
    def batch(self) -> int:
        return self.shape[0]

    @property
    def align(self) -> Literal["center", "topleft"]:
        return self.letterbox or "center"

    @property
    def height(self) -> int:
        return self.shape[2] if self.layout == "NCHW" else self.shape[1]

    @property
    def width(self) -> int:
        return self.shape[3] if self.layout == "NCHW" else self.shape[2]

    @property
    def channels(self) -> int:
        return self.shape[1] if self.layout == "NCHW" else self.shape[3]


class DecoderSpec(_Strict):
    type: str
    params: dict[str, Any] = {}


class GoldenSpec(_Strict):
    """A warm-up check: the model's outputs for `input` must match `output` (a .npz of output name -> array)
    within atol + rtol * |expected|, or the package is never activated. `input` is the batch in edged's
    exact compressed encoding (golden_input.npz, models/golden.py) or, in packages made before it, a plain
    .npy; models/golden.py's load_input reads either."""

    input: str
    output: str
    atol: float = Field(1e-3, ge=0)
    rtol: float = Field(1e-2, ge=0)
    # "palette": golden_input.npz (None: an old package's plain .npy). Also the gate for older devices: their
    # manifests forbid unknown keys, so they refuse such a package at its offer, naming golden.encoding
    encoding: Literal["palette"] | None = None


class FileEntry(_Strict):
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class BatchFile(_Strict):
    """One more fixed batch the package carries: the same model at batch `batch`, in its own `file`."""

    batch: int = Field(ge=1)
    file: str


class Manifest(_Strict):
    schema_: Literal["edged.model/1"] = Field("edged.model/1", alias="schema")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    version: int = Field(ge=1)
    created: str
    expires: str | None = None
    kind: Literal["onnx", "engine"]
    model_file: str
    # the smaller fixed batches the package also carries (the largest is input.shape[0], in model_file): the
    # daemon runs the smallest that covers the frames ready, so one camera does not pay for padding rows
    extra_batches: list[BatchFile] = []
    labels_file: str | None = "labels.txt"
    input: InputSpec
    decoder: DecoderSpec
    labels: list[str] = []
    precision: Literal["fp32", "fp16", "int8", "mixed"] = "fp32"
    compatibility: dict[str, Any] = {}
    source: dict[str, Any] = {}
    golden: GoldenSpec | None = None
    # "stage": a secondary model, run on crops of another model's detections (a cascade's stage: a classifier,
    # a CTC text recogniser). Absent: the primary, as every manifest before it. Also the gate for older devices:
    # their manifests forbid unknown keys, so they refuse a stage package at its offer, naming role
    role: Literal["stage"] | None = None
    files: dict[str, FileEntry]

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _files_listed(self) -> Manifest:
        for f in self.files:
            if "/" in f or f.startswith(".") or f == MANIFEST:
                raise ValueError(f"file name {f!r} must be a plain name inside the package")
        golden = (self.golden.input, self.golden.output) if self.golden else ()
        seen = {self.input.batch: self.model_file}
        for extra in self.extra_batches:
            if extra.batch >= self.input.batch or extra.batch in seen or extra.file in seen.values():
                raise ValueError(
                    f"extra_batches: batch {extra.batch} ({extra.file!r}) must be smaller than input.shape[0] "
                    f"({self.input.batch}), each batch and file once"
                )
            seen[extra.batch] = extra.file
        for needed in (self.model_file, self.labels_file, *golden, *(e.file for e in self.extra_batches)):
            if needed is not None and needed not in self.files:
                raise ValueError(f"{needed!r} is not listed in files")
        return self

    @property
    def batch_files(self) -> dict[int, str]:
        """Every fixed batch the package carries -> its model file, smallest first."""
        files = {e.batch: e.file for e in self.extra_batches} | {self.input.batch: self.model_file}
        return dict(sorted(files.items()))

    def to_json(self) -> bytes:
        doc = self.model_dump(by_alias=True, exclude_none=True)
        if not self.extra_batches:
            del doc["extra_batches"]  # a single-batch manifest reads as it always did
        if self.labels_file is None:
            doc["labels_file"] = None  # an explicit "no labels file", not the default
        return (json.dumps(doc, indent=2) + "\n").encode()


@dataclass(frozen=True)
class Package:
    """A verified package laid out in a folder."""

    root: Path
    manifest: Manifest
    manifest_bytes: bytes

    @property
    def model_path(self) -> Path:
        return self.root / self.manifest.model_file

    @property
    def batch_paths(self) -> dict[int, Path]:
        """Every fixed batch the package carries -> its model file's path, smallest first."""
        return {b: self.root / f for b, f in self.manifest.batch_files.items()}

    @property
    def labels(self) -> list[str]:
        return list(self.manifest.labels)

    @property
    def ref(self) -> str:
        return f"{self.manifest.name}@{self.manifest.version}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def parse_manifest(data: bytes, where: str) -> Manifest:
    if len(data) > MAX_MANIFEST_BYTES:
        raise PackageError(f"{where}: manifest is {len(data)} bytes, over {MAX_MANIFEST_BYTES}", code=Code.TOO_LARGE)
    try:
        raw = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except RecursionError as exc:
        raise PackageError(f"{where}: manifest is nested too deeply", code=Code.MANIFEST_INVALID) from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise PackageError(f"{where}: manifest is not valid JSON: {exc}", code=Code.MANIFEST_INVALID) from exc
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            ".".join(str(p) for p in e["loc"]) + ": " + ("unknown key" if e["type"] == "extra_forbidden" else e["msg"])
            for e in exc.errors()
        )
        raise PackageError(f"{where}: manifest invalid: {problems}", code=Code.MANIFEST_INVALID) from exc


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def open_package(path: str | os.PathLike[str], scratch: Path | None = None) -> Package:
    """Open a package folder, or unpack a package tar into `scratch`, and check every file.

    A tar is read manifest first: every member must be `manifest.json`, `manifest.sig` or a file the
    manifest declares, at the size it declares, or the tar is refused before any byte of that member
    is written (`undeclared_file`, `size_mismatch`); each file is then copied capped at its declared
    size, so a tar can never put more into `scratch` than its manifest says."""
    path = Path(path)
    if path.is_dir():
        return verify_folder(path)
    if not path.exists():
        raise PackageError(f"{path}: no such model package", code=Code.NOT_FOUND)
    if not tarfile.is_tarfile(path):
        raise PackageError(f"{path}: neither a package folder nor a tar file", code=Code.NOT_A_PACKAGE)
    dest = Path(tempfile.mkdtemp(prefix="pkg-", dir=scratch))
    try:
        with tarfile.open(path) as tar:
            members = tar_members(tar, str(path))
            head = members.get(MANIFEST)
            if head is None:
                raise PackageError(f"{path}: no {MANIFEST} in this tar", code=Code.NOT_A_PACKAGE)
            if head.size > MAX_MANIFEST_BYTES:
                raise PackageError(
                    f"{path}: {MANIFEST} is {head.size} bytes, over {MAX_MANIFEST_BYTES}", code=Code.TOO_LARGE
                )
            manifest = parse_manifest(_read_member(tar, head, str(path)), f"{path}:{MANIFEST}")
            check_members(members, manifest, str(path))
            for name, member in members.items():
                cap = manifest.files[name].size if name in manifest.files else member.size
                copy_capped(_open_member(tar, member, str(path)), dest / name, cap, f"{path}:{name}")
        return verify_folder(dest)
    except (tarfile.TarError, OSError) as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise PackageError(f"{path}: cannot unpack: {exc}", code=Code.NOT_A_PACKAGE) from exc
    except PackageError:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def tar_members(tar: tarfile.TarFile, where: str) -> dict[str, tarfile.TarInfo]:
    """A package tar's members by plain name (a leading ``./`` dropped); only regular files at the top
    level, each name once."""
    out: dict[str, tarfile.TarInfo] = {}
    for member in tar.getmembers():
        if member.isdir() and member.name in (".", "./"):
            continue  # the folder itself, in a tar of a package folder's contents
        name = member.name[2:] if member.name.startswith("./") else member.name
        if not member.isfile() or not name or "/" in name or name.startswith("."):
            raise PackageError(f"{where}: unexpected entry {member.name!r}", code=Code.NOT_A_PACKAGE)
        if name in out:
            raise PackageError(f"{where}: {name!r} is in the tar twice", code=Code.NOT_A_PACKAGE)
        out[name] = member
    return out


def check_members(members: dict[str, tarfile.TarInfo], manifest: Manifest, where: str) -> None:
    """Every member declared by the manifest (or the manifest and its signature), at its declared size."""
    for name, member in members.items():
        if name == MANIFEST:
            continue
        if name == SIG_FILE:
            if member.size > MAX_SIG_BYTES:
                raise PackageError(
                    f"{where}: {SIG_FILE} is {member.size} bytes, over {MAX_SIG_BYTES}", code=Code.TOO_LARGE
                )
            continue
        entry = manifest.files.get(name)
        if entry is None:
            raise PackageError(
                f"{where}: {name!r} ({member.size} bytes) is not declared in the manifest; refused before "
                "anything of it is written",
                code=Code.UNDECLARED_FILE,
            )
        if member.size != entry.size:
            raise PackageError(
                f"{where}: {name} is {member.size} bytes in the tar, the manifest says {entry.size}",
                code=Code.TOO_LONG if member.size > entry.size else Code.SIZE_MISMATCH,
            )


def _open_member(tar: tarfile.TarFile, member: tarfile.TarInfo, where: str) -> IO[bytes]:
    f = tar.extractfile(member)
    if f is None:
        raise PackageError(f"{where}: {member.name} cannot be read", code=Code.NOT_A_PACKAGE)
    return f


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo, where: str) -> bytes:
    with _open_member(tar, member, where) as f:
        return f.read(member.size)


def copy_capped(src: IO[bytes], dst: Path, size: int, where: str) -> None:
    """Copy `src` to `dst`, refusing (`too_long`) before writing a byte past `size`; fsynced."""
    written = 0
    with src, open(dst, "wb") as out:
        while chunk := src.read(_CHUNK):
            if written + len(chunk) > size:
                raise PackageError(f"{where}: longer than the {size} bytes the manifest declares", code=Code.TOO_LONG)
            written += len(chunk)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    if written != size:
        raise PackageError(f"{where}: {written} bytes, the manifest says {size}", code=Code.SIZE_MISMATCH)


def verify_folder(root: Path) -> Package:
    mpath = root / MANIFEST
    try:
        data = mpath.read_bytes()
    except OSError as exc:
        raise PackageError(f"{root}: no readable {MANIFEST}: {exc.strerror}", code=Code.NOT_A_PACKAGE) from exc
    manifest = parse_manifest(data, str(mpath))
    for name, entry in manifest.files.items():
        f = root / name
        try:
            size = f.stat().st_size
        except OSError as exc:
            raise PackageError(f"{f}: listed in the manifest but missing", code=Code.FILE_MISSING) from exc
        if size != entry.size:
            raise PackageError(
                f"{f}: {size} bytes, the manifest says {entry.size} (truncated or replaced?)", code=Code.SIZE_MISMATCH
            )
        if sha256_file(f) != entry.sha256:
            raise PackageError(
                f"{f}: sha256 does not match the manifest (corrupt or tampered)", code=Code.HASH_MISMATCH
            )
    return Package(root=root, manifest=_with_labels_file(root, manifest), manifest_bytes=data)


def _with_labels_file(root: Path, manifest: Manifest) -> Manifest:
    """The manifest with `labels` taken from its (verified) labels file when it lists none itself
    (labels.py: a labels file that contradicts the manifest's own list is refused)."""
    if manifest.labels_file is None:
        return manifest
    labels = package_labels(root / manifest.labels_file, manifest.labels)
    return manifest if labels == manifest.labels else manifest.model_copy(update={"labels": labels})


def write_package(root: Path, manifest_fields: dict[str, Any], files: dict[str, Path]) -> Package:
    """Lay out a package folder: copy `files` in, hash them, write the manifest last."""
    root.mkdir(parents=True, exist_ok=True)
    entries: dict[str, dict[str, Any]] = {}
    for name, src in files.items():
        dst = root / name
        if src.resolve() != dst.resolve():
            shutil.copyfile(src, dst)
        entries[name] = {"size": dst.stat().st_size, "sha256": sha256_file(dst)}
    manifest = Manifest.model_validate({**manifest_fields, "files": entries})
    tmp = root / (MANIFEST + ".tmp")
    tmp.write_bytes(manifest.to_json())
    os.replace(tmp, root / MANIFEST)
    return verify_folder(root)


def publish_package(
    out: Path, manifest_fields: dict[str, Any], files: dict[str, Path], finish: Callable[[Path], None] | None = None
) -> Package:
    """Write a package into `out` (absent or empty) all at once: laid out beside it, handed to `finish`
    (more files, checks), then renamed in, so neither a failed check nor an interrupted run leaves a
    half-written package under the name; a failure removes the laid-out folder too."""
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        write_package(staging, manifest_fields, files)
        if finish is not None:
            finish(staging)
        if out.exists():
            out.rmdir()
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return verify_folder(out)


def pack_tar(pkg: Package, out: Path, sig_bytes: bytes | None = None) -> Path:
    """A package tar: manifest.json (and manifest.sig) first, then the files in manifest order; the
    same bytes every time for the same package (no owners, fixed mode and mtime)."""
    created = pkg.manifest.created.replace("Z", "+00:00")
    try:
        mtime = int(dt.datetime.fromisoformat(created).timestamp())
    except ValueError:
        mtime = 0
    tmp = out.with_name(f".{out.name}.tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        entries: list[tuple[str, bytes | Path]] = [(MANIFEST, pkg.manifest_bytes)]
        if sig_bytes is not None:
            entries.append(("manifest.sig", sig_bytes))
        entries += [(name, pkg.root / name) for name in pkg.manifest.files]
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime, info.uname, info.gname = 0o644, mtime, "", ""
            if isinstance(data, bytes):
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.size = data.stat().st_size
                with data.open("rb") as f:
                    tar.addfile(info, f)
    os.replace(tmp, out)
    return out
