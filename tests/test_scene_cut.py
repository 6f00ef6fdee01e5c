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


def _old_cut_share(a: np.ndarray, b: np.ndarray) -> float:
    """cut_share as it was before the per-frame CPU cut (issue 34): NumPy's mean and std, both thumbnails
    standardised on every call. Kept here to hold the new one to the same values."""

    def standard(t: np.ndarray) -> np.ndarray:
        return (t - float(t.mean())) / max(float(t.std()), 16.0)

    if a.shape != b.shape:
        return 1.0
    return float(np.count_nonzero(np.abs(standard(a) - standard(b)) > 0.5)) / a.size


def test_the_cut_detector_decides_as_before_the_cpu_cut(demo: DemoAssets, tmp_path: Path) -> None:
    """The detector that standardises each thumbnail once (cv2.meanStdDev, the previous frame's kept) gives the
    old detector's shares and decisions, value for value, on the demo video, the two-people cut and the
    noise, exposure and other-picture pairs; a size change is still a cut."""
    frames, _ = two_faces(demo.root / "raw")
    videos = [demo.video, write_video(frames, tmp_path / "cut.mp4")]
    for video in videos:
        cap = cv2.VideoCapture(str(video))
        thumbs, decisions = [], []
        det = CutDetector()
        while (got := cap.read())[0]:
            thumbs.append(thumbnail(got[1]))
            decisions.append(det.cut(got[1]))
        assert len(thumbs) > 30, video
        old = [_old_cut_share(a, b) for a, b in itertools.pairwise(thumbs)]
        assert [cut_share(a, b) for a, b in itertools.pairwise(thumbs)] == old, video
        assert decisions == [False] + [s >= CUT_AREA for s in old], video
        assert any(decisions) or video == demo.video, "the two-people video has its cut"
    dark = np.full((540, 960, 3), 12, np.uint8)
    noise = np.random.default_rng(0)
    photo = cv2.imread(str(demo.root / "raw" / "astronaut.png"))
    assert photo is not None
    pairs = [
        tuple(cv2.add(dark, noise.integers(0, 6, dark.shape, dtype=np.uint8)) for _ in range(2)),
        (photo, cv2.convertScaleAbs(photo, alpha=1.2, beta=10)),
        (photo, photo[:, ::-1]),
        (photo, photo[: photo.shape[0] // 2]),  # another size: a cut
    ]
    for a, b in pairs:
        ta, tb = thumbnail(a), thumbnail(b)
        assert cut_share(ta, tb) == _old_cut_share(ta, tb)
        det = CutDetector()
        assert not det.cut(a)
        assert det.cut(b) == (_old_cut_share(ta, tb) >= CUT_AREA)
    assert CutDetector().cut(photo) is False
