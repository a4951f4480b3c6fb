"""A task a timer runs once after its delay, and the buckets that hold scheduled tasks (Kafka's
``TimerTask``, ``TimerTaskEntry`` and ``TimerTaskList``).

A task is itself the node of the doubly linked :class:`TimerTaskList` that holds it while it is
scheduled: one object per pending operation instead of a task and an entry, and cancelling is
an O(1) unlink with no search. Kafka keeps a separate entry so that a task can be rescheduled
while another thread still holds its old entry; here every call happens on one event loop, so a
task is on at most one list at a time and the list it is on is exactly its state:

- ``_list is None``: not scheduled (never added, already run, or cancelled);
- otherwise: scheduled, due at ``expiration_ms`` on the timer's clock, linked into that list.

A :class:`TimerTaskList` is a bucket of the timing wheel: the tasks due in one tick of one wheel,
in insertion order, as a circular list whose sentinel is the list object itself. Invariants:
every task linked into a list has ``_list`` pointing at it, and ``count`` is their number;
``expiration_ms`` is the start of the tick the bucket stands for (``-1`` while the bucket is
empty and not in the delay queue); it changes only from ``-1``, so a bucket sits in the delay
queue at most once, keyed by its current expiration.

Not thread-safe: tasks and lists belong to the event loop of one timer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator

NO_EXPIRATION = -1


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


class TimerTaskList(Link):
    """Tasks in insertion order; O(1) add, remove and pop of the first."""

    __slots__ = ("count", "expiration_ms")

    def __init__(self) -> None:
        self._next = self
        self._prev = self
        self.count = 0
        self.expiration_ms = NO_EXPIRATION

    def add(self, task: TimerTask) -> None:
        """Append ``task``, which must not be on any list."""
        tail = self._prev
        task._prev = tail
        task._next = self
        tail._next = task
        self._prev = task
        task._list = self
        self.count += 1

    def remove(self, task: TimerTask) -> None:
        """Unlink ``task`` if it is on this list (else nothing happens)."""
        if task._list is not self:
            return
        task._prev._next = task._next
        task._next._prev = task._prev
        task._list = None
        self.count -= 1

    def pop(self) -> TimerTask | None:
        """Unlink and return the first task, or None when empty."""
        first = self._next
        if first is self:
            return None
        assert isinstance(first, TimerTask)
        self.remove(first)
        return first

    def set_expiration(self, expiration_ms: int) -> bool:
        """Set the bucket's expiration; True if it changed (the bucket must then be queued)."""
        if self.expiration_ms == expiration_ms:
            return False
        self.expiration_ms = expiration_ms
        return True

    def flush(self) -> list[TimerTask]:
        """Unlink every task, reset the expiration, and return the tasks in order."""
        tasks = list(self)
        for task in tasks:
            task._list = None
        self._next = self._prev = self
        self.count = 0
        self.expiration_ms = NO_EXPIRATION
        return tasks

    def __iter__(self) -> Iterator[TimerTask]:
        node = self._next
        while node is not self:
            assert isinstance(node, TimerTask)
            following = node._next
            yield node
            node = following

    def __len__(self) -> int:
        return self.count
