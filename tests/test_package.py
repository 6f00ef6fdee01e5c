"""Model packages: every file checked against the manifest before a backend sees it."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest

from edged.daemon.backends import OnnxRuntimeBackend, open_backend
from edged.errors import BackendError, EngineLoadError, PackageError
from edged.models.demo import DemoAssets
from edged.models.package import open_package

from .conftest import base_config, edged_cli, write_config


@pytest.fixture
def pkg_copy(demo: DemoAssets, tmp_path: Path) -> Path:
    dest = tmp_path / "pkg"
    shutil.copytree(demo.packages["blazeface-back"].root, dest)
    return dest


def test_demo_package_opens(pkg_copy: Path) -> None:
    pkg = open_package(pkg_copy)
    m = pkg.manifest
    assert (m.name, m.version, m.kind, m.decoder.type) == ("blazeface-back", 1, "onnx", "ssd_anchors")
    assert m.input.shape == [4, 256, 256, 3] and m.labels == ["face"]


def test_tar_package_opens(pkg_copy: Path, tmp_path: Path) -> None:
    tar = tmp_path / "faces.tar"
    with tarfile.open(tar, "w") as t:
        for f in sorted(pkg_copy.iterdir()):
            t.add(f, arcname=f.name)
    pkg = open_package(tar, scratch=tmp_path)
    assert pkg.manifest.name == "blazeface-back" and pkg.model_path.is_file()


def test_flipped_byte_in_model_is_refused(pkg_copy: Path) -> None:
    model = pkg_copy / "model.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    with pytest.raises(PackageError, match="sha256 does not match") as exc:
        open_package(pkg_copy)
    assert exc.value.code == "hash_mismatch"


def test_truncated_model_is_refused(pkg_copy: Path) -> None:
    model = pkg_copy / "model.onnx"
    model.write_bytes(model.read_bytes()[:1000])
    with pytest.raises(PackageError, match="truncated or replaced") as exc:
        open_package(pkg_copy)
    assert exc.value.code == "size_mismatch"


def test_manifest_problems(pkg_copy: Path) -> None:
    mpath = pkg_copy / "manifest.json"
    text = mpath.read_text()
    mpath.write_text(text.replace('"version": 1', '"version": 1, "version": 2'))
    with pytest.raises(PackageError, match="duplicate key 'version'"):
        open_package(pkg_copy)
    doc = json.loads(text)
    doc["input"]["shape"] = [-1, 256, 256, 3]
    mpath.write_text(json.dumps(doc))
    with pytest.raises(PackageError, match=r"input\.shape: Value error, every dimension must be a fixed"):
        open_package(pkg_copy)
    doc = json.loads(text)
    doc["surprise"] = 1
    mpath.write_text(json.dumps(doc))
    with pytest.raises(PackageError, match="surprise: unknown key"):
        open_package(pkg_copy)
    mpath.unlink()
    with pytest.raises(PackageError, match=r"no readable manifest\.json"):
        open_package(pkg_copy)


def test_missing_package(tmp_path: Path) -> None:
    with pytest.raises(PackageError, match="no such model package"):
        open_package(tmp_path / "nope")
    (tmp_path / "junk.bin").write_bytes(b"edged" * 200)
    with pytest.raises(PackageError, match="neither a package folder nor a tar"):
        open_package(tmp_path / "junk.bin")
    (tmp_path / "empty.tar").write_bytes(b"\x00" * 1024)
    with pytest.raises(PackageError, match=r"empty\.tar: no manifest\.json in this tar"):
        open_package(tmp_path / "empty.tar", scratch=tmp_path)


def test_backend_translates_onnx_runtime_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a protobuf")
    with pytest.raises(EngineLoadError, match="ONNX Runtime cannot load it"):
        OnnxRuntimeBackend(bad)
    with pytest.raises(EngineLoadError, match="model file not found"):
        OnnxRuntimeBackend(tmp_path / "missing.onnx")


def test_backend_choice_is_explained(pkg_copy: Path) -> None:
    with pytest.raises(BackendError, match="takes a TensorRT engine package"):
        open_backend("onnx", pkg_copy / "model.onnx", "tensorrt")
    with pytest.raises(BackendError, match=r"tensorrt backend unavailable"):
        open_backend("engine", pkg_copy / "model.onnx", "auto")
    with open_backend("onnx", pkg_copy / "model.onnx", "auto", threads=1) as be:
        assert be.name == "onnxruntime" and be.inputs[0].shape == (4, 256, 256, 3)
        assert be.memory_bytes > (pkg_copy / "model.onnx").stat().st_size


@pytest.mark.parametrize("damage", ["flip", "missing"])
def test_daemon_with_bad_model_exits_1_with_clear_error(
    damage: str, pkg_copy: Path, demo: DemoAssets, tmp_path: Path
) -> None:
    if damage == "flip":
        model = pkg_copy / "model.onnx"
        data = bytearray(model.read_bytes())
        data[100] ^= 0x01
        model.write_bytes(bytes(data))
    else:
        shutil.rmtree(pkg_copy)

    class NoBroker:
        host, port = "127.0.0.1", 1

    doc = base_config(NoBroker(), demo, tmp_path, [{"name": "a", "uri": "synthetic://"}])
    doc["model"]["package"] = str(pkg_copy)
    run = edged_cli("run", "-c", str(write_config(tmp_path / "c.yaml", doc)), "--duration", "5")
    assert run.returncode == 1
    expected = "sha256 does not match the manifest" if damage == "flip" else "no such model package"
    assert expected in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize(
    "sig",
    [
        b"[" * 2000 + b"]" * 2000,  # under the 4 KiB cap, deeper than json's recursion limit
        b'{"a":' * 650 + b"1" + b"}" * 650,
        b"[]",
        b'"x"',
        b'{"key_id": [], "alg": 1, "sig": 2}',
    ],
)
def test_a_garbage_or_deeply_nested_signature_is_a_bad_signature(sig: bytes, tmp_path: Path) -> None:
    from edged.models.signing import TrustStore

    with pytest.raises(PackageError) as exc:
        TrustStore({}).verify(b"{}", sig, "offer")
    assert exc.value.code == "bad_signature", str(exc.value)
