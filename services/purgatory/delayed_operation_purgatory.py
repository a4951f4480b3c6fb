"""Operations parked on keys until they complete or expire (Kafka's
``DelayedOperationPurgatory``), for one kind of operation.

An operation is parked with :meth:`DelayedOperationPurgatory.try_complete_else_watch`: it is
checked once and, if not complete, added to the watcher list of every key it names and handed to
the timer. :meth:`DelayedOperationPurgatory.check_and_complete` re-checks the watchers of one key
after progress on that key. However an operation ends (condition, timeout, abandonment), it
leaves every watcher list and the timer at once, and a key with no watchers left is forgotten,
so nothing accumulates.

Invariants: an operation is in ``_keys_of`` exactly while it is pending; it is in the watcher
list of key k exactly while it is pending and k is one of its keys.

Not thread-safe (one event loop): the check at parking and the registration in the watcher lists
happen without a suspension point in between, so no progress report can slip between them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, KeysView
from typing import Generic, TypeVar

from .delayed_operation import DelayedOperation
from .timer import Timer

Op = TypeVar("Op", bound=DelayedOperation)


class DelayedOperationPurgatory(Generic[Op]):
    """Pending operations of one kind, watched by key, expired by a shared timer."""

    def __init__(
        self,
        name: str,
        timer: Timer,
        on_watched_keys_changed: Callable[[int], None] | None = None,
    ) -> None:
        self.name = name
        self._timer = timer
        # Insertion-ordered dicts used as sets: O(1) removal, completion in arrival order.
        self._watchers: dict[str, dict[Op, None]] = {}
        self._keys_of: dict[Op, tuple[str, ...]] = {}
        self._on_watched_keys_changed = on_watched_keys_changed

    def try_complete_else_watch(self, op: Op, keys: Iterable[str]) -> bool:
        """Complete ``op`` now if it can, else watch it on ``keys`` until it completes or
        expires. An operation with ``delay_ms <= 0`` is checked once and expired at once.
        Returns True if the operation is completed when the call returns."""
        if op.try_complete() or op.is_completed:
            return True
        if op.delay_ms <= 0:
            op.run()
            return True
        unique = tuple(dict.fromkeys(keys))
        self._keys_of[op] = unique
        added = 0
        for key in unique:
            watchers = self._watchers.get(key)
            if watchers is None:
                watchers = self._watchers[key] = {}
                added += 1
            watchers[op] = None
        op.add_done_callback(self._forget)
        self._timer.add(op)
        if added and self._on_watched_keys_changed is not None:
            self._on_watched_keys_changed(len(self._watchers))
        return False

    def check_and_complete(self, key: str) -> int:
        """Re-check the operations watching ``key``; returns how many this call completed."""
        watchers = self._watchers.get(key)
        if not watchers:
            return 0
        completed = 0
        # Completing an operation removes it from this very dict: iterate over a snapshot.
        for op in tuple(watchers):
            if not op.is_completed and op.try_complete():
                completed += 1
        return completed

    def cancel(self, op: Op) -> bool:
        """Abandon a pending operation (its waiter went away). True if it was pending."""
        return op.abandon()

    def _forget(self, op: DelayedOperation) -> None:
        keys = self._keys_of.pop(op, ())  # type: ignore[call-overload]
        removed = 0
        for key in keys:
            watchers = self._watchers.get(key)
            if watchers is None:
                continue
            watchers.pop(op, None)  # type: ignore[call-overload]
            if not watchers:
                del self._watchers[key]
                removed += 1
        if removed and self._on_watched_keys_changed is not None:
            self._on_watched_keys_changed(len(self._watchers))

    @property
    def pending(self) -> int:
        """Operations parked and not yet completed, expired or abandoned."""
        return len(self._keys_of)

    def watched_keys(self) -> KeysView[str]:
        return self._watchers.keys()

    def watchers_of(self, key: str) -> int:
        watchers = self._watchers.get(key)
        return len(watchers) if watchers else 0

    def shutdown(self) -> None:
        """Abandon every pending operation."""
        for op in tuple(self._keys_of):
            op.abandon()
