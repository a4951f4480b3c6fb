"""A task a timer runs once after its delay (Kafka's ``TimerTask`` and ``TimerTaskEntry`` in one).

A task is itself the node of the doubly linked :class:`~.timer_task_list.TimerTaskList` that
holds it while it is scheduled: one object per pending operation instead of two, and cancelling
is an O(1) unlink with no search. Kafka keeps a separate entry object so that a task can be
rescheduled while another thread still holds its old entry; here every call happens on one event
loop, so a task is on at most one list at a time and the list it is on is exactly its state:

- ``_list is None``: not scheduled (never added, already run, or cancelled);
- otherwise: scheduled, due at ``expiration_ms`` on the timer's clock, linked between
  ``_prev`` and ``_next`` of that list.

Not thread-safe: a task belongs to the event loop of the timer it is added to.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .timer_task_list import TimerTaskList


class Link:
    """A node of a circular doubly linked list; a list's own sentinel is a node too."""

    __slots__ = ("_next", "_prev")

    _next: Link
    _prev: Link


class TimerTask(Link, ABC):
    """Work that a timer runs once, ``delay_ms`` after it was added, unless cancelled first."""

    __slots__ = ("_list", "delay_ms", "expiration_ms")

    def __init__(self, delay_ms: int) -> None:
        self.delay_ms = delay_ms
        # Absolute due time on the timer's millisecond clock; set when added.
        self.expiration_ms = 0
        self._list: TimerTaskList | None = None

    @abstractmethod
    def run(self) -> None:
        """Called by the timer once the delay has elapsed (never before)."""

    def cancel(self) -> None:
        """Take the task off its timer in O(1); a no-op when it is not scheduled."""
        task_list = self._list
        if task_list is not None:
            # TimerTaskList.remove, inlined: cancelling is on the hot path of every completion.
            before = self._prev
            after = self._next
            before._next = after
            after._prev = before
            self._list = None
            task_list.count -= 1

    @property
    def scheduled(self) -> bool:
        return self._list is not None
