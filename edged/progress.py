"""Progress of a long step with an estimate of the time left, for the offline tools (`edged quantize`,
`edged build-engine`, `edged bundle build`).

A step knows how many units it has (calibration batches, evaluation batches, search candidates, bytes to
pack); `Eta.advance` after each unit. A line goes out when the step crosses a tenth of its total, or when
`every_s` passed since the last line, so a step of any length says at most about ten lines plus one per
`every_s`, never one per frame. The estimate is the measured rate so far: elapsed / done × left.

    calibrating: 12/64 batches, 41.0 s so far, about 2:58 left

Only the standard library: both the quantize tools and the deploy tools use it (DESIGN.md §1).
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Eta", "format_duration"]


def format_duration(seconds: float) -> str:
    """4.2 s under a minute, else 12:05 (m:ss) or 1:02:05 (h:mm:ss)."""
    if seconds < 59.95:
        return f"{max(0.0, seconds):.1f} s"
    s = round(seconds)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Eta:
    """One step's progress lines. `say` gets each line; `total` units (> 0); `unit` names them ("batches",
    "MiB"); `upper_bound`: the step may end early (a search that stops at the first candidate that passes), so
    the estimate is said as "at most"."""

    def __init__(
        self,
        say: Callable[[str], None],
        what: str,
        total: int,
        unit: str = "",
        *,
        every_s: float = 30.0,
        upper_bound: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if total < 1:
            raise ValueError(f"total must be at least 1, not {total}")
        if every_s <= 0:
            raise ValueError(f"every_s must be positive, not {every_s}")
        self._say = say
        self.what = what
        self.total = total
        self.unit = f" {unit}" if unit else ""
        self._every_s = every_s
        self._upper = upper_bound
        self._clock = clock
        self._start = clock()
        self._last_line = self._start
        self.done = 0

    def advance(self, units: int = 1) -> None:
        """`units` more are done; says a line when one is due (and always at the end)."""
        if units < 0:
            raise ValueError(f"units must not be negative, not {units}")
        before = self.done
        self.done = min(self.total, self.done + units)
        now = self._clock()
        tenth = self.done * 10 // self.total != before * 10 // self.total
        if tenth or self.done == self.total or now - self._last_line >= self._every_s:
            self._last_line = now
            self._say(self.line(now))

    def extend(self, units: int) -> None:
        """The step turned out `units` longer than its total said (an estimated total)."""
        if units < 0:
            raise ValueError(f"units must not be negative, not {units}")
        self.total += units

    def finish(self) -> None:
        """The step ended (with an estimated total: however many units were really done); says the last line."""
        if self.done < self.total:
            self.total = max(1, self.done)
            self.done = self.total
            self._say(self.line())

    def left_s(self, now: float | None = None) -> float | None:
        """Seconds left at the rate measured so far; None before the first unit."""
        if self.done == 0:
            return None
        elapsed = (self._clock() if now is None else now) - self._start
        return elapsed / self.done * (self.total - self.done)

    def line(self, now: float | None = None) -> str:
        now = self._clock() if now is None else now
        head = f"{self.what}: {self.done}/{self.total}{self.unit}, {format_duration(now - self._start)} so far"
        if self.done == self.total:
            return head + ", done"
        left = self.left_s(now)
        if left is None:
            return head
        return f"{head}, {'at most' if self._upper else 'about'} {format_duration(left)} left"
