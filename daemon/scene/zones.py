"""Zones and masks: named polygons on a camera's frame, and which of them a detection's box is in.

A polygon is given in source pixels or normalised (0-1 of the frame's width and height); it is turned into
pixels once per frame size. A box is in a polygon when its anchor point is (the box's center, or the middle
of its bottom edge: where a person stands): an even-odd ray cast, a point on an edge counting as in.

Each frame tests every kept detection against every polygon's edges (0.3-1 µs an edge in CPython), so
the config bounds them (`polygon_problem`, at load): at most `MAX_POINTS` corners a polygon and
`MAX_CAMERA_POINTS` for a camera's zones and masks together, and no degenerate shape (fewer than three
distinct corners, all on one line, edges that cross), which would test nothing or something else than
what was drawn.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import ZoneConfig

logger = logging.getLogger(__name__)

Box = tuple[float, float, float, float]  # x1, y1, x2, y2 in source pixels
Point = tuple[float, float]
# 64 corners: a hand-drawn area needs a dozen; 100 detections against a 64-corner zone cost 2-6 ms a frame
# measured (a 10,000-corner one cut the frame rate 3.6x); a camera's zones and masks share 256
MAX_POINTS = 64
MAX_CAMERA_POINTS = 256


def anchor_point(box: Box, anchor: str) -> tuple[float, float]:
    """The point of `box` that zones test: ``center`` or ``bottom`` (middle of the bottom edge)."""
    x1, y1, x2, y2 = box
    return (x1 + x2) / 2.0, (y2 if anchor == "bottom" else (y1 + y2) / 2.0)


def inside(x: float, y: float, poly: Sequence[tuple[float, float]]) -> bool:
    """Even-odd rule; a point on an edge is inside."""
    n = len(poly)
    hit = False
    for i in range(n):
        ax, ay = poly[i]
        bx, by = poly[(i + 1) % n]
        # on the edge a-b?
        cross = (bx - ax) * (y - ay) - (by - ay) * (x - ax)
        if abs(cross) < 1e-9 and min(ax, bx) <= x <= max(ax, bx) and min(ay, by) <= y <= max(ay, by):
            return True
        if (ay > y) != (by > y) and x < ax + (y - ay) * (bx - ax) / (by - ay):
            hit = not hit
    return hit


def polygon_problem(points: Sequence[Point]) -> str | None:
    """Why `points` is no usable polygon, or None: over MAX_POINTS corners, fewer than 3 distinct ones, all
    on one line, no area, or two edges that cross or touch (corners not given in order around the area).
    A corner repeated at once (a ring closed by repeating the first point) is allowed; n <= 64, so the
    O(n²) edge pairs cost well under a millisecond at load."""
    if len(points) > MAX_POINTS:
        return f"{len(points)} points; a zone or mask has at most {MAX_POINTS} (each frame tests every edge)"
    ring = [i for i, p in enumerate(points) if p != points[i - 1]]  # indices, repeats dropped (cyclically)
    if len(ring) < 3:
        n = len(set(points))
        return f"{n} distinct point{'' if n == 1 else 's'}; a polygon needs at least 3"
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    eps = 1e-12 * max(max(xs) - min(xs), max(ys) - min(ys)) ** 2
    ox, oy = points[ring[0]]
    dx, dy = points[ring[1]][0] - ox, points[ring[1]][1] - oy
    if all(abs(dx * (points[i][1] - oy) - dy * (points[i][0] - ox)) <= eps for i in ring):
        return "all points lie on one line: a polygon needs an area"
    edges = _edges(ring)
    for k, (a, b) in enumerate(edges):
        for m in range(k + 1, len(edges)):
            c, d = edges[m]
            if _meet(points[a], points[b], points[c], points[d], adjacent=b == c or d == a, eps=eps):
                return (
                    f"edges points[{a}]-points[{b}] and points[{c}]-points[{d}] cross or overlap: give the corners "
                    "in order around the area"
                )
    area2 = sum(points[a][0] * points[b][1] - points[b][0] * points[a][1] for a, b in edges)
    return "the polygon has no area" if abs(area2) <= eps else None


def _edges(ring: list[int]) -> list[tuple[int, int]]:
    return [(ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))]


def _orient(p: Point, q: Point, r: Point) -> float:
    return (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])


def _on(p: Point, q: Point, r: Point) -> bool:
    """r, collinear with p-q, lies on the segment p-q."""
    return min(p[0], q[0]) <= r[0] <= max(p[0], q[0]) and min(p[1], q[1]) <= r[1] <= max(p[1], q[1])


def _meet(a: Point, b: Point, c: Point, d: Point, adjacent: bool, eps: float) -> bool:
    """Segments a-b and c-d share a point; for adjacent edges (sharing a corner) only an overlap counts."""
    o1, o2, o3, o4 = _orient(a, b, c), _orient(a, b, d), _orient(c, d, a), _orient(c, d, b)
    if adjacent:  # they share a corner: they meet elsewhere only when collinear and folding back
        if abs(o1) > eps or abs(o2) > eps:
            return False
        shared, x, y = (b, a, d) if b == c else (a, b, c)
        return (x[0] - shared[0]) * (y[0] - shared[0]) + (x[1] - shared[1]) * (y[1] - shared[1]) > 0
    if ((o1 > eps and o2 < -eps) or (o1 < -eps and o2 > eps)) and (
        (o3 > eps and o4 < -eps) or (o3 < -eps and o4 > eps)
    ):
        return True
    return (
        (abs(o1) <= eps and _on(a, b, c))
        or (abs(o2) <= eps and _on(a, b, d))
        or (abs(o3) <= eps and _on(c, d, a))
        or (abs(o4) <= eps and _on(c, d, b))
    )


@dataclass
class Polygons:
    """A camera's zones (or masks), in pixels for the frame size last seen; each with its bounding box, so
    that a point outside it costs no edge tests. `what` names them in the warning for corners that lie
    beyond the frame (pixel coordinates: the frame's size is known only once frames come)."""

    configs: Sequence[ZoneConfig]
    what: str = "zone"
    _size: tuple[int, int] = (0, 0)
    _pixels: list[tuple[str, list[Point], Box]] = field(default_factory=list)

    def _for(self, width: int, height: int) -> list[tuple[str, list[Point], Box]]:
        if (width, height) != self._size:
            self._size = (width, height)
            self._pixels = []
            for z in self.configs:
                poly = [(x * width, y * height) if z.normalized else (x, y) for x, y in z.points]
                xs, ys = [p[0] for p in poly], [p[1] for p in poly]
                self._pixels.append((z.name, poly, (min(xs), min(ys), max(xs), max(ys))))
                if max(xs) > width or max(ys) > height:
                    logger.warning(
                        "%s %s: points beyond the %dx%d frame (up to %g, %g): that part never matches",
                        self.what,
                        z.name,
                        width,
                        height,
                        max(xs),
                        max(ys),
                    )
        return self._pixels

    def containing(self, point: tuple[float, float], width: int, height: int) -> list[str]:
        """Names of the polygons `point` is in, in configuration order."""
        if not self.configs:
            return []
        x, y = point
        return [
            name
            for name, poly, (x1, y1, x2, y2) in self._for(width, height)
            if x1 <= x <= x2 and y1 <= y <= y2 and inside(x, y, poly)
        ]

    def __bool__(self) -> bool:
        return bool(self.configs)
