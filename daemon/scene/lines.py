"""Lines: named segments on a camera's frame, and a track's anchor point crossing one, with a direction.

A line is two points, a→b, in source pixels or normalised (0-1 of the frame's width and height), and
`in_direction`, the movement on the picture (``left``, ``right``, ``up``, ``down``) that counts as going
*in*; crossing the other way is *out*. Which side of the line is "in" follows from it: the side the
named movement leads to. The anchor point is the one zones use (the box's center, or its bottom middle).

A crossing is counted when a track's anchor goes from one side of the line to the other *through the
segment* (the step between two frames meets the segment between a and b, not the infinite line beyond
its ends), and settles there: a hysteresis band on each side of the line, `hysteresis` times the box's
height wide, must be left on the far side before the crossing counts. An anchor that jitters on the line
(a box that wobbles by a few pixels from frame to frame) counts once, or not at all if it goes back:

    side A ──(band)── line ──(band)── side B
    settled on A, path meets the segment, settles on B: one crossing (A→B); back into the band and out on
    A again: nothing

A track first seen inside the band has no side until it leaves it. The state lives with the track
(`Track.extra`), so a track that ends forgets it; a new track for the same object (an ID switch) starts
again, which can count a crossing twice or miss one (tests/test_lines.py measures it on the demo video).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .zones import anchor_point

if TYPE_CHECKING:
    from ..config.cameras import LineConfig
    from .tracker import Track

logger = logging.getLogger(__name__)

Point = tuple[float, float]
DIRECTIONS: dict[str, Point] = {"right": (1.0, 0.0), "left": (-1.0, 0.0), "down": (0.0, 1.0), "up": (0.0, -1.0)}
CROSSING_DIRECTIONS = ("in", "out")
MAX_LINES = 32  # a camera's; each frame tests every moving track against every line (a few µs each)
MIN_ANGLE_DEG = 10.0  # `in_direction` must cross the line at least this steeply (in the coordinates given)
MIN_LENGTH_PX = 2.0  # a shorter line (in pixels; normalised: MIN_LENGTH_NORM) is refused as degenerate
MIN_LENGTH_NORM = 0.002


def points_problem(points: Sequence[Point], normalized: bool) -> str | None:
    """Why `points` is no usable line, or None: not two points, not finite, outside the frame (normalised:
    0-1) or negative, or a zero or too short a length."""
    if len(points) != 2:
        return f"{len(points)} points; a line has two, [a, b]"
    (ax, ay), (bx, by) = points
    if not all(math.isfinite(v) for v in (ax, ay, bx, by)):
        return "points must be finite numbers"
    if normalized and not all(0.0 <= v <= 1.0 for v in (ax, ay, bx, by)):
        return "normalized points must lie in 0-1 (the frame)"
    if min(ax, ay, bx, by) < 0:
        return "points must not be negative"
    length = math.hypot(bx - ax, by - ay)
    least = MIN_LENGTH_NORM if normalized else MIN_LENGTH_PX
    if length == 0.0:
        return "the two points are the same: a line needs a length"
    if length < least:
        return f"the line is {length:g} long; at least {least:g} ({'of the frame' if normalized else 'pixels'})"
    return None


def direction_problem(points: Sequence[Point], in_direction: str) -> str | None:
    """Why `in_direction` does not say which way `points` (a usable line) is crossed in, or None: it runs
    along the line (within MIN_ANGLE_DEG) instead of across it."""
    (ax, ay), (bx, by) = points
    dx, dy = bx - ax, by - ay
    ux, uy = DIRECTIONS[in_direction]
    sine = abs(dx * uy - dy * ux) / math.hypot(dx, dy)  # |sin| of the angle between the line and the movement
    if sine < math.sin(math.radians(MIN_ANGLE_DEG)):
        a, b = ("up", "down") if in_direction in ("left", "right") else ("left", "right")
        return (
            f"{in_direction} runs along the line (a→b), not across it: an object crossing this line moves {a} or "
            f"{b}; give in_direction: {a} or {b}"
        )
    return None


@dataclass(frozen=True)
class Crossing:
    line: str
    direction: str  # "in" | "out"


@dataclass
class Lines:
    """A camera's lines, in pixels for the frame size last seen (`what` names them in the warning for
    pixel points beyond the frame)."""

    configs: Sequence[LineConfig]
    what: str = "line"
    _size: tuple[int, int] = (0, 0)
    # name, a, b, the in side's sign, hysteresis
    _pixels: list[tuple[str, Point, Point, float, float]] = field(default_factory=list)

    def _for(self, width: int, height: int) -> list[tuple[str, Point, Point, float, float]]:
        if (width, height) != self._size:
            self._size = (width, height)
            self._pixels = []
            for c in self.configs:
                (ax, ay), (bx, by) = ((x * width, y * height) if c.normalized else (x, y) for x, y in c.points)
                ux, uy = DIRECTIONS[c.in_direction]
                # the side of a→b the named movement leads to: the sign of cross(b - a, p - a) there
                sign = 1.0 if (bx - ax) * uy - (by - ay) * ux > 0 else -1.0
                self._pixels.append((c.name, (ax, ay), (bx, by), sign, c.hysteresis))
                if max(ax, bx) > width or max(ay, by) > height:
                    logger.warning(
                        "%s %s: points beyond the %dx%d frame (%g, %g - %g, %g): that part is never crossed",
                        self.what, c.name, width, height, ax, ay, bx, by,
                    )  # fmt: skip
        return self._pixels

    def step(self, state: dict[str, Any], point: Point, box_height: float, width: int, height: int) -> list[Crossing]:
        """The crossings of a track whose anchor is now at `point`; `state` (the track's, kept between
        calls) remembers per line the side it settled on and whether its path since met the segment."""
        if not self.configs:
            return []
        prev: Point | None = state.get("at")
        state["at"] = point
        sides: dict[str, list[Any]] = state.setdefault("sides", {})  # line -> [settled side (0: none), met]
        out: list[Crossing] = []
        for name, a, b, sign, band in self._for(width, height):
            s = sides.setdefault(name, [0.0, False])
            now = _cross(a, b, point)
            if prev is not None and _meets(a, b, prev, point):
                s[1] = True
            length = math.hypot(b[0] - a[0], b[1] - a[1])
            if abs(now) / length < band * box_height:
                continue  # in the band: no side yet
            side = 1.0 if now > 0 else -1.0
            if s[0] != 0.0 and side != s[0] and s[1]:
                out.append(Crossing(name, "in" if side == sign else "out"))
            s[0], s[1] = side, False
        return out

    def moved(
        self, tracks: Sequence[Track], now: int, anchor: str, width: int, height: int
    ) -> list[tuple[Track, Crossing]]:
        """The crossings of the `tracks` detected on frame `now` (`Track.last_frame`), each with its track, for
        the tracks that have appeared (``"appeared"`` in their extra); a tentative track's wait until it has."""
        out: list[tuple[Track, Crossing]] = []
        for t in tracks:
            if t.last_frame != now:
                continue
            x = t.extra
            crossed: list[Crossing] = x.setdefault("crossed", [])
            crossed += self.step(
                x.setdefault("lines", {}), anchor_point(t.box, anchor), t.box[3] - t.box[1], width, height
            )
            if "appeared" in x:
                out += [(t, c) for c in crossed]
                crossed.clear()
        return out

    def counts(self, crossings: Mapping[tuple[str, str, str], int]) -> dict[str, dict[str, dict[str, int]]]:
        """`crossings` ((line, direction, label) -> n) as {line: {in|out: {label: n}}}, every line and direction."""
        out: dict[str, dict[str, dict[str, int]]] = {c.name: {d: {} for d in CROSSING_DIRECTIONS} for c in self.configs}
        for (line, direction, label), n in sorted(crossings.items()):
            if line in out:
                out[line][direction][label] = n
        return out

    def __bool__(self) -> bool:
        return bool(self.configs)


def _cross(a: Point, b: Point, p: Point) -> float:
    """cross(b - a, p - a): positive on one side of a→b, negative on the other, |.| = distance × length."""
    return (b[0] - a[0]) * (p[1] - a[1]) - (b[1] - a[1]) * (p[0] - a[0])


def _meets(a: Point, b: Point, p: Point, q: Point) -> bool:
    """The step p→q meets the segment a-b (touching counts)."""
    d1, d2 = _cross(a, b, p), _cross(a, b, q)
    if (d1 > 0 and d2 > 0) or (d1 < 0 and d2 < 0):
        return False
    d3, d4 = _cross(p, q, a), _cross(p, q, b)
    if (d3 > 0 and d4 > 0) or (d3 < 0 and d4 < 0):
        return False
    if d1 == d2 == 0.0:  # collinear: the projections overlap
        return max(min(a[0], b[0]), min(p[0], q[0])) <= min(max(a[0], b[0]), max(p[0], q[0])) and max(
            min(a[1], b[1]), min(p[1], q[1])
        ) <= min(max(a[1], b[1]), max(p[1], q[1]))
    return True
