"""The buckets of every wheel that hold (or held) tasks, ordered by expiration (the role of the
``java.util.concurrent.DelayQueue`` in Kafka's ``SystemTimer``).

A min-heap of ``(expiration_ms, sequence, bucket)``. Buckets, not tasks, are queued: a wheel
has a fixed number of buckets, so the heap stays tiny (at most wheel size x wheel count entries)
however many tasks are pending, and adding a task to a bucket already queued costs nothing here.
An entry whose bucket's expiration has since changed is stale and skipped (the bucket was
re-queued under its new expiration when it changed). ``on_offer``, when set, hears of every
bucket queued: the only moments the earliest expiration can move earlier.

Not thread-safe (one event loop).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from .timer_task import TimerTaskList


class DelayQueue:
    __slots__ = ("_heap", "_sequence", "on_offer")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, TimerTaskList]] = []
        # Ties in expiration are served first in, first out; buckets are never compared.
        self._sequence = itertools.count()
        self.on_offer: Callable[[int], None] | None = None

    def offer(self, bucket: TimerTaskList) -> None:
        expiration = bucket.expiration_ms
        heapq.heappush(self._heap, (expiration, next(self._sequence), bucket))
        if self.on_offer is not None:
            self.on_offer(expiration)

    def earliest_expiration(self) -> int | None:
        """The expiration of the first live bucket, or None when there is none."""
        heap = self._heap
        while heap:
            expiration, _, bucket = heap[0]
            if bucket.expiration_ms == expiration:
                return expiration
            heapq.heappop(heap)
        return None

    def poll(self, now_ms: float) -> TimerTaskList | None:
        """Remove and return the earliest bucket if it has expired by ``now_ms``, else None."""
        expiration = self.earliest_expiration()
        if expiration is None or expiration > now_ms:
            return None
        return heapq.heappop(self._heap)[2]

    def clear(self) -> None:
        self._heap.clear()

    def __len__(self) -> int:
        return len(self._heap)
