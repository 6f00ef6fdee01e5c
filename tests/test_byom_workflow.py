"""docs/byom.md, step by step, with its own commands: the published BlazeFace export -> `edged model
init` -> `edged quantize` (FP16) -> `edged model golden` -> `edged keys generate` -> `edged model
pack --key` -> `edged model verify` -> `edged push` to a running daemon, which serves the new version.
`edged build-engine` needs TensorRT and a GPU (tests/test_tensorrt.py covers it where there is one)."""

from __future__ import annotations

import shutil
from pathlib import Path

from edged.models.demo import DemoAssets
from edged.models.package import verify_folder

from .conftest import Broker, edged_cli, wait_until, write_config
from .test_ota import device_doc, push, wait_results


def run(*args: str, timeout: float = 600) -> str:
    r = edged_cli(*args, timeout=timeout)
    assert r.returncode == 0, f"edged {' '.join(args)}\n{r.stdout}\n{r.stderr}"
    return r.stdout + r.stderr


def test_export_init_quantize_sign_push(
    demo: DemoAssets, tmp_path: Path, broker: Broker, subscribe, start_daemon
) -> None:
    raw = demo.root / "raw"
    (tmp_path / "labels.txt").write_text("face\n")
    frame = str(raw / "grace_hopper.jpg")
    v1, v2 = tmp_path / "faces-v1", tmp_path / "faces-v2"
    out = run(
        "model", "init", str(raw / "face_detection_back_256x256_barracuda.onnx"), "--out", str(v1),
        "--name", "blazeface-back", "--batch", "4", "--labels", str(tmp_path / "labels.txt"), "--image", frame,
    )  # fmt: skip
    assert "decoder ssd_anchors" in out and "golden:" in out
    out = run(
        "quantize", str(v1), "--precision", "fp16", "--eval", str(demo.video), "--eval-frames", "30",
        "--score-threshold", "0.7", "--threads", "1", "--out", str(v2),
    )  # fmt: skip
    assert verify_folder(v2).manifest.version == 2 and verify_folder(v2).manifest.golden is None
    run("model", "golden", str(v2), "--image", frame)  # the fp16 model's own golden pair
    run("keys", "generate", "--dir", str(tmp_path / "keys"), "--name", "site")
    (tmp_path / "trusted").mkdir()
    shutil.copy(tmp_path / "keys" / "site.pub", tmp_path / "trusted" / "site.pub")
    for folder in (v1, v2):
        run("model", "pack", str(folder), "--out", f"{folder}.tar", "--key", str(tmp_path / "keys" / "site.key"))

    cfg = write_config(tmp_path / "cam-01.yaml", device_doc(broker, demo, tmp_path, "cam-01"))
    assert "every check passed; would install" in run("model", "verify", f"{v2}.tar", "-c", str(cfg))
    run("model", "install", f"{v1}.tar", "-c", str(cfg))
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_results(sub, 1)
    r = push(broker, Path(f"{v2}.tar"), "--device", "cam-01")
    assert r.returncode == 0, r.stdout + r.stderr + d.output()
    assert "1 of 1 device(s) succeeded" in r.stderr
    wait_results(sub, 2)
    assert "golden" in d.output()  # the golden pair was run before v2 was activated

    def faces() -> list[dict[str, object]]:
        return [x for r in sub.results() if r["model"]["version"] == 2 for x in r["detections"]]

    wait_until(lambda: bool(faces()), 60, "a face found by version 2")  # the demo video has faces now and then
    assert {f["label"] for f in faces()} == {"face"}
