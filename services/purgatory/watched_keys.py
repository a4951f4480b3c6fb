"""The keys progress reporters should report: those that fetch and produce operations are
parked on, published to every subscriber (a log node, the replicator) as changes.

Kafka's broker checks its purgatories in process after every append, which costs nothing when
nobody waits. Here a report is a message between processes, so reporters skip keys nobody
watches - most partitions, most of the time, under a produce load without long-polling
consumers or acks=all producers.

Protocol (the WatchKeys stream):

- a subscriber first gets a reset: the whole set of published keys;
- a key is published (added) the moment an operation parks on it while it is not published;
- a key is withdrawn (removed) by :meth:`WatchedKeys.sweep` once it has had no parked
  operation for ``linger`` seconds, so keys of busy partitions do not flap with every long poll.

No missed wake-up: when a key is added, its reporter answers with the key's current position,
which covers every report it skipped before; reports after that are not skipped. The operation
that caused the add was parked before the add was published, so that answer reaches it.

Not thread-safe (one event loop).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kbroker.purgatory.v1 import purgatory_pb2

DEFAULT_LINGER_SECONDS = 60.0


@dataclass(eq=False, slots=True)
class KeySubscription:
    """Changes not yet taken by one subscriber, merged into one ``WatchedKeys`` message
    (``reset``: ``added`` is the whole set)."""

    _reset: bool = True
    _added: dict[str, None] = field(default_factory=dict)
    _removed: dict[str, None] = field(default_factory=dict)
    _ready: asyncio.Event = field(default_factory=asyncio.Event)

    # Merging errs on the side of reporting: a removal the subscriber need not hear of is
    # harmless (it discards an unknown key), and so is an add of a key it already reports.
    def _add(self, key: str) -> None:
        self._removed.pop(key, None)
        self._added[key] = None
        self._ready.set()

    def _remove(self, key: str) -> None:
        self._added.pop(key, None)
        if not self._reset:
            self._removed[key] = None
        self._ready.set()

    def take(self) -> purgatory_pb2.WatchedKeys | None:
        """The changes gathered since the last take, or None if there are none."""
        if not (self._reset or self._added or self._removed):
            return None
        changes = purgatory_pb2.WatchedKeys(reset=self._reset, added=self._added,
                                            removed=self._removed)
        self._reset = False
        self._added.clear()
        self._removed.clear()
        self._ready.clear()
        return changes

    async def next_changes(self) -> purgatory_pb2.WatchedKeys:
        """Wait for changes and take them (the first call returns the reset at once)."""
        while True:
            changes = self.take()
            if changes is not None:
                return changes
            await self._ready.wait()


class WatchedKeys:
    """Published keys with the time each last had an operation parked on it."""

    def __init__(self, linger: float = DEFAULT_LINGER_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._linger = linger
        self._clock = clock
        self._last_watched: dict[str, float] = {}
        self._subscribers: set[KeySubscription] = set()

    def __contains__(self, key: str) -> bool:
        return key in self._last_watched

    def __len__(self) -> int:
        return len(self._last_watched)

    def watch(self, key: str) -> None:
        """An operation parked on ``key``: publish it if it is not published."""
        published = key in self._last_watched
        self._last_watched[key] = self._clock()
        if not published:
            for subscriber in self._subscribers:
                subscriber._add(key)

    def sweep(self, still_watched: Callable[[str], bool]) -> int:
        """Withdraw keys idle for ``linger`` seconds (``still_watched`` says whether a key has
        parked operations now; those stay). Returns how many were withdrawn."""
        now = self._clock()
        idle: list[str] = []
        for key, last in self._last_watched.items():
            if now - last < self._linger:
                continue
            if still_watched(key):
                self._last_watched[key] = now
            else:
                idle.append(key)
        for key in idle:
            del self._last_watched[key]
            for subscriber in self._subscribers:
                subscriber._remove(key)
        return len(idle)

    def subscribe(self) -> KeySubscription:
        """A new subscriber; its first changes are the reset with every published key."""
        subscription = KeySubscription()
        subscription._added.update(dict.fromkeys(self._last_watched))
        self._subscribers.add(subscription)
        return subscription

    def unsubscribe(self, subscription: KeySubscription) -> None:
        self._subscribers.discard(subscription)
