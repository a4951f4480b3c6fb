"""The purgatory service's domain: one :class:`DelayedOperationPurgatory` per operation kind
(as Kafka keeps a produce, a fetch, a join and a heartbeat purgatory), one timer and one table of
key states shared by all of them.

A progress report on a key is stored first and then offered to every kind's watchers of that key,
so an operation parked after the report still sees it (it is checked against the stored states
when parked). Session timers (:mod:`.delayed_heartbeat`) are operations of the heartbeat kind
that nobody awaits; :attr:`Purgatories.heartbeats` arms them and publishes their expiries.
Keys that fetch and produce operations park on are published to progress reporters
(:attr:`Purgatories.watched`, see :mod:`.watched_keys`).
Not thread-safe (one event loop).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from kbroker.purgatory.v1 import purgatory_pb2

from . import metrics
from .delayed_await import DelayedAwait
from .delayed_fetch import DelayedFetch
from .delayed_heartbeat import DelayedHeartbeat, Heartbeats
from .delayed_operation_purgatory import DEFAULT_PURGE_INTERVAL, DelayedOperationPurgatory
from .delayed_produce import DelayedProduce
from .key_states import KeyStates
from .timer import SystemTimer
from .watched_keys import DEFAULT_LINGER_SECONDS, WatchedKeys

# Every kind of operation (the Await RPC's OperationKind), each with a purgatory of its own.
KINDS = ("fetch", "produce", "join", "heartbeat")
# The kinds whose keys progress reporters (log nodes, the replicator) report: partitions.
REPORTED_KINDS = (DelayedFetch.KIND, DelayedProduce.KIND)
# A fetch waiting on any key and a produce waiting on every key follow their Kafka rules; any
# other combination is a plain DelayedAwait.
_OPERATIONS: dict[tuple[str, bool], type[DelayedAwait]] = {
    (DelayedFetch.KIND, False): DelayedFetch, (DelayedProduce.KIND, True): DelayedProduce}


class Purgatories:
    """Parks, completes and expires :class:`DelayedAwait` operations of every kind."""

    def __init__(
        self,
        timer: SystemTimer,
        *,
        purge_interval: int = DEFAULT_PURGE_INTERVAL,
        watch_linger: float = DEFAULT_LINGER_SECONDS,
    ) -> None:
        self._timer = timer
        self.watched = WatchedKeys(watch_linger)
        self.states = KeyStates()
        self._by_kind: dict[str, DelayedOperationPurgatory[DelayedAwait]] = {
            kind: DelayedOperationPurgatory(
                kind, timer, purge_interval=purge_interval,
                on_key_watched=self.watched.watch if kind in REPORTED_KINDS else None)
            for kind in KINDS}
        # Session timers live in the heartbeat kind's purgatory, beside any Await of that kind.
        self.heartbeats = Heartbeats(
            self._by_kind[DelayedHeartbeat.KIND])  # type: ignore[arg-type]

    def park(
        self, *, kind: str, thresholds: Mapping[str, int], require_all: bool, timeout_ms: int
    ) -> DelayedAwait:
        """Create an operation and complete it at once if it can, else watch it. Await
        ``op.result`` for the answer; call :meth:`cancel` if the waiter goes away."""
        op = _OPERATIONS.get((kind, require_all), DelayedAwait)(
            kind=kind, thresholds=thresholds, require_all=require_all, timeout_ms=timeout_ms,
            states=self.states, listener=_record_outcome)
        self._by_kind[kind].try_complete_else_watch(op, op.thresholds)
        return op

    def report(self, reports: Iterable[tuple[str, int, int] | tuple[str, int, int, Sequence[int]]]
               ) -> int:
        """Store each (key, position, error_code[, ISR]) and complete the operations that now
        can; returns how many completed."""
        keys: dict[str, None] = {}
        for key, position, error_code, *isr in reports:
            self.states.report(key, position, error_code, tuple(isr[0]) if isr else ())
            keys[key] = None
        purgatories = tuple(self._by_kind.values())
        return sum(purgatory.check_and_complete(key)
                   for key in keys for purgatory in purgatories)

    def sweep_watched_keys(self) -> int:
        """Withdraw published keys that have had no operation for the linger time."""
        kinds = [self._by_kind[kind] for kind in REPORTED_KINDS]
        return self.watched.sweep(lambda key: any(p.watchers_of(key) for p in kinds))

    def cancel(self, op: DelayedAwait) -> bool:
        """Abandon ``op`` (its waiter went away); True if it was still pending."""
        if op.abandon():
            metrics.ABANDONED.labels(op.kind).inc()
            return True
        return False

    def purge_completed(self) -> int:
        """Purge completed operations from every kind's watcher lists now."""
        return sum(p.purge_completed() for p in self._by_kind.values())

    def describe(self) -> purgatory_pb2.DescribeResponse:
        """Pending operations per kind, and distinct keys with a watcher list over all kinds
        (see DelayedOperationPurgatory)."""
        keys = set().union(*(p.watched_keys() for p in self._by_kind.values()))
        return purgatory_pb2.DescribeResponse(
            pending_by_kind={kind: p.pending for kind, p in self._by_kind.items()},
            watched_keys=len(keys))

    def shutdown(self) -> None:
        """Abandon everything pending and stop the timer."""
        for purgatory in self._by_kind.values():
            purgatory.shutdown()
        self._timer.shutdown()


def _record_outcome(op: DelayedAwait, answer: purgatory_pb2.AwaitResponse) -> None:
    waited = time.monotonic() - op.started
    if answer.outcome == purgatory_pb2.OUTCOME_COMPLETED:
        metrics.COMPLETED.labels(op.kind).inc()
        outcome = "completed"
    else:
        metrics.EXPIRED.labels(op.kind).inc()
        metrics.EXPIRATION_LATENESS.labels(op.kind).observe(max(waited - op.delay_ms / 1000, 0.0))
        outcome = "expired"
    metrics.COMPLETION_DELAY.labels(op.kind, outcome).observe(waited)
