"""A package checked against its own model, by `pack`, `verify`, `check-config` and the daemon.

Every refusal names the exact mismatch. The packages are the real demo packages with one thing
changed in their manifest or files (rewritten through write_package, so sizes and hashes agree and
only the change under test is wrong).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edged.errors import PackageError
from edged.models.demo import DemoAssets
from edged.models.package import Package, pack_tar, sha256_file, verify_folder, write_package
from edged.models.signing import SigningKey

from .conftest import base_config, edged_cli, write_config
from .test_model_init import lossless_video


def variant(
    src: Package, dest: Path, edit: Callable[[dict[str, Any]], None] | None = None, labels_txt: str | None = None
) -> Path:
    """A copy of a package folder with its manifest edited (and labels.txt replaced), hashes renewed."""
    shutil.copytree(src.root, dest, ignore=shutil.ignore_patterns("manifest.sig"))
    fields = json.loads((dest / "manifest.json").read_bytes())
    del fields["files"]
    if edit:
        edit(fields)
    if labels_txt is not None:
        (dest / "labels.txt").write_text(labels_txt)
    write_package(dest, fields, {name: dest / name for name in src.manifest.files})
    return dest


def refused_by_pack(folder: Path, message: str) -> None:
    r = edged_cli("model", "pack", str(folder), "--out", str(folder.with_suffix(".tar")))
    assert r.returncode == 1, r.stdout + r.stderr
    assert message in r.stderr, r.stderr
    assert not folder.with_suffix(".tar").exists()


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        *parents, key = path.split(".")
        for p in parents:
            doc = doc[p]
        doc[key] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            _set("input.shape", [4, 3, 640, 608]),
            "input 'image' is [4, 3, 800, 608] in the model, the manifest says [4, 3, 640, 608]",
        ),
        (
            _set("input.shape", [2, 3, 800, 608]),
            "input 'image' is [4, 3, 800, 608] in the model, the manifest says [2, 3, 800, 608] (batch 4 in the "
            "model, 2 in the manifest: the fixed batch must match)",
        ),
        (
            lambda d: d["input"].update(shape=[4, 800, 608, 3], layout="NHWC"),
            "the manifest says [4, 800, 608, 3] (the model looks NCHW, the manifest says NHWC)",
        ),
        (_set("input.dtype", "float16"), "input 'image' is float32 in the model, the manifest says float16"),
        (_set("input.name", "images"), "the manifest's input 'images' is not a model input (the model has ['image'])"),
        (_set("decoder.params.strides", [8, 16, 32]), "picodet: 3 strides need 6 outputs, the model has 8"),
        (_set("decoder.type", "yolov8"), "name the output in decoder.params.output (the model has"),
    ],
    ids=["size", "batch", "layout", "dtype", "name", "output-count", "decoder"],
)
def test_pack_refuses_a_manifest_that_contradicts_its_model(
    edit: Callable[[dict[str, Any]], None], message: str, demo: DemoAssets, tmp_path: Path
) -> None:
    refused_by_pack(variant(demo.packages["picodet-layout"], tmp_path / "p", edit), message)


def test_labels_file_is_read_and_counted_against_the_classes(demo: DemoAssets, tmp_path: Path) -> None:
    src = demo.packages["picodet-layout"]
    only_file = variant(src, tmp_path / "only-file", _set("labels", []))
    assert verify_folder(only_file).labels == src.labels  # labels.txt alone is enough
    r = edged_cli("model", "pack", str(only_file), "--out", str(tmp_path / "ok.tar"))
    assert r.returncode == 0, r.stderr

    three = variant(src, tmp_path / "three", _set("labels", []), labels_txt="text\ntitle\nfigure\n\n")
    assert verify_folder(three).labels == ["text", "title", "figure"]
    refused_by_pack(three, "picodet: 10 classes in 'transpose_0.tmp_0', 3 labels")

    differ = variant(src, tmp_path / "differ")  # then labels.txt replaced and its hash renewed by hand
    (differ / "labels.txt").write_text("texte\n" + "\n".join(src.labels[1:]) + "\n")
    doc = json.loads((differ / "manifest.json").read_bytes())
    doc["files"]["labels.txt"] = {
        "size": (differ / "labels.txt").stat().st_size,
        "sha256": sha256_file(differ / "labels.txt"),
    }
    (differ / "manifest.json").write_text(json.dumps(doc, indent=2))
    with pytest.raises(PackageError, match=re.escape("10 labels, the manifest lists 10; they differ at line 1")):
        verify_folder(differ)
    refused_by_pack(differ, "differ at line 1 ('texte' vs 'text')")


def test_missing_file_and_bad_sha_are_refused(demo: DemoAssets, tmp_path: Path) -> None:
    src = demo.packages["picodet-layout"]
    missing = variant(src, tmp_path / "missing")
    (missing / "labels.txt").unlink()
    refused_by_pack(missing, f"{missing / 'labels.txt'}: listed in the manifest but missing")

    tampered = variant(src, tmp_path / "tampered")
    data = bytearray((tampered / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tampered / "model.onnx").write_bytes(bytes(data))
    refused_by_pack(tampered, f"{tampered / 'model.onnx'}: sha256 does not match the manifest (corrupt or tampered)")


def test_verify_and_check_config_refuse_the_mismatch_too(
    broker, demo: DemoAssets, signer: SigningKey, tmp_path: Path
) -> None:
    src = demo.packages["picodet-layout"]
    bad = variant(src, tmp_path / "bad", _set("input.shape", [4, 3, 640, 608]))
    pkg = verify_folder(bad)
    tar = pack_tar(pkg, tmp_path / "bad.tar", signer.sign(pkg.manifest_bytes))  # signed: only the model is wrong
    doc = base_config(broker, demo, tmp_path, [{"name": "cam", "uri": "synthetic://"}])
    doc["model"] = {"package": str(bad), "keys_dir": str(tmp_path / "trusted"), "onnxruntime": {"threads": 1}}
    cfg = write_config(tmp_path / "c.yaml", doc)
    r = edged_cli("model", "verify", str(tar), "-c", str(cfg))
    assert r.returncode == 1 and "the manifest says [4, 3, 640, 608]" in r.stderr, r.stdout + r.stderr
    r = edged_cli("check-config", "-c", str(cfg))
    assert r.returncode == 1 and "the manifest says [4, 3, 640, 608]" in r.stderr, r.stdout + r.stderr

    three = variant(src, tmp_path / "three", _set("labels", []), labels_txt="text\ntitle\nfigure\n")
    doc["model"]["package"] = str(three)
    r = edged_cli("check-config", "-c", str(write_config(tmp_path / "c.yaml", doc)))
    assert r.returncode == 1 and "picodet: 10 classes in 'transpose_0.tmp_0', 3 labels" in r.stderr, r.stderr


def test_daemon_publishes_the_labels_of_labels_txt(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    pkg = variant(demo.packages["blazeface-back"], tmp_path / "faces", _set("labels", []), labels_txt="visage\n")
    assert json.loads((pkg / "manifest.json").read_bytes())["labels"] == []
    lossless_video(demo.root / "raw" / "astronaut.png", tmp_path / "a.mkv")
    sub = subscribe(broker, "edged/#")
    doc = base_config(
        broker, demo, tmp_path, [{"name": "cam", "uri": f"file://{tmp_path / 'a.mkv'}", "realtime": False}]
    )
    doc["model"] = {"package": str(pkg), "onnxruntime": {"threads": 1}}
    d = start_daemon(write_config(tmp_path / "c.yaml", doc))
    assert d.proc.wait(120) == 0, d.output()[-3000:]
    sub.wait_stopped()  # the last results were acknowledged before it, but may still be on their way here
    labels = {det["label"] for r in sub.results() for det in r["detections"]}
    assert labels == {"visage"}, labels
