"""Zones and masks are checked at load (issue 26 item 4: "zero-area and collinear zones pass check-config",
"a 10,000-vertex zone cut the frame rate 3.6x"): each degenerate or oversized polygon is refused with its
key path, by `load_config` and by `edged check-config`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from edged.daemon.config import load_config
from edged.errors import ConfigError

from .conftest import edged_cli, write_config

SQUARE = [[0, 0], [100, 0], [100, 100], [0, 100]]


def config(tmp: Path, **detection: Any) -> Path:
    doc = {
        "device_id": "cam-box",
        "model": {"package": "pkg"},
        "cameras": [
            {"name": "a", "uri": "synthetic://"},
            {
                "name": "b",
                "uri": "synthetic://",
                "detection": {"zones": [{"name": "ok", "points": SQUARE}], **detection},
            },
        ],
    }
    return write_config(tmp / "c.yaml", doc)


def circle(n: int) -> list[list[float]]:
    return [[500 + 400 * math.cos(2 * math.pi * i / n), 500 + 400 * math.sin(2 * math.pi * i / n)] for i in range(n)]


BAD = [
    ("zones", [[0, 0], [50, 50], [50, 50]], r"2 distinct points; a polygon needs at least 3"),
    ("zones", [[7, 7], [7, 7], [7, 7]], r"1 distinct point; a polygon needs at least 3"),
    ("zones", [[0, 0], [10, 10], [20, 20], [30, 30]], r"all points lie on one line"),  # collinear: zero area
    ("zones", [[0.1, 0.1], [0.2, 0.2], [0.3, 0.3]], r"all points lie on one line"),  # normalised too
    (
        "zones",
        [[0, 0], [100, 100], [100, 0], [0, 100]],
        r"edges points\[0\]-points\[1\] and points\[2\]-points\[3\] cross",
    ),
    (
        "zones",
        [[0, 0], [200, 0], [100, 0], [100, 100]],
        r"edges points\[0\]-points\[1\] and points\[1\]-points\[2\] cross or overlap",
    ),
    (
        "zones",
        [[0, 0], [40, 0], [20, 20], [40, 40], [0, 40], [20, 20]],
        r"edges points\[1\]-points\[2\] and points\[4\]-points\[5\] cross",
    ),  # touches
    ("zones", circle(10_000), r"10000 points; a zone or mask has at most 64"),
    ("zones", circle(65), r"65 points; a zone or mask has at most 64"),
    ("masks", [[0, 0], [10, 10], [20, 20]], r"all points lie on one line"),
]


@pytest.mark.parametrize(("key", "points", "message"), BAD)
def test_a_degenerate_or_oversized_polygon_is_refused_with_its_key_path(
    tmp_path: Path, key: str, points: list[list[float]], message: str
) -> None:
    """The bad polygon is the second zone (or the first mask) of the second camera."""
    normalized = all(0 <= v <= 1 for p in points for v in p)
    shapes = [{"name": "bad", "points": points, "normalized": normalized}]
    index = 1 if key == "zones" else 0
    extra = {"zones": [{"name": "ok", "points": SQUARE}, *shapes]} if key == "zones" else {"masks": shapes}
    path = config(tmp_path, **extra)
    with pytest.raises(ConfigError, match=rf"c\.yaml: cameras\[1\]\.detection\.{key}\[{index}\]\.points: {message}"):
        load_config(path, environ={})


def test_a_cameras_zones_and_masks_share_a_vertex_cap(tmp_path: Path) -> None:
    zones = [{"name": f"z{i}", "points": circle(60)} for i in range(4)]  # 240 corners, with the mask's 24: 264
    path = config(tmp_path, zones=zones, masks=[{"name": "m", "points": circle(24)}])
    with pytest.raises(
        ConfigError, match=r"cameras\[1\]\.detection: .*264 points together; a camera's have at most 256"
    ):
        load_config(path, environ={})
    ok = config(tmp_path, zones=zones[:3], masks=[{"name": "m", "points": circle(64)}])  # 244: within the cap
    own = load_config(ok, environ={}).cameras[1].detection
    assert own is not None and [z.name for z in own.zones] == ["z0", "z1", "z2"]


def test_good_shapes_still_load(tmp_path: Path) -> None:
    """Concave, clockwise or not, a corner repeated (a ring closed by repeating its first point), a
    corner on a straight edge, normalised, the cap itself."""
    shapes = [
        [[0, 0], [40, 0], [40, 40], [20, 10], [0, 40]],
        [[0, 0], [0, 40], [40, 40], [40, 0], [0, 0]],
        [[0, 0], [20, 0], [40, 0], [40, 40]],
        circle(64),
    ]
    zones = [{"name": f"z{i}", "points": p} for i, p in enumerate(shapes)]
    zones.append({"name": "n", "points": [[0.55, 0.0], [1.0, 0.0], [1.0, 1.0], [0.5, 1.0]], "normalized": True})
    own = load_config(config(tmp_path, zones=zones), environ={}).cameras[1].detection
    assert own is not None and [z.name for z in own.zones] == ["z0", "z1", "z2", "z3", "n"]


def test_check_config_names_the_bad_zone(tmp_path: Path) -> None:
    path = config(
        tmp_path, zones=[{"name": "ok", "points": SQUARE}, {"name": "line", "points": [[0, 0], [5, 5], [9, 9]]}]
    )
    run = edged_cli("check-config", "-c", str(path), "--no-model")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "c.yaml: cameras[1].detection.zones[1].points: all points lie on one line" in run.stderr, run.stderr
