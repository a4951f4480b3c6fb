"""Timers for delayed operations: run a task once after its delay unless it is cancelled first
(the role of Kafka's ``org.apache.kafka.server.util.timer.Timer``/``TimerTask``).

:class:`Timer` is the small interface the purgatory depends on, so the implementation can be
swapped (a hierarchical timing wheel) without touching the operations. :class:`LoopTimer` is
the simple implementation: one event-loop timer handle per task, O(log n) add and O(1) cancel.

Not thread-safe: a timer and its tasks belong to the event loop that created the timer, and
every method must be called on that loop.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod


class TimerTask(ABC):
    """Work that a :class:`Timer` runs once, ``delay_ms`` after it was added.

    A task is on at most one timer at a time; :meth:`cancel` takes it off (a no-op when it was
    never added, already ran, or was already cancelled).
    """

    def __init__(self, delay_ms: int) -> None:
        self.delay_ms = delay_ms
        self._timer: Timer | None = None

    @abstractmethod
    def run(self) -> None:
        """Called by the timer when the delay has elapsed."""

    def cancel(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.remove(self)

    @property
    def scheduled(self) -> bool:
        return self._timer is not None


class Timer(ABC):
    """Runs tasks after their delay."""

    @abstractmethod
    def add(self, task: TimerTask) -> None:
        """Schedule ``task`` to run ``task.delay_ms`` from now (at once when <= 0).

        Raises ValueError if the task is already scheduled.
        """

    @abstractmethod
    def remove(self, task: TimerTask) -> None:
        """Forget ``task`` (called through :meth:`TimerTask.cancel`); unknown tasks are ignored."""

    @property
    @abstractmethod
    def size(self) -> int:
        """Tasks scheduled and not yet run or cancelled."""

    @abstractmethod
    def shutdown(self) -> None:
        """Drop every scheduled task without running it."""


class LoopTimer(Timer):
    """A :class:`Timer` on an asyncio event loop, one ``call_at`` handle per task."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._handles: dict[TimerTask, asyncio.TimerHandle] = {}

    def add(self, task: TimerTask) -> None:
        if task._timer is not None:
            raise ValueError("timer task is already scheduled")
        task._timer = self
        deadline = self._loop.time() + max(task.delay_ms, 0) / 1000.0
        self._handles[task] = self._loop.call_at(deadline, self._fire, task, deadline)

    def _fire(self, task: TimerTask, deadline: float) -> None:
        if self._loop.time() < deadline:
            # Event loops run timers up to their clock resolution early; a delayed operation
            # must never expire before its timeout, so wait out the remainder.
            self._handles[task] = self._loop.call_at(deadline, self._fire, task, deadline)
            return
        del self._handles[task]
        task._timer = None
        task.run()

    def remove(self, task: TimerTask) -> None:
        handle = self._handles.pop(task, None)
        if handle is not None:
            handle.cancel()

    @property
    def size(self) -> int:
        return len(self._handles)

    def shutdown(self) -> None:
        handles, self._handles = self._handles, {}
        for task, handle in handles.items():
            handle.cancel()
            task._timer = None
