"""A clock of the time this process ran: monotonic milliseconds less the stalls of its event
loop (the process stopped, e.g. SIGSTOP or a frozen VM, or the loop blocked).

A leader measures how long each follower has not been caught up on it. While the leader itself
is stalled no follower can fetch from it, so on a wall clock a leader that wakes after a
pause longer than ``replica.lag.time.max.ms`` finds every follower "behind" and drops them all
from the ISR, only to add them back a moment later; a produce answered NOT_ENOUGH_REPLICAS in
between, while the next one on the same connection is appended, makes an idempotent client
renumber records whose outcome it does not know. On this clock the followers lose only the
time the leader was running.

A tick every :data:`TICK_MS` notices the stalls; one still going on (the tick is late) counts
too, so a reading taken right after the loop resumes, before the tick ran, is already right.
A tick's period and :data:`TOLERANCE_MS` of lateness are ordinary scheduling and not taken
off; the clock stands still past them, so it never runs backwards.
"""

from __future__ import annotations

import asyncio
import time

TICK_MS = 100
TOLERANCE_MS = 200


def monotonic_ms() -> float:
    return time.monotonic() * 1000


class RunningClock:
    def __init__(self, *, tick_ms: int = TICK_MS, tolerance_ms: int = TOLERANCE_MS,
                 clock=monotonic_ms) -> None:
        self._tick_ms = tick_ms
        self._tolerance_ms = tolerance_ms
        self._clock = clock
        self._last_tick = clock()
        self.stalled_ms = 0.0

    def _late(self, now: float) -> float:
        # Continuous in ``now``: the clock stands still once a tick is overdue, never jumps.
        return max(0.0, now - self._last_tick - self._tick_ms - self._tolerance_ms)

    def tick(self) -> None:
        """Note the time; a tick later than its period (and the tolerance) was a stall."""
        now = self._clock()
        self.stalled_ms += self._late(now)
        self._last_tick = now

    def now_ms(self) -> int:
        """Monotonic milliseconds of running time."""
        now = self._clock()
        return int(now - self.stalled_ms - self._late(now))

    async def run(self) -> None:
        """Tick forever."""
        self._last_tick = self._clock()
        while True:
            await asyncio.sleep(self._tick_ms / 1000)
            self.tick()
