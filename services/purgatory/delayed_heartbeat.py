"""Session timers (Kafka's ``DelayedHeartbeat``), detached from any waiter.

Kafka's group coordinator parks one DelayedHeartbeat per member, keyed by the member, and
completes it whenever the member shows a sign of life (a heartbeat, a join, a sync, a commit),
parking the next one right after; if none comes within the session timeout it expires and the
coordinator removes the member. Here the coordinator is a set of stateless handlers, so nobody
waits on the operation: a handler *schedules* a key with a timeout, re-scheduling completes the
previous operation of the key (as satisfied) and parks a new one, and an expiry is *published*
to every subscriber (each handler), which decides what it means for the member.

Operations live in the purgatory of kind "heartbeat" (watched by their key, expired by the
shared timer), so the purgatory's metrics count them like every other kind: pending, completed
(re-armed or disarmed) and expired.

Subscribers are bounded queues: a subscriber that falls :data:`QUEUE_LIMIT` expirations behind
loses the newest ones (logged), never the purgatory's memory. Soft state: a restarted
purgatory has no timers, and each key is armed again by its next schedule.

Not thread-safe (one event loop).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping

from . import metrics
from .delayed_operation import DelayedOperation
from .delayed_operation_purgatory import DelayedOperationPurgatory

log = logging.getLogger(__name__)

KIND = "heartbeat"
QUEUE_LIMIT = 100_000


class DelayedHeartbeat(DelayedOperation):
    """One key's session timer: completed (satisfied) by the next schedule or a disarm,
    expired when ``timeout_ms`` passes first."""

    KIND = KIND

    def __init__(self, key: str, timeout_ms: int,
                 on_expired: Callable[[DelayedHeartbeat], None]) -> None:
        super().__init__(timeout_ms)
        self.kind = KIND
        self.key = key
        self.satisfied = False
        self._on_expired = on_expired

    def try_complete(self) -> bool:
        if self.satisfied:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        pass

    def on_expiration(self) -> None:
        self._on_expired(self)


class Subscription:
    """One subscriber's queue of expired keys."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[str] = asyncio.Queue(maxsize=QUEUE_LIMIT)
        self.dropped = 0

    def offer(self, key: str) -> None:
        try:
            self.queue.put_nowait(key)
        except asyncio.QueueFull:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("an expiration subscriber is %d behind; dropped %d expirations",
                            self.queue.qsize(), self.dropped)

    async def next_batch(self, limit: int = 1000) -> list[str]:
        """Wait for at least one expired key; return it with whatever else is queued."""
        keys = [await self.queue.get()]
        while len(keys) < limit and not self.queue.empty():
            keys.append(self.queue.get_nowait())
        return keys


class Heartbeats:
    """Session timers by key, over the heartbeat-kind purgatory."""

    def __init__(self, purgatory: DelayedOperationPurgatory[DelayedHeartbeat]) -> None:
        self._purgatory = purgatory
        self._timers: dict[str, DelayedHeartbeat] = {}
        self._subscribers: set[Subscription] = set()

    def __len__(self) -> int:
        return len(self._timers)

    def schedule(self, deadlines: Mapping[str, int]) -> int:
        """Arm each key for its timeout (ms), re-arming a running timer; returns how many were
        re-armed."""
        rearmed = 0
        for key, timeout_ms in deadlines.items():
            if self._satisfy(key):
                rearmed += 1
            op = DelayedHeartbeat(key, timeout_ms, self._expired)
            self._timers[key] = op
            op.add_done_callback(self._forget)
            self._purgatory.try_complete_else_watch(op, (key,))
        return rearmed

    def unschedule(self, keys: Iterable[str]) -> int:
        """Disarm keys; returns how many had a timer running."""
        return sum(1 for key in keys if self._satisfy(key))

    def armed(self, keys: Iterable[str]) -> list[str]:
        """The keys (in order) that have a timer running."""
        timers = self._timers
        return [key for key in keys if key in timers and not timers[key].is_completed]

    def _satisfy(self, key: str) -> bool:
        current = self._timers.get(key)
        if current is None or current.is_completed:
            return False
        current.satisfied = True
        self._purgatory.check_and_complete(key)
        metrics.COMPLETED.labels(KIND).inc()
        return True

    def _forget(self, op: DelayedOperation) -> None:
        assert isinstance(op, DelayedHeartbeat)
        if self._timers.get(op.key) is op:
            del self._timers[op.key]

    def _expired(self, op: DelayedHeartbeat) -> None:
        metrics.EXPIRED.labels(KIND).inc()
        for subscription in self._subscribers:
            subscription.offer(op.key)

    def subscribe(self) -> Subscription:
        subscription = Subscription()
        self._subscribers.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        self._subscribers.discard(subscription)
