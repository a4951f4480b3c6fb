"""Operations parked on keys until they complete or expire (Kafka's
``DelayedOperationPurgatory``), for one kind of operation.

An operation is parked with :meth:`DelayedOperationPurgatory.try_complete_else_watch`: it is
checked once and, if not complete, added to the watcher list of every key it names and handed to
the timer. :meth:`DelayedOperationPurgatory.check_and_complete` re-checks the watchers of one key
after progress on that key.

Leaving the watcher lists: an operation that expires or is abandoned leaves every list at once.
One completed by a report on key k leaves k's list at once but, as in Kafka, stays in the lists
of its other keys: it is dropped there when that key is next checked, or by the purge that runs
once ``purge_interval`` such entries have piled up (Kafka's ``purgeInterval``), which keeps a
completion O(1) in the number of keys while bounding what completed operations can hold on to.
A key whose list becomes empty is forgotten.

Invariants: an operation is in ``_keys_of`` exactly while it is pending; a pending operation is
in the watcher list of each of its keys; at most ``purge_interval`` entries of completed
operations are in the watcher lists.

Not thread-safe (one event loop): the check at parking and the registration in the watcher lists
happen without a suspension point in between, so no progress report can slip between them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, KeysView
from typing import Generic, TypeVar

from . import metrics
from .delayed_operation import DelayedOperation
from .timer import SystemTimer

Op = TypeVar("Op", bound=DelayedOperation)

# Kafka's default for fetch.purgatory.purge.interval.requests and its produce twin.
DEFAULT_PURGE_INTERVAL = 1000

_MISSING = object()


class DelayedOperationPurgatory(Generic[Op]):
    """Pending operations of one kind (``name``), watched by key, expired by a shared timer;
    its gauges (pending operations, watched keys) read the live state at scrape time."""

    def __init__(
        self,
        name: str,
        timer: SystemTimer,
        *,
        purge_interval: int = DEFAULT_PURGE_INTERVAL,
        on_key_watched: Callable[[str], None] | None = None,
    ) -> None:
        if purge_interval < 1:
            raise ValueError("purge_interval must be positive")
        self.name = name
        self._timer = timer
        # Insertion-ordered dicts used as sets: O(1) removal, completion in arrival order.
        self._watchers: dict[str, dict[Op, None]] = {}
        self._keys_of: dict[Op, tuple[str, ...]] = {}
        self._purge_interval = purge_interval
        self._purged = metrics.PURGED.labels(name)
        metrics.PENDING.labels(name).set_function(lambda: len(self._keys_of))
        metrics.WATCHED_KEYS.labels(name).set_function(lambda: len(self._watchers))
        # Told of every key an operation is parked on (after it is on the key's list).
        self._on_key_watched = on_key_watched
        # Entries of completed operations still in watcher lists.
        self._completed_entries = 0
        # The key check_and_complete is checking, while it does.
        self._checking: str | None = None

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
        for key in unique:
            watchers = self._watchers.get(key)
            if watchers is None:
                watchers = self._watchers[key] = {}
            watchers[op] = None
        if self._on_key_watched is not None:
            for key in unique:
                self._on_key_watched(key)
        op.add_done_callback(self._forget)
        self._timer.add(op)
        return False

    def check_and_complete(self, key: str) -> int:
        """Re-check the operations watching ``key``; returns how many this call completed.
        Entries of operations completed earlier through another key are dropped on the way."""
        watchers = self._watchers.get(key)
        if not watchers:
            return 0
        completed = 0
        outer, self._checking = self._checking, key
        try:
            # Completing an operation removes it from this very dict: iterate over a snapshot.
            for op in tuple(watchers):
                if not op.is_completed:
                    if op.try_complete():
                        completed += 1
                elif watchers.pop(op, _MISSING) is not _MISSING:
                    self._completed_entries -= 1
        finally:
            self._checking = outer
        if not watchers and self._watchers.get(key) is watchers:
            del self._watchers[key]
        return completed

    def purge_completed(self) -> int:
        """Drop every completed operation from every watcher list and forget keys left with
        none; returns how many entries went."""
        removed = 0
        for key, watchers in tuple(self._watchers.items()):
            stale = [op for op in watchers if op.is_completed]
            for op in stale:
                del watchers[op]
            removed += len(stale)
            if not watchers:
                del self._watchers[key]
        self._completed_entries = 0
        self._purged.inc(removed)
        return removed

    def _forget(self, op: DelayedOperation) -> None:
        keys = self._keys_of.pop(op, ())  # type: ignore[call-overload]
        checking = self._checking
        for key in keys:
            watchers = self._watchers.get(key)
            if watchers is None:
                continue
            if checking is not None and key != checking:
                # Completed by a report on another key: left for that key's next check or the
                # purge, as Kafka does.
                self._completed_entries += 1
                continue
            watchers.pop(op, None)  # type: ignore[call-overload]
            if not watchers and key != checking:
                del self._watchers[key]
        if self._completed_entries >= self._purge_interval:
            self.purge_completed()

    @property
    def pending(self) -> int:
        """Operations parked and not yet completed, expired or abandoned."""
        return len(self._keys_of)

    @property
    def completed_entries(self) -> int:
        """Entries of completed operations still in watcher lists (at most the purge interval)."""
        return self._completed_entries

    def watched_keys(self) -> KeysView[str]:
        """Keys with a watcher list (pending operations, or completed ones not yet purged)."""
        return self._watchers.keys()

    def watchers_of(self, key: str) -> int:
        watchers = self._watchers.get(key)
        return len(watchers) if watchers else 0

    def shutdown(self) -> None:
        """Abandon every pending operation and drop every watcher list."""
        for op in tuple(self._keys_of):
            op.abandon()
        self._watchers.clear()
        self._completed_entries = 0
