"""A hierarchical timing wheel (Kafka's ``TimingWheel``, after Varghese and Lauck).

A wheel has ``wheel_size`` buckets of ``tick_ms`` each and covers ``interval_ms = tick_ms x
wheel_size`` from its ``current_time_ms`` (always a multiple of its tick). A task due at E is
put in the bucket of tick ``E // tick_ms`` if that tick lies strictly after the current one and
before ``current_time_ms + interval_ms``; a task due further away goes to the overflow wheel,
created on demand with a tick equal to this wheel's interval, and so on up. A task due before
the end of the current tick has expired: :meth:`TimingWheel.add` refuses it and the caller runs
it.

Buckets are queued in the shared :class:`~.delay_queue.DelayQueue` by their expiration. When the
earliest one expires, the timer advances the clock of every wheel to it and re-adds its tasks:
tasks of a higher wheel's bucket cascade into finer wheels (or run, once due), so each task
moves down at most once per wheel and adding and cancelling stay O(1) whatever the number of
pending tasks.

Invariants: a wheel never uses the bucket of its current tick for new tasks (that bucket is the
one being expired, or was already), so a bucket holds tasks of one tick at a time; the current
time of a wheel is the current time of the wheel below rounded down to its own tick.

Not thread-safe (one event loop).
"""

from __future__ import annotations

from collections.abc import Iterator

from .delay_queue import DelayQueue
from .timer_task import TimerTask
from .timer_task_list import TimerTaskList


class TimingWheel:
    __slots__ = ("_buckets", "_overflow", "_queue", "current_time_ms", "interval_ms",
                 "tick_ms", "wheel_size")

    def __init__(self, tick_ms: int, wheel_size: int, start_ms: int, queue: DelayQueue) -> None:
        if tick_ms < 1 or wheel_size < 2:
            raise ValueError("a timing wheel needs tick_ms >= 1 and wheel_size >= 2")
        self.tick_ms = tick_ms
        self.wheel_size = wheel_size
        self.interval_ms = tick_ms * wheel_size
        self.current_time_ms = start_ms - start_ms % tick_ms
        self._buckets = [TimerTaskList() for _ in range(wheel_size)]
        self._queue = queue
        self._overflow: TimingWheel | None = None

    def add(self, task: TimerTask) -> bool:
        """Put ``task`` (not on any list) in the bucket of ``task.expiration_ms``, here or in an
        overflow wheel; False if it has already expired (it is then on no list)."""
        expiration = task.expiration_ms
        wheel = self
        # A loop rather than recursion: a task climbs one wheel per iteration.
        while True:
            tick = wheel.tick_ms
            current = wheel.current_time_ms
            if expiration < current + tick:
                return False
            if expiration < current + wheel.interval_ms:
                virtual_id = expiration // tick
                bucket = wheel._buckets[virtual_id % wheel.wheel_size]
                bucket.add(task)
                # The bucket was empty and unqueued (its old tick expired and was flushed).
                if bucket.set_expiration(virtual_id * tick):
                    wheel._queue.offer(bucket)
                return True
            overflow = wheel._overflow
            if overflow is None:
                overflow = wheel._overflow = TimingWheel(
                    wheel.interval_ms, wheel.wheel_size, current, wheel._queue)
            wheel = overflow

    def advance_clock(self, time_ms: int) -> None:
        """Move this wheel and the ones above to ``time_ms`` (rounded down to each tick).

        Only safe when no queued bucket expires before ``time_ms`` except the ones about to be
        flushed: the timer calls it with the expiration of the bucket it just polled, or with
        the present when nothing earlier is queued."""
        wheel: TimingWheel | None = self
        while wheel is not None and time_ms >= wheel.current_time_ms + wheel.tick_ms:
            wheel.current_time_ms = time_ms - time_ms % wheel.tick_ms
            time_ms = wheel.current_time_ms
            wheel = wheel._overflow

    def wheels(self) -> Iterator[TimingWheel]:
        """This wheel and every overflow wheel above it, finest first."""
        wheel: TimingWheel | None = self
        while wheel is not None:
            yield wheel
            wheel = wheel._overflow

    @property
    def buckets(self) -> tuple[TimerTaskList, ...]:
        return tuple(self._buckets)
