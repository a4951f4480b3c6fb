"""The delayed operation contract (Kafka's ``DelayedOperation``): an operation that waits for a
condition, bounded by a timeout, and completes exactly once.

Subclasses implement:

- :meth:`DelayedOperation.try_complete` - check the condition; when it holds, call
  :meth:`force_complete` and return what it returned. Called when the operation is parked and
  again whenever one of its keys reports progress.
- :meth:`DelayedOperation.on_complete` - the completion action (answer the waiter). Runs
  exactly once, whether the condition or the timeout won.
- :meth:`DelayedOperation.on_expiration` - runs right after ``on_complete`` when the timeout won.

Exactly once holds because every path to completion (condition, timeout, abandonment) goes
through one check-and-set of the completed flag with no suspension point in between; all
calls happen on one event loop (not thread-safe).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable

from .timer_task import TimerTask


class DelayedOperation(TimerTask):
    """An operation parked until :meth:`try_complete` succeeds or ``delay_ms`` elapses."""

    def __init__(self, delay_ms: int) -> None:
        super().__init__(delay_ms)
        self._completed = False
        self._done_callbacks: list[Callable[[DelayedOperation], None]] = []

    @property
    def is_completed(self) -> bool:
        return self._completed

    @abstractmethod
    def try_complete(self) -> bool:
        """Complete the operation if its condition holds; True if this call completed it."""

    @abstractmethod
    def on_complete(self) -> None:
        """The completion action; called exactly once."""

    @abstractmethod
    def on_expiration(self) -> None:
        """Called after :meth:`on_complete` when the operation timed out."""

    def force_complete(self) -> bool:
        """Complete now, whatever the condition. True if this call completed the operation,
        False if it was already completed (or abandoned) before."""
        if not self._finish():
            return False
        self.on_complete()
        return True

    def abandon(self) -> bool:
        """Drop the operation without completing it (its waiter went away): neither
        ``on_complete`` nor ``on_expiration`` will run. True if it was still pending."""
        return self._finish()

    def run(self) -> None:
        """Timer expiry: complete unless the condition already did."""
        if self.force_complete():
            self.on_expiration()

    def add_done_callback(self, callback: Callable[[DelayedOperation], None]) -> None:
        """Call ``callback(self)`` once the operation is completed or abandoned (at once if it
        already is); callbacks run before ``on_complete``."""
        if self._completed:
            callback(self)
        else:
            self._done_callbacks.append(callback)

    def _finish(self) -> bool:
        if self._completed:
            return False
        self._completed = True
        self.cancel()
        callbacks, self._done_callbacks = self._done_callbacks, []
        for callback in callbacks:
            callback(self)
        return True
