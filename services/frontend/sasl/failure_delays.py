"""The delay before a failed authentication is answered and its connection closed (Kafka's
``connection.failed.authentication.delay.ms``), slowing down password guessing.

Kafka waits a constant time; here the delay also grows with repeated failures from one client
address: it doubles with each recent failure, up to :data:`MAX_DELAY_SECONDS` (or the base
delay, if that is longer). Failures are forgotten gradually: a client's failure count halves
every :data:`HALF_LIFE_SECONDS` without failures. At most :data:`MAX_TRACKED_ADDRESSES`
addresses are remembered (the oldest are forgotten first). A base of 0 means no delay at all.
"""

from __future__ import annotations

import time

MAX_DELAY_SECONDS = 5.0
HALF_LIFE_SECONDS = 60.0
MAX_TRACKED_ADDRESSES = 10_000


class FailedAuthenticationDelays:
    def __init__(self, base_ms: int) -> None:
        self._base = max(base_ms, 0) / 1000
        self._cap = max(self._base, MAX_DELAY_SECONDS)
        # address -> (decayed failure count, when last updated)
        self._failures: dict[str, tuple[float, float]] = {}

    def failed(self, address: str, now: float | None = None) -> float:
        """Record a failure from ``address``; the seconds to wait before answering it."""
        if self._base == 0:
            return 0.0
        now = time.monotonic() if now is None else now
        count, last = self._failures.pop(address, (0.0, now))
        count = count * 0.5 ** ((now - last) / HALF_LIFE_SECONDS) + 1
        self._failures[address] = (count, now)
        if len(self._failures) > MAX_TRACKED_ADDRESSES:
            del self._failures[next(iter(self._failures))]
        return min(self._base * 2 ** min(count - 1, 32), self._cap)
