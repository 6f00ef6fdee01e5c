"""Zones and masks: named polygons on a camera's frame, and which of them a detection's box is in.

A polygon is given in source pixels or normalised (0-1 of the frame's width and height); it is turned into
pixels once per frame size. A box is in a polygon when its anchor point is (the box's center, or the middle
of its bottom edge: where a person stands): an even-odd ray cast, a point on an edge counting as in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .config import ZoneConfig

Box = tuple[float, float, float, float]  # x1, y1, x2, y2 in source pixels


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


@dataclass
class Polygons:
    """A camera's zones (or masks), in pixels for the frame size last seen."""

    configs: Sequence[ZoneConfig]
    _size: tuple[int, int] = (0, 0)
    _pixels: list[tuple[str, list[tuple[float, float]]]] = field(default_factory=list)

    def _for(self, width: int, height: int) -> list[tuple[str, list[tuple[float, float]]]]:
        if (width, height) != self._size:
            self._size = (width, height)
            self._pixels = [
                (z.name, [(x * width, y * height) if z.normalized else (x, y) for x, y in z.points])
                for z in self.configs
            ]
        return self._pixels

    def containing(self, point: tuple[float, float], width: int, height: int) -> list[str]:
        """Names of the polygons `point` is in, in configuration order."""
        if not self.configs:
            return []
        return [name for name, poly in self._for(width, height) if inside(point[0], point[1], poly)]

    def __bool__(self) -> bool:
        return bool(self.configs)
