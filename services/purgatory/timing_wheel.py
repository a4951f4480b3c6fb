"""A hierarchical timing wheel (Kafka's ``TimingWheel``, after Varghese and Lauck).

A wheel has ``wheel_size`` ticks of ``tick_ms`` each and covers ``interval_ms = tick_ms x
wheel_size`` from its ``current_time_ms`` (always a multiple of its tick). A task due at E
belongs to the finest wheel whose range holds it: E before ``current_time_ms + interval_ms``
(and, in the finest wheel, E at or after the end of the current tick; a task due earlier has
expired: :meth:`TimingWheel.add` refuses it and the caller runs it). Overflow wheels are created
on demand, each with a tick equal to the interval of the wheel below.

Buckets and slices: the finest wheel has one bucket (a :class:`~.timer_task.TimerTaskList`)
per tick. A coarser wheel keeps each of its ticks split into ``wheel_size`` slices, one list per
tick of the wheel below (``wheel_size`` x ``wheel_size`` lists, indexed by the finer tick), and
every list expires at the start of its own slice. So a coarse tick that comes due does not hand
all its tasks down in one burst (tens of thousands of re-adds blocking the event loop): its
slices come due one after another, each moving only the tasks of one finer tick, just in time.
Adding still costs one list append, and each task still moves down at most once per wheel.

Lists are queued in the shared :class:`~.delay_queue.DelayQueue` by expiration, and only when
their expiration changes (an empty list taking a new slice), not once per task; the timer
reaps them (:mod:`.timer`).

Picking the wheel is direct, not a climb through the levels: with ``delta`` = E - the finest
wheel's current time, the first level whose interval exceeds ``delta`` (a bisection of the
precomputed intervals) holds E, or else the next one does (a coarser wheel's current time lags
the finest one's by less than its tick, so its range ends at most one lower interval early).

Invariants: the current time of a wheel is the current time of the wheel below rounded down to
its own tick; the live slices of a wheel span less than ``wheel_size`` x ``wheel_size`` ticks of
the wheel below, so two live slices never share a list; a list holds tasks of one slice at a
time and sits in the delay queue under its current expiration.

Not thread-safe (one event loop).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator

from .delay_queue import DelayQueue
from .timer_task import TimerTask, TimerTaskList

# Intervals are precomputed for the levels up to this span: far beyond any real delay.
_MAX_SPAN_MS = 1 << 64


class TimingWheel:
    __slots__ = ("_buckets", "_level_by_bits", "_levels", "_overflow", "_queue", "_slice_ms",
                 "_slots", "_spans", "current_time_ms", "interval_ms", "tick_ms", "wheel_size")

    def __init__(self, tick_ms: int, wheel_size: int, start_ms: int, queue: DelayQueue,
                 *, slice_ms: int | None = None) -> None:
        if tick_ms < 1 or wheel_size < 2:
            raise ValueError("a timing wheel needs tick_ms >= 1 and wheel_size >= 2")
        self.tick_ms = tick_ms
        self.wheel_size = wheel_size
        self.interval_ms = tick_ms * wheel_size
        self.current_time_ms = start_ms - start_ms % tick_ms
        # The finest wheel has no finer tick to slice by: one list per tick.
        self._slice_ms = tick_ms if slice_ms is None else slice_ms
        self._slots = wheel_size * (tick_ms // self._slice_ms)
        self._buckets = [TimerTaskList() for _ in range(self._slots)]
        self._queue = queue
        self._overflow: TimingWheel | None = None
        # Kept by the finest wheel only: every level, and each level's interval.
        self._levels: list[TimingWheel] = [self]
        spans = [self.interval_ms]
        while spans[-1] < _MAX_SPAN_MS:
            spans.append(spans[-1] * wheel_size)
        self._spans = spans
        # The first level whose interval exceeds 2 ** (bits - 1), by bit length: a delta of that
        # many bits belongs there or one level up (intervals grow at least twofold per level).
        self._level_by_bits = [bisect_right(spans, (1 << bits) >> 1)
                               for bits in range(spans[-1].bit_length() + 1)]

    def add(self, task: TimerTask) -> bool:
        """Put ``task`` (on no list) in the list of ``task.expiration_ms``, in this wheel or an
        overflow wheel; False if it has already expired (it is then on no list). Called on the
        finest wheel."""
        expiration = task.expiration_ms
        delta = expiration - self.current_time_ms
        if delta < self.interval_ms:
            if delta < self.tick_ms:
                return False
            wheel = self
        else:
            wheel = self._wheel_for(expiration, delta)
        width = wheel._slice_ms
        bucket = wheel._buckets[expiration // width % wheel._slots]
        # TimerTaskList.add, inlined: adding is on the hot path of every parked operation.
        tail = bucket._prev
        task._prev = tail
        task._next = bucket
        tail._next = task
        bucket._prev = task
        task._list = bucket
        bucket.count += 1
        start = expiration - expiration % width
        if bucket.expiration_ms != start:
            # The list was empty and unqueued (its old slice expired and was flushed).
            bucket.expiration_ms = start
            self._queue.offer(bucket)
        return True

    def _wheel_for(self, expiration_ms: int, delta: int) -> TimingWheel:
        """The overflow wheel whose range holds ``expiration_ms``, ``delta`` (at least this
        wheel's interval) after this wheel's current time; created if missing. Called on the
        finest wheel."""
        spans = self._spans
        level = self._level_by_bits[delta.bit_length()]
        if delta >= spans[level]:
            level += 1
        levels = self._levels
        if level >= len(levels):
            self._grow(level + 1)
        wheel = levels[level]
        if expiration_ms >= wheel.current_time_ms + wheel.interval_ms:
            if level + 1 == len(levels):
                self._grow(level + 2)
            wheel = levels[level + 1]
        return wheel

    def _grow(self, count: int) -> None:
        levels = self._levels
        while len(levels) < count:
            top = levels[-1]
            overflow = TimingWheel(top.interval_ms, top.wheel_size, top.current_time_ms,
                                   top._queue, slice_ms=top.tick_ms)
            top._overflow = overflow
            levels.append(overflow)

    def advance_clock(self, time_ms: int) -> None:
        """Move this wheel and the ones above to ``time_ms`` (rounded down to each tick).

        Only safe when no queued list expires before ``time_ms`` except the ones about to be
        flushed: the timer calls it with the expiration of the list it just polled, or with
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
        """Every list of this wheel (``wheel_size`` slices per tick above the finest wheel)."""
        return tuple(self._buckets)
