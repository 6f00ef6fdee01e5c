"""Retry timing with full jitter, for every retry loop of the daemon and the operator tools (reconnects,
spool retries, refused topics, OTA re-asks).

After a broker restart a fleet that backs off in fixed steps (1 s, 2 s, 4 s …) retries in lockstep:
every device lost the connection at the same instant, so every device knocks at the same instants.
Full jitter spreads them: the n-th consecutive failure waits ``uniform(0, min(cap, base * 2**n))``
(the "full jitter" of the AWS Architecture Blog's *Exponential Backoff and Jitter*), and a success
resets the count. The mean wait is half the plain exponential one; the spread is all of it.

Two ways to use it: ``stop.wait(backoff.next_s())`` in a loop that sleeps, or ``failed(now)`` /
``due(now)`` in a loop that polls (the publisher's spool retries and refused-topic holds).
"""

from __future__ import annotations

import random
from collections.abc import Callable

MAX_DOUBLINGS = 32  # 2**32 times any base is past every cap: no float overflow after a long outage


class Backoff:
    """Exponential back-off with full jitter; `reset()` after a success."""

    def __init__(
        self,
        base_s: float,
        cap_s: float,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> None:
        if not 0 < base_s <= cap_s:
            raise ValueError(f"back-off needs 0 < base_s <= cap_s, got base_s={base_s} cap_s={cap_s}")
        self.base_s = base_s
        self.cap_s = cap_s
        self.failures = 0  # consecutive failures since the last reset
        self.next_at = 0.0  # for polling loops: when the next try is due (monotonic)
        self._uniform = uniform

    def ceiling_s(self) -> float:
        """The most the next wait can be: min(cap, base * 2**failures)."""
        return min(self.cap_s, self.base_s * 2.0 ** min(self.failures, MAX_DOUBLINGS))

    def next_s(self) -> float:
        """Count one more failure and return how long to wait before the next try."""
        delay = self._uniform(0.0, self.ceiling_s())
        self.failures += 1
        return delay

    def failed(self, now: float) -> float:
        """A polling loop's failure at `now`: the next try is due after a jittered wait."""
        delay = self.next_s()
        self.next_at = now + delay
        return delay

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def reset(self) -> None:
        self.failures = 0
        self.next_at = 0.0
