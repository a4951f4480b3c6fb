"""A bucket of the timing wheel (Kafka's ``TimerTaskList``): the tasks due in one tick of one
wheel, as a circular doubly linked list whose sentinel is the list object itself.

Invariants:

- every task linked into the list has ``_list`` pointing at it, and ``count`` is their number;
- ``expiration_ms`` is the start of the tick the bucket stands for (``-1`` while the bucket is
  empty and not in the delay queue); it changes only from ``-1``, so a bucket sits in the delay
  queue at most once, keyed by its current expiration;
- adding and removing are O(1); :meth:`flush` empties the bucket in one pass.

Not thread-safe (one event loop).
"""

from __future__ import annotations

from collections.abc import Iterator

from .timer_task import Link, TimerTask

NO_EXPIRATION = -1


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
        before = task._prev
        after = task._next
        before._next = after
        after._prev = before
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
        tasks = []
        node = self._next
        while node is not self:
            assert isinstance(node, TimerTask)
            tasks.append(node)
            node._list = None
            node = node._next
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
