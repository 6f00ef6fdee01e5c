"""scripts/gpu-check.sh picks pip's TensorRT from the driver's CUDA version, and scripts/device-check.sh's dry
run (no GPU here) skips every step with its reason and exits 0.

The driver is a stand-in `nvidia-smi` on PATH printing the real header layout (there is no GPU here); the
scripts are the real ones, run by bash."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMI_HEADER = (
    "+-----------------------------------------------------------------------------------------+\n"
    "| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: {cuda}     |\n"
    "|-----------------------------------------+------------------------+----------------------+\n"
)


def _with_driver(tmp_path: Path, cuda: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{SMI_HEADER.format(cuda=cuda)}EOF\n")
    smi.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.parametrize(
    ("cuda", "wheel"),
    [("12.4", "tensorrt-cu12>=10.12,<12"), ("13.0", "tensorrt-cu13>=10.12,<12"), ("13.2", "tensorrt-cu13>=10.12,<12")],
)
def test_the_tensorrt_wheel_follows_the_drivers_cuda_version(tmp_path: Path, cuda: str, wheel: str) -> None:
    """The bare `tensorrt` is the CUDA 13 build (driver R580+): on a CUDA 12 driver it fails every engine test."""
    r = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu-check.sh"), "--print-trt-wheel"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_with_driver(tmp_path, cuda),
    )
    assert r.returncode == 0 and r.stdout.strip() == wheel, r.stdout + r.stderr


def test_a_driver_older_than_cuda_12_gets_no_wheel(tmp_path: Path) -> None:
    r = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu-check.sh"), "--print-trt-wheel"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_with_driver(tmp_path, "11.8"),
    )
    assert r.returncode == 1 and r.stdout == "", r.stdout + r.stderr


def test_the_device_check_dry_run_skips_every_step_with_its_reason(tmp_path: Path) -> None:
    out = tmp_path / "device-check.txt"
    r = subprocess.run(
        ["bash", str(ROOT / "scripts/device-check.sh"), "--dry-run", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    steps = [line for line in r.stdout.splitlines() if line.startswith("[")]
    assert [s[:5] for s in steps] == [f"[{i}/7]" for i in range(1, 8)], r.stdout
    assert all(s.endswith("SKIP (--dry-run given)") for s in steps), r.stdout
    for what in ("open/infer/close x50", "baseline", "INT8", "strongly typed", "refused on 11.x", "eta"):
        assert what in r.stdout, what
    assert out.read_text() == r.stdout
