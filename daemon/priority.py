"""Work that must not slow the serving model: run on a thread of lower scheduling priority (issue 18).

A side-by-side swap warms its candidate up while the old model serves. The candidate's first batches set
up its memory and kernels: on the 2-core reference machine 0.4-0.65 s of CPU for the demo model, during
which the serving model's batches stretched. At a lower priority they take the CPU the serving model
leaves. Only the warm-up and the golden check run there: the backend itself is opened at the daemon's
priority, as the thread pools it creates serve after the flip (a thread's priority is inherited by the
threads it starts).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["CANDIDATE_NICE", "yielding"]

CANDIDATE_NICE = 10  # how much nicer than the daemon the yielding thread runs (Linux nice values, at most 19)
_R = TypeVar("_R")


def yielding(fn: Callable[[], _R]) -> _R:
    """Run `fn` on a thread of its own whose priority is lowered by CANDIDATE_NICE (on Linux, that thread
    only; elsewhere, or where it is not allowed, at the caller's priority), wait, and return what it
    returns or raise what it raises."""
    box: list[tuple[bool, Any]] = []

    def run() -> None:
        with contextlib.suppress(OSError, AttributeError):  # not Linux, or not allowed: as it is
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + CANDIDATE_NICE))
        try:
            box.append((True, fn()))
        except BaseException as exc:  # handed to the caller's thread
            box.append((False, exc))

    t = threading.Thread(target=run, name="swap-warm-up", daemon=True)
    t.start()
    t.join()
    ok, value = box[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]
