"""The golden pair's input, stored small and exact (issue 27): a float32 golden input made an INT8 package
3.5x its model on every OTA push. `edged model golden` now writes golden_input.npz (models/golden.py), which
decodes bit for bit to the batch the writer ran; old packages' golden_input.npy keep loading; a changed
model is still refused; the files stay listed with size and sha256 under the manifest's signature."""

from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from edged.cli.model_init import write_golden
from edged.daemon.backends import OnnxRuntimeBackend
from edged.daemon.capture.preprocess import Preprocessor
from edged.daemon.lifecycle.admission import golden_check
from edged.errors import Code, PackageError, SwapError
from edged.models.demo import DemoAssets
from edged.models.golden import INPUT_FILE, decode_input, encode_input, load_input, save_input
from edged.models.package import Package, sha256_file, verify_folder, write_package
from edged.models.signing import SigningKey, TrustStore


def frames(video: Path, at: tuple[int, ...]) -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(video))
    out: list[np.ndarray] = []
    i = 0
    try:
        while len(out) < len(at):
            ok, frame = cap.read()
            assert ok, f"{video}: only {i} frames"
            if i in at:
                out.append(frame)
            i += 1
    finally:
        cap.release()
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.fixture(scope="module")
def demo_frames(demo: DemoAssets) -> list[np.ndarray]:
    return frames(demo.video, (5, 60, 150))


@pytest.fixture
def golden_pkg(demo: DemoAssets, demo_frames: list[np.ndarray], tmp_path: Path) -> Package:
    """A copy of the demo's small BlazeFace with a golden pair written by `edged model golden`'s writer."""
    folder = tmp_path / "front"
    shutil.copytree(demo.packages["blazeface-front"].root, folder)
    assert cv2.imwrite(str(tmp_path / "frame.png"), demo_frames[1])
    write_golden(folder, tmp_path / "frame.png", 1e-3, 1e-2)
    return verify_folder(folder)


@pytest.mark.parametrize("name", ["blazeface-back", "blazeface-front", "picodet-layout"])
def test_real_frames_decode_bit_for_bit(
    demo: DemoAssets, demo_frames: list[np.ndarray], name: str, tmp_path: Path
) -> None:
    """Each demo package's preprocessing ((x - 127.5) / 127.5 NHWC, ImageNet mean/std NCHW) on real frames of
    the demo video: the writer's batch (one frame tiled) and a batch of distinct frames come back exactly."""
    spec = demo.packages[name].manifest.input
    pre = Preprocessor(spec)
    rows = []
    for frame in demo_frames:
        row = pre.new_row()
        pre.run(frame, row)
        rows.append(row)
    axis = 1 if spec.layout == "NCHW" else 3
    tiled = np.ascontiguousarray(np.broadcast_to(rows[0], spec.shape), dtype=spec.dtype)
    distinct = np.ascontiguousarray(np.stack([rows[i % len(rows)] for i in range(spec.batch)]), dtype=spec.dtype)
    for label, x in (("tiled", tiled), ("distinct", distinct)):
        path = tmp_path / f"{label}.npz"
        save_input(path, x, axis)
        got = load_input(path)
        assert got.dtype == x.dtype and np.array_equal(got, x) and same_bits(got, x), label
        assert got.flags.c_contiguous and got.flags.writeable
        with np.load(path) as f:
            assert "codes" in f.files, f"{label}: a preprocessed frame fits the palette"
    # the size the issue is about: the stored input of one real frame, tiled as the writer tiles it
    assert (tmp_path / "tiled.npz").stat().st_size < tiled.nbytes / 3
    print(f"\n{name}: {tiled.nbytes / 1e6:.2f} MB float32 -> {(tmp_path / 'tiled.npz').stat().st_size / 1e6:.3f} MB")


def test_the_writer_stores_a_small_exact_input(golden_pkg: Package, demo_frames: list[np.ndarray]) -> None:
    """Through `write_golden` (what `edged model golden` and `edged model init --image` run): the manifest names
    the new file, listed with size and sha256, and it is under a third of the float32 batch. Fails on the
    old writer (golden_input.npy, the full float32 batch)."""
    m = golden_pkg.manifest
    assert m.golden is not None
    path = golden_pkg.root / m.golden.input
    entry = m.files[m.golden.input]
    assert entry.size == path.stat().st_size and entry.sha256 == sha256_file(path)
    float_bytes = int(np.prod(m.input.shape)) * np.dtype(m.input.dtype).itemsize
    assert entry.size < float_bytes / 3, f"{m.golden.input}: {entry.size} bytes for a {float_bytes}-byte batch"
    assert m.golden.input == INPUT_FILE
    pre = Preprocessor(m.input)
    row = pre.new_row()
    pre.run(demo_frames[1], row)
    expected = np.ascontiguousarray(np.broadcast_to(row, m.input.shape), dtype=m.input.dtype)
    assert same_bits(load_input(path), expected)


def test_a_changed_model_is_still_refused(golden_pkg: Package, tmp_path: Path) -> None:
    with OnnxRuntimeBackend(golden_pkg.model_path, threads=1) as backend:
        assert golden_check(golden_pkg, backend) == "golden check passed (4 outputs)"
    model = onnx.load(str(golden_pkg.model_path))
    biggest = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    biggest.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(biggest) * 1.5, biggest.name))
    onnx.save(model, str(tmp_path / "drifted.onnx"))
    drifted = OnnxRuntimeBackend(tmp_path / "drifted.onnx", threads=1)
    with drifted, pytest.raises(SwapError, match="golden check failed") as err:
        golden_check(golden_pkg, drifted)
    assert err.value.code == Code.GOLDEN_MISMATCH


def test_an_old_package_with_golden_input_npy_still_loads(golden_pkg: Package, tmp_path: Path) -> None:
    """A package written before the encoding: golden_input.npy (np.save of the float batch), as is."""
    m = golden_pkg.manifest
    assert m.golden is not None
    x = load_input(golden_pkg.root / m.golden.input)
    old = tmp_path / "old"
    old.mkdir()
    np.save(old / "golden_input.npy", x, allow_pickle=False)
    fields = m.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
    fields["golden"] = {**fields["golden"], "input": "golden_input.npy"}
    files = {n: golden_pkg.root / n for n in m.files if n != INPUT_FILE}
    files["golden_input.npy"] = old / "golden_input.npy"
    pkg = write_package(old, fields, files)
    assert same_bits(load_input(old / "golden_input.npy"), x)
    with OnnxRuntimeBackend(pkg.model_path, threads=1) as backend:
        assert golden_check(pkg, backend) == "golden check passed (4 outputs)"
    # and `edged model golden` on it again: the new file replaces the old one, in the folder and the manifest
    frame = tmp_path / "frame.png"
    assert cv2.imwrite(str(frame), np.full((90, 160, 3), 80, np.uint8))
    write_golden(old, frame, 1e-3, 1e-2)
    again = verify_folder(old)
    assert again.manifest.golden is not None and again.manifest.golden.input == INPUT_FILE
    assert "golden_input.npy" not in again.manifest.files and not (old / "golden_input.npy").exists()


def test_the_golden_input_is_covered_by_the_signature(golden_pkg: Package, signer: SigningKey, tmp_path: Path) -> None:
    sig = signer.sign(golden_pkg.manifest_bytes)
    assert TrustStore.load(tmp_path / "trusted").verify(golden_pkg.manifest_bytes, sig, "test") == signer.key_id
    path = golden_pkg.root / INPUT_FILE
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(PackageError, match="sha256 does not match") as err:
        verify_folder(golden_pkg.root)
    assert err.value.code == Code.HASH_MISMATCH


def test_what_is_not_a_golden_input_is_refused_by_name(golden_pkg: Package, tmp_path: Path) -> None:
    """An .npz without the header, or a damaged one: golden_invalid, naming the file, never a crash."""
    m = golden_pkg.manifest
    assert m.golden is not None
    with open(tmp_path / "other.npz", "wb") as f:
        np.savez(f, x=np.zeros(3, np.float32))
    (tmp_path / "torn.npz").write_bytes((golden_pkg.root / INPUT_FILE).read_bytes()[:200])
    for bad, why in (("other.npz", "without edged's golden-input header"), ("torn.npz", "torn.npz")):
        fields = m.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
        fields["golden"] = {**fields["golden"], "input": bad}
        files = {n: golden_pkg.root / n for n in m.files if n != INPUT_FILE} | {bad: tmp_path / bad}
        pkg = write_package(tmp_path / bad.removesuffix(".npz"), fields, files)
        backend = OnnxRuntimeBackend(pkg.model_path, threads=1)
        with backend, pytest.raises(SwapError, match=f"golden files unreadable: .*{why}") as err:
            golden_check(pkg, backend)
        assert err.value.code == Code.GOLDEN_INVALID


def test_encoding_edge_cases_stay_exact() -> None:
    """Signed zeros and NaNs by their bits; more than 256 values in a channel (the plain array); one byte per
    value (uint8 inputs: the plain array); float16; a table per channel or one for all."""
    rng = np.random.default_rng(7)
    pal = (rng.integers(0, 256, (2, 3, 16, 16)).astype(np.float32) - 128) / 57.0  # 256 values at most
    odd = pal.copy()
    odd[0, 0, 0, :3] = (-0.0, 0.0, np.nan)
    odd[:, 0][odd[:, 0] == 1 / 57.0] = -1 / 57.0  # channel 0 keeps 256 values with -0.0 and NaN among them
    odd[:, 0][odd[:, 0] == 2 / 57.0] = -1 / 57.0
    cases = {
        "signed zero and NaN": (odd, 1),
        "one table": (pal, None),
        "float16": (pal.astype(np.float16), 1),
        "over 256 values": (rng.random((2, 3, 32, 32), np.float32), 1),
        "uint8": (rng.integers(0, 256, (2, 16, 16, 3), np.uint8), 3),
    }
    for label, (x, axis) in cases.items():
        entries = encode_input(x, axis)
        assert ("codes" in entries) == (label not in ("over 256 values", "uint8")), label
        assert same_bits(decode_input(entries), x), label
    with pytest.raises(ValueError, match="channel_axis 0 is not a row axis"):
        encode_input(pal, 0)
    entries = encode_input(pal, 1) | {"edged_golden_input": np.array(2)}
    with pytest.raises(ValueError, match="golden input format 2, this edged reads 1"):
        decode_input(entries)
