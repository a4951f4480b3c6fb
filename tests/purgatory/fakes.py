"""A manual clock timer for deterministic tests of the purgatory's domain modules."""

from __future__ import annotations

import heapq
import itertools

from services.purgatory.timer import Timer, TimerTask


class ManualTimer(Timer):
    """Runs tasks only when the test advances its clock."""

    def __init__(self) -> None:
        self.now_ms = 0
        self._heap: list[tuple[int, int, TimerTask]] = []
        self._live: set[TimerTask] = set()
        self._order = itertools.count()

    def add(self, task: TimerTask) -> None:
        if task._timer is not None:
            raise ValueError("already scheduled")
        task._timer = self
        self._live.add(task)
        heapq.heappush(self._heap, (self.now_ms + max(task.delay_ms, 0), next(self._order), task))

    def remove(self, task: TimerTask) -> None:
        self._live.discard(task)

    @property
    def size(self) -> int:
        return len(self._live)

    def shutdown(self) -> None:
        for task in self._live:
            task._timer = None
        self._live.clear()
        self._heap.clear()

    def advance(self, ms: int) -> None:
        self.now_ms += ms
        while self._heap and self._heap[0][0] <= self.now_ms:
            _, _, task = heapq.heappop(self._heap)
            if task in self._live:
                self._live.discard(task)
                task._timer = None
                task.run()
