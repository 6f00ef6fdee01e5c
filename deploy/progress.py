"""What ``edged push`` prints: a line per device (a bar, bytes, state, a shadow report's figures), redrawn in place
on a terminal or printed on changes in a log, and the report at the end with each device's outcome and, after a
``--shadow`` push, its verdict and the figures it was judged on."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TextIO

from edged.errors import Code

if TYPE_CHECKING:
    from .push import Device, Pusher, Wait

SHADOW_LOG_FRAMES = 50  # not on a terminal: a device's line again each time this many more frames were evaluated


class Progress:
    """One line per device: a bar, bytes, state (and the shadow report's figures, each camera's with
    `verbose`). Redrawn in place on a terminal, else printed on changes."""

    def __init__(self, out: TextIO, devices: list[Device], verbose: bool = False) -> None:
        self.out = out
        self.devices = devices
        self.verbose = verbose
        self.tty = out.isatty()
        self._drawn = 0
        self._last: dict[str, tuple[str, int, str, int]] = {}
        self._next_draw = 0.0

    def line(self, d: Device) -> str:
        frac = min(1.0, d.bytes / d.total) if d.total else 1.0
        bar = "#" * int(frac * 24) + "-" * (24 - int(frac * 24))
        text = f"{d.id:<20} [{bar}] {frac * 100:5.1f}%  {d.bytes / 2**20:6.1f}/{d.total / 2**20:.1f} MiB  {d.state}"
        text += f" via transfer {d.via}" if d.via else ""
        if d.shadow is not None and d.shadow.state:  # its reasons are the error's message: said once
            return text + f"  {d.shadow.line(reasons=False)}" + (f" ({d.error})" if d.shadow.failed and d.error else "")
        return text + (f" ({d.error})" if d.error and d.state not in ("committed", "probation") else "")

    def lines(self, d: Device) -> list[str]:
        cameras = d.shadow.camera_lines() if self.verbose and d.shadow is not None else []
        return [self.line(d), *cameras]

    def draw(self, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now < self._next_draw:
            return
        self._next_draw = now + (0.2 if self.tty else 0.0)
        if self.tty:
            if self._drawn:
                self.out.write(f"\x1b[{self._drawn}F")
            drawn = 0
            for d in self.devices:
                for text in self.lines(d):
                    self.out.write("\x1b[2K" + text + "\n")
                    drawn += 1
            if drawn < self._drawn:  # fewer lines than last time: clear what is left below
                self.out.write("\x1b[J")
            self._drawn = drawn
        else:  # a log: a line when a device's state changes, another quarter of it arrived, or the shadow moved
            for d in self.devices:
                key = (d.state, int(4 * d.bytes / d.total) if d.total else 4, *shadow_key(d))
                if self._last.get(d.id) != key:
                    self._last[d.id] = key
                    self.out.write("\n".join(self.lines(d)) + "\n")
        self.out.flush()


def shadow_key(d: Device) -> tuple[str, int]:
    """A log line's worth of shadow progress: its state, and each SHADOW_LOG_FRAMES more frames."""
    if d.shadow is None:
        return ("", 0)
    frames = d.shadow.totals.get("frames")
    return d.shadow.state, (frames // SHADOW_LOG_FRAMES if isinstance(frames, int) else 0)


def verdict(d: Device) -> str:
    """A --shadow push's word on a device: promoted, rejected (or no evidence), or where it stopped."""
    if d.shadow is None:
        return ""
    if d.state in ("probation", "committed", "rolled_back"):
        return "promoted on shadow evidence" + (", then rolled back on probation" if d.state == "rolled_back" else "")
    if d.shadow.state == "no_evidence" or d.error.startswith(Code.NO_EVIDENCE.value):
        return "rejected: no evidence"
    if d.shadow.failed or d.error.startswith(Code.MODEL_REJECTED.value):
        return "rejected on shadow evidence"
    return ""


def report(pusher: Pusher, wait: Wait, seconds: float, out: TextIO) -> int:
    devs = list(pusher.devices.values())
    ok = [d for d in devs if d.ok(wait)]
    print(f"push: {pusher.ref}: {len(ok)} of {len(devs)} device(s) succeeded in {seconds:.1f} s", file=out)
    for d in devs:
        took = f"{d.ended - d.started:6.1f} s" if d.ended else "      -"
        mark = "ok  " if d.ok(wait) else "FAIL"
        via = f"via transfer {d.via} (another push of this package, which the device joined ours to) " if d.via else ""
        if d.took_over and not d.via:
            via = f"took over transfer {d.took_over} (another push of this package, already running) "
        print(f"  {mark} {d.id:<20} {d.state:<11} {took}  {via}{d.error}".rstrip(), file=out)
        if d.shadow is not None and (d.shadow.state or verdict(d)):  # the figures it was judged on
            print(f"       {verdict(d) or 'no verdict'}: {d.shadow.line(reasons=False)}", file=out)
            if pusher.verbose:
                for text in d.shadow.camera_lines():
                    print(f"    {text}", file=out)
    served = sum(d.served for d in devs)
    if served and seconds > 0:
        print(f"push: served {served / 2**20:.1f} MiB, {served / 2**20 / seconds:.1f} MiB/s overall", file=out)
    return 0 if len(ok) == len(devs) else 1
