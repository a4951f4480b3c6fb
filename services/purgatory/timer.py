"""The timer of delayed operations: runs a task once after its delay unless it is cancelled
first (Kafka's ``Timer`` and its one implementation ``SystemTimer``).

:class:`SystemTimer` keeps tasks in a hierarchical :class:`~.timing_wheel.TimingWheel` (tick 1 ms
and 20 buckets per wheel by default), so adding and cancelling cost O(1) however many operations
are pending, with one :class:`~.delay_queue.DelayQueue` of buckets ordered by expiration. The
reaper (Kafka's ``SystemTimer.advanceClock`` and its reaper thread) is
:meth:`SystemTimer.advance_clock`: it takes every bucket that has expired, advances the wheels'
clocks to it and re-adds its tasks, which moves tasks of coarse wheels into finer ones and runs
the ones that are due.

Driving: given an event loop, the timer reads the monotonic clock (the one asyncio and uvloop
schedule on) and sleeps until the earliest bucket expires (one ``loop.call_at`` wakeup, moved
earlier when a new earlier bucket appears; no polling) and reaps then. Without a loop it is
driven by hand (tests, benchmarks) with :meth:`SystemTimer.advance_clock`, on the monotonic
clock or one it is given. On a loop, one reap moves at most about ``reap_budget`` tasks down the
wheels (whole lists at a time) and then yields to the loop, continuing on its next iteration:
a loop that stalled long enough for many lists to come due catches up without another stall.

Timing: a task added at clock time t with delay d is due at t + d rounded up to the tick, and it
runs at the first reap at or after that instant: never early, at most one tick plus the loop's
scheduling delay late. A task whose delay is <= 0 runs at the next reap (on the next loop
iteration), never inside :meth:`SystemTimer.add`. A cancelled task never runs, even one
cancelled by another task running in the same reap.

Not thread-safe: a timer and its tasks belong to one event loop (or one driving thread).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from .delay_queue import DelayQueue
from .timer_task import TimerTask, TimerTaskList
from .timing_wheel import TimingWheel

log = logging.getLogger(__name__)

DEFAULT_TICK_MS = 1
DEFAULT_WHEEL_SIZE = 20
# Tasks moved down the wheels per reap on an event loop before the reaper yields to the loop.
DEFAULT_REAP_BUDGET = 4096

_monotonic = time.monotonic
_ceil = math.ceil


class SystemTimer:
    """Runs tasks after their delay over a hierarchical timing wheel, reaped on an event loop
    or by hand; :meth:`TimerTask.cancel` takes a task off in O(1)."""

    def __init__(
        self,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        clock_ms: Callable[[], float] | None = None,
        tick_ms: int = DEFAULT_TICK_MS,
        wheel_size: int = DEFAULT_WHEEL_SIZE,
        reap_budget: int = DEFAULT_REAP_BUDGET,
    ) -> None:
        # No clock given: the monotonic clock, read inline by add (not loop.time(): uvloop's
        # loop time is cached once per loop iteration in whole milliseconds, and a stale "now"
        # would make tasks due early). Event loops schedule on the same clock, so wakeups line
        # up with deadlines.
        self._loop = loop
        self._clock = clock_ms
        self._tick_ms = tick_ms
        self._reap_budget = reap_budget
        self._queue = DelayQueue()
        self._wheel = TimingWheel(tick_ms, wheel_size, math.floor(self._now()), self._queue)
        # Tasks found due when added or reaped, run in order by the reap.
        self._due = TimerTaskList()
        self._wakeup: asyncio.TimerHandle | None = None
        self._wakeup_at = math.inf
        self._reaping = False
        if loop is not None:
            # Only a list newly queued can be earlier than the wakeup: checked then, not per add.
            self._queue.on_offer = self._on_list_queued

    def _now(self) -> float:
        clock = self._clock
        return _monotonic() * 1000.0 if clock is None else clock()

    def add(self, task: TimerTask) -> None:
        """Schedule ``task`` to run ``task.delay_ms`` from now (at the next reap when <= 0).

        Raises ValueError if the task is already scheduled."""
        if task._list is not None:
            raise ValueError("timer task is already scheduled")
        clock = self._clock
        now = _monotonic() * 1000.0 if clock is None else clock()
        tick = self._tick_ms
        if tick == 1:
            task.expiration_ms = _ceil(now + task.delay_ms)
        else:
            task.expiration_ms = _ceil((now + task.delay_ms) / tick) * tick
        wheel = self._wheel
        if now >= wheel.current_time_ms + wheel.interval_ms:
            self._catch_up(now)
        if not wheel.add(task):
            self._due.add(task)
            if self._loop is not None and not self._reaping and self._wakeup_at >= 0:
                self._schedule(-1)

    def _catch_up(self, now: float) -> None:
        # Catch the clock up after a quiet spell, so a short delay lands in the finest wheel
        # rather than cascading down from a coarse one; safe while nothing queued is due.
        earliest = self._queue.earliest_expiration()
        if earliest is None or earliest > now:
            self._wheel.advance_clock(math.floor(now))

    def _on_list_queued(self, expiration_ms: int) -> None:
        if expiration_ms < self._wakeup_at and not self._reaping:
            self._schedule(expiration_ms)

    def advance_clock(self, now_ms: float | None = None, budget: int | None = None) -> int:
        """Reap: flush every list expired by ``now_ms`` (default: the clock), cascading its
        tasks down the wheels, then run the tasks that are due. Returns how many ran.

        With a ``budget``, stop taking expired lists once that many tasks were moved (a list
        is always moved whole): the rest waits for the next reap, so one reap cannot hold the
        event loop for long; what is already due still runs now."""
        now = self._now() if now_ms is None else now_ms
        wheel = self._wheel
        add = wheel.add
        queue = self._queue
        due = self._due
        left = math.inf if budget is None else budget
        self._reaping = True
        ran = 0
        try:
            bucket = queue.poll(now)
            while bucket is not None:
                wheel.advance_clock(bucket.expiration_ms)
                tasks = bucket.flush()
                for task in tasks:
                    if not add(task):
                        due.add(task)
                left -= len(tasks)
                if left <= 0:
                    break
                bucket = queue.poll(now)
            # Popped one at a time: a task cancelled by another's run is off the list already.
            task = due.pop()
            while task is not None:
                ran += 1
                try:
                    task.run()
                except Exception:
                    log.exception("timer task %r failed", task)
                task = due.pop()
        finally:
            self._reaping = False
        return ran

    def next_expiration_ms(self) -> float | None:
        """When the next reap has work: the earliest queued bucket, -inf if tasks are already
        due, None if nothing is scheduled."""
        if self._due.count:
            return -math.inf
        return self._queue.earliest_expiration()

    def _schedule(self, at_ms: float) -> None:
        assert self._loop is not None
        if self._wakeup is not None:
            self._wakeup.cancel()
        self._wakeup_at = at_ms
        # A time in the past runs on the next loop iteration.
        self._wakeup = self._loop.call_at(max(at_ms, 0) / 1000.0, self._on_wakeup)

    def _on_wakeup(self) -> None:
        self._wakeup = None
        self._wakeup_at = math.inf
        try:
            self.advance_clock(budget=self._reap_budget)
        finally:
            following = self.next_expiration_ms()
            if following is not None:
                self._schedule(following)

    @property
    def size(self) -> int:
        """Tasks scheduled and not yet run or cancelled."""
        return self._due.count + sum(
            bucket.count for wheel in self._wheel.wheels() for bucket in wheel.buckets)

    def shutdown(self) -> None:
        """Drop every scheduled task without running it."""
        for wheel in self._wheel.wheels():
            for bucket in wheel.buckets:
                bucket.flush()
        self._due.flush()
        self._queue.clear()
        if self._wakeup is not None:
            self._wakeup.cancel()
            self._wakeup = None
        self._wakeup_at = math.inf
