"""Preprocessing into preallocated rows, and the way back to source pixels."""

from __future__ import annotations

import numpy as np
import pytest

from edged.daemon.capture.preprocess import Preprocessor
from edged.models.package import InputSpec


def spec(**kw: object) -> InputSpec:
    base: dict[str, object] = {"name": "x", "shape": [2, 64, 64, 3], "layout": "NHWC"}
    base.update(kw)
    return InputSpec.model_validate(base)


def test_letterbox_geometry_and_round_trip() -> None:
    pre = Preprocessor(spec(resize="letterbox", pad_value=0))
    frame = np.full((100, 200, 3), 200, np.uint8)  # wide: 200x100 -> 64x32, padded 16 above and below
    row = pre.new_row()
    t = pre.run(frame, row)
    assert (t.scale_x, t.scale_y, t.pad_x, t.pad_y) == (0.32, 0.32, 0.0, 16.0)
    assert np.all(row[:16] == 0) and np.all(row[48:] == 0) and np.all(row[16:48] == 200)
    back = t.to_source(np.array([[0, 16, 64, 48], [32, 32, 32, 32]], np.float32))
    assert np.allclose(back, [[0, 0, 200, 100], [100, 50, 100, 50]])


def test_stretch_and_clipping() -> None:
    pre = Preprocessor(spec(resize="stretch"))
    t = pre.run(np.zeros((32, 128, 3), np.uint8), pre.new_row())
    assert (t.scale_x, t.scale_y, t.pad_x, t.pad_y) == (0.5, 2.0, 0, 0)
    assert np.allclose(t.to_source(np.array([[-10, -10, 100, 100]], np.float32)), [[0, 0, 128, 32]])


def test_colour_order_scale_mean_std_nhwc() -> None:
    s = spec(color="RGB", scale=1.0, mean=[127.5] * 3, std=[127.5] * 3, resize="stretch")
    pre = Preprocessor(s)
    frame = np.zeros((64, 64, 3), np.uint8)
    frame[..., 0] = 255  # blue in BGR
    row = pre.new_row()
    pre.run(frame, row)
    assert row.dtype == np.float32 and row.shape == (64, 64, 3)
    assert np.allclose(row[..., 2], 1.0) and np.allclose(row[..., 0], -1.0)  # blue went last (RGB)


def test_nchw_imagenet_normalisation() -> None:
    s = spec(shape=[1, 3, 8, 8], layout="NCHW", color="BGR", mean=[10, 20, 30], std=[2, 4, 5], resize="stretch")
    pre = Preprocessor(s)
    frame = np.dstack([np.full((8, 8), v, np.uint8) for v in (20, 40, 80)])
    row = pre.new_row()
    pre.run(frame, row)
    assert row.shape == (3, 8, 8)
    assert np.allclose(row[0], 5.0) and np.allclose(row[1], 5.0) and np.allclose(row[2], 10.0)


def test_grey_frames_are_accepted_and_sizes_may_change() -> None:
    pre = Preprocessor(spec())
    row = pre.new_row()
    t1 = pre.run(np.zeros((50, 50), np.uint8), row)
    t2 = pre.run(np.zeros((30, 90, 3), np.uint8), row)
    assert (t1.src_width, t2.src_width) == (50, 90)


def test_input_spec_rejects_mismatched_channels() -> None:
    with pytest.raises(ValueError, match="has 4 channels"):
        spec(shape=[1, 8, 8, 4])


@pytest.mark.parametrize("size", [(100, 200), (200, 100), (64, 64), (30, 50)])
@pytest.mark.parametrize("resize", ["letterbox", "stretch"])
@pytest.mark.parametrize("align", ["center", "topleft"])
def test_pixels_rows_are_the_letterboxed_frame_in_one_pass(size: tuple[int, int], resize: str, align: str) -> None:
    """A uint8 BGR NHWC input (a folded model's) is resized straight into the row with the border painted:
    bit for bit what the canvas path gives, and the border is repainted when the source size changes."""
    rng = np.random.default_rng(0)
    pixels = spec(dtype="uint8", color="BGR", resize=resize, letterbox=align, pad_value=114)
    canvas = spec(dtype="uint8", color="RGB", resize=resize, letterbox=align, pad_value=114)  # the general path
    fast, ref = Preprocessor(pixels), Preprocessor(canvas)
    assert fast.pixels and not ref.pixels
    row, want = fast.new_row(), ref.new_row()
    row[:] = 7  # whatever a slot held before
    for h, w in (size, (size[1] + 13, size[0] + 7)):  # a second source size: another border
        frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        t_fast, t_ref = fast.run(frame, row), ref.run(frame, want)
        assert t_fast == t_ref
        assert np.array_equal(row, want[..., ::-1])


def test_a_cameras_own_rows_keep_their_border_and_match_a_row_painted_every_time() -> None:
    """A camera's slots (`own_rows`) have their border painted once per geometry, not at every frame. Through
    a run of sources that change size and shape (and one scaled in the pipeline), each of the three rows, used in
    turn as a camera uses them, equals a row painted from scratch at every frame, value for value; so a row whose
    border was left from another geometry, or never painted, fails here."""
    rng = np.random.default_rng(1)
    pixels = spec(dtype="uint8", color="BGR", resize="letterbox", pad_value=114)
    own, ref = Preprocessor(pixels), Preprocessor(pixels)
    rows = own.own_rows(3)
    for r in rows:
        r[:] = rng.integers(0, 256, r.shape, dtype=np.uint8)  # whatever the memory held
    sizes = [(540, 960)] * 4 + [(960, 540)] * 3 + [(640, 640)] * 2 + [(540, 960)] * 3 + [(100, 300)] * 3
    for k, (h, w) in enumerate(sizes):
        frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        row, want = rows[k % 3], rng.integers(0, 256, ref.row_shape, dtype=np.uint8)
        assert own.run(frame, row) == ref.run(frame, want)
        assert np.array_equal(row, want), f"frame {k} ({w}x{h})"
    # a frame the pipeline scaled (its source 1280x720): the same inner rectangle as a 960x540 source's
    inner = own.inner_size(1280, 720)
    for k in range(3):
        frame = rng.integers(0, 256, (inner[1], inner[0], 3), dtype=np.uint8)
        want = rng.integers(0, 256, ref.row_shape, dtype=np.uint8)
        own.run(frame, rows[k], (1280, 720))
        ref.run(frame, want, (1280, 720))
        assert np.array_equal(rows[k], want)
    # a row that is not one of them is painted every time
    other = own.new_row()
    other[:] = 3
    own.run(frame, other, (1280, 720))
    ref.run(frame, want, (1280, 720))
    assert np.array_equal(other, want)
