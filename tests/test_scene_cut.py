"""The scene-cut detector (daemon/capture/motion.py) on real pictures: the demo video's people moving are no cut,
a change of scene between two people is one, and neither noise nor an exposure step counts."""

from __future__ import annotations

import itertools
from pathlib import Path

import cv2
import numpy as np

from edged.daemon.capture.motion import CUT_AREA, CutDetector, cut_share, thumbnail
from edged.models.demo import DemoAssets

from .test_track_breaks import two_faces, write_video


def test_the_cut_detector_sees_a_cut_and_not_people_moving(demo: DemoAssets, tmp_path: Path) -> None:
    cap = cv2.VideoCapture(str(demo.video))
    thumbs = []
    while (got := cap.read())[0]:
        thumbs.append(thumbnail(got[1]))
    shares = [cut_share(a, b) for a, b in itertools.pairwise(thumbs)]
    # the demo video pastes photographs in and out at once (frames 60, 135, 150, 240, 255): those may count;
    # every other step, people and shapes moving, is far from it
    abrupt = {60, 135, 150, 240, 255}
    moving = [s for i, s in enumerate(shares, 1) if i not in abrupt]
    assert max(moving) < CUT_AREA / 2, max(moving)
    frames, _ = two_faces(demo.root / "raw")
    cap = cv2.VideoCapture(str(write_video(frames, tmp_path / "cut.mp4")))
    det = CutDetector()
    cuts = []
    while (got := cap.read())[0]:
        cuts.append(det.cut(got[1]))
    assert [i for i, c in enumerate(cuts) if c] == [20], "one cut, where the people change"
    dark = np.full((540, 960, 3), 12, np.uint8)
    noise = np.random.default_rng(0)
    a, b = (cv2.add(dark, noise.integers(0, 6, dark.shape, dtype=np.uint8)) for _ in range(2))
    assert cut_share(thumbnail(a), thumbnail(b)) < 0.05, "a dark, flat picture's noise is no cut"
    photo = cv2.imread(str(demo.root / "raw" / "astronaut.png"))
    assert photo is not None
    brighter = cv2.convertScaleAbs(photo, alpha=1.2, beta=10)
    assert cut_share(thumbnail(photo), thumbnail(brighter)) < 0.05, "an exposure step is no cut"
    assert cut_share(thumbnail(photo), thumbnail(photo[:, ::-1])) >= CUT_AREA, "another picture is a cut"
