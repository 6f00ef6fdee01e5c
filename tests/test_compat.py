"""Engine compatibility: device facts read from fixture trees of real boards, checked against manifests."""

from __future__ import annotations

from pathlib import Path

import pytest

from edged.errors import IncompatibleEngine
from edged.models.compat import DeviceFacts, check_engine, l4t_release, mismatches
from tests import sysfs_fixtures as fx

ORIN_JP6 = {"tensorrt": "10.3.0", "compute_capability": "8.7", "l4t": "36.4.0", "platform": "aarch64"}


@pytest.mark.parametrize(
    ("board", "release", "cc"),
    [
        (fx.nano_jp4, "32.7.4", "5.3"),
        (fx.xavier_nx_jp5, "35.4.1", "7.2"),
        (fx.agx_orin_jp5, "35.4.1", "8.7"),
        (fx.orin_nano_jp6, "36.3.0", "8.7"),
        (fx.generic_linux, None, None),
    ],
)
def test_facts_from_board_trees(tmp_path: Path, board, release: str | None, cc: str | None) -> None:
    root = board(tmp_path)
    facts = DeviceFacts.read(root, tensorrt="10.3.0.30")
    assert (facts.l4t, facts.compute_capability, facts.tensorrt) == (release, cc, "10.3.0.30")


def test_release_file_of_jetpack_6_1(tmp_path: Path) -> None:
    fx.l4t(tmp_path, fx.L4T_R36_4_0, ["nvidia,tegra234"])
    assert l4t_release(tmp_path) == "36.4.0"
    (tmp_path / "etc/nv_tegra_release").write_text("not a release line\n")
    assert l4t_release(tmp_path) is None


def test_matching_device_passes() -> None:
    facts = DeviceFacts("aarch64", "10.3.0.30", "8.7", "36.4.0")
    assert mismatches(ORIN_JP6, facts) == []
    check_engine(ORIN_JP6, facts, "pkg", has_onnx=False)  # does not raise


def test_each_mismatch_is_named() -> None:
    # An engine built on JetPack 6.1 (TensorRT 10.3) taken to a Xavier NX on JetPack 5 (TensorRT 8.5).
    facts = DeviceFacts("aarch64", "8.5.2.2", "7.2", "35.4.1")
    problems = mismatches(ORIN_JP6, facts)
    assert len(problems) == 3
    assert "TensorRT 10.3.0, this device has 8.5.2.2" in problems[0]
    assert "compute capability 8.7, this GPU is 7.2" in problems[1]
    assert "L4T R36.4.0, this device runs R35.4.1" in problems[2]
    with pytest.raises(IncompatibleEngine, match=r"rebuild it on this device from the package's model\.onnx"):
        check_engine(ORIN_JP6, facts, "faces@7", has_onnx=True)
    with pytest.raises(IncompatibleEngine, match="on a device of this type") as err:
        check_engine(ORIN_JP6, facts, "faces@7", has_onnx=False)
    assert err.value.code == "incompatible"


def test_platform_and_missing_tensorrt() -> None:
    problems = mismatches(ORIN_JP6, DeviceFacts("x86_64", None, None, None))
    assert problems == [
        "built for aarch64, this device is x86_64",
        "needs TensorRT 10.3.0, none is installed here",
        "built for compute capability 8.7, this device's is unknown (no GPU found?)",
    ]


def test_version_compatible_engines_take_newer_runtimes_of_the_same_major() -> None:
    req = {**ORIN_JP6, "version_compatible": True, "l4t": None}
    assert mismatches(req, DeviceFacts("aarch64", "10.7.0", "8.7")) == []
    assert mismatches(req, DeviceFacts("aarch64", "10.1.0", "8.7"))  # older runtime
    assert mismatches(req, DeviceFacts("aarch64", "11.0.0", "8.7"))  # other major
    exact = {**ORIN_JP6, "l4t": None}
    # a manifest that records three parts ("10.3.0") is compared on those three: its build is not known
    assert mismatches(exact, DeviceFacts("aarch64", "10.3.0.30", "8.7")) == []
    assert mismatches(exact, DeviceFacts("aarch64", "10.4.0", "8.7"))


def test_a_plan_is_tied_to_its_tensorrt_build_as_tensorrt_checks_it() -> None:
    """What edged records (tensorrt.__version__, four parts) is compared on all four: a plan built by 10.3.0.30
    does not deserialize on 10.3.0.26, and is refused before TensorRT is asked."""
    built = {**ORIN_JP6, "tensorrt": "10.3.0.30", "l4t": None}
    assert mismatches(built, DeviceFacts("aarch64", "10.3.0.30", "8.7")) == []
    assert mismatches(built, DeviceFacts("aarch64", "10.3.0.26", "8.7")) == [
        "built with TensorRT 10.3.0.30, this device has 10.3.0.26"
    ]
    compatible = {**built, "version_compatible": True}  # the build counts in "at least that new" too
    assert mismatches(compatible, DeviceFacts("aarch64", "10.3.0.31", "8.7")) == []
    assert mismatches(compatible, DeviceFacts("aarch64", "10.3.0.26", "8.7"))


def test_hardware_compatibility_level() -> None:
    req = {"compute_capability": "8.6", "hardware_compatibility": "ampere+"}
    assert mismatches(req, DeviceFacts("x86_64", None, "8.9")) == []
    assert mismatches(req, DeviceFacts("x86_64", None, "7.5")) == [
        "built for Ampere or newer, this GPU is compute capability 7.5"
    ]
