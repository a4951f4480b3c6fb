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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from . import metrics
from .delayed_await import AwaitResult, DelayedAwait, Outcome
from .delayed_fetch import DelayedFetch
from .delayed_heartbeat import DelayedHeartbeat, Heartbeats
from .delayed_operation_purgatory import DEFAULT_PURGE_INTERVAL, DelayedOperationPurgatory
from .delayed_produce import DelayedProduce
from .key_states import KeyStates
from .timer import Timer
from .watched_keys import DEFAULT_LINGER_SECONDS, WatchedKeys

# The kinds Describe always lists, even with nothing pending.
KINDS = ("fetch", "produce", "join", "heartbeat")
# The kinds whose keys progress reporters (log nodes, the replicator) report: partitions.
REPORTED_KINDS = (DelayedFetch.KIND, DelayedProduce.KIND)


@dataclass(frozen=True, slots=True, kw_only=True)
class Description:
    pending_by_kind: dict[str, int]
    # Distinct keys with a watcher list, over all kinds (see DelayedOperationPurgatory).
    watched_keys: int


class Purgatories:
    """Parks, completes and expires :class:`DelayedAwait` operations of every kind."""

    def __init__(
        self,
        timer: Timer,
        states: KeyStates | None = None,
        *,
        purge_interval: int = DEFAULT_PURGE_INTERVAL,
        watch_linger: float = DEFAULT_LINGER_SECONDS,
    ) -> None:
        self._timer = timer
        self.watched = WatchedKeys(watch_linger)
        self._purge_interval = purge_interval
        self._states = states if states is not None else KeyStates()
        self._by_kind: dict[str, DelayedOperationPurgatory[DelayedAwait]] = {}
        for kind in KINDS:
            self._purgatory(kind)
        # Session timers live in the heartbeat kind's purgatory, beside any Await of that kind.
        self.heartbeats = Heartbeats(
            self._purgatory(DelayedHeartbeat.KIND))  # type: ignore[arg-type]

    def _purgatory(self, kind: str) -> DelayedOperationPurgatory[DelayedAwait]:
        purgatory = self._by_kind.get(kind)
        if purgatory is None:
            purgatory = DelayedOperationPurgatory(
                kind, self._timer, on_watched_keys_changed=metrics.WATCHED_KEYS.labels(kind).set,
                purge_interval=self._purge_interval, on_purge=metrics.PURGED.labels(kind).inc,
                on_key_watched=self.watched.watch if kind in REPORTED_KINDS else None,
            )
            self._by_kind[kind] = purgatory
        return purgatory

    @property
    def states(self) -> KeyStates:
        return self._states

    def park(
        self, *, kind: str, thresholds: Mapping[str, int], require_all: bool, timeout_ms: int
    ) -> DelayedAwait:
        """Create an operation and complete it at once if it can, else watch it. Await
        ``op.result`` for the answer; call :meth:`cancel` if the waiter goes away.

        A fetch waiting on any key is a :class:`DelayedFetch`, a produce waiting on every key a
        :class:`DelayedProduce`; any other combination is a plain :class:`DelayedAwait`."""
        op: DelayedAwait
        if kind == DelayedFetch.KIND and not require_all:
            op = DelayedFetch(thresholds=thresholds, max_wait_ms=timeout_ms,
                              states=self._states, listener=_record_outcome)
        elif kind == DelayedProduce.KIND and require_all:
            op = DelayedProduce(thresholds=thresholds, timeout_ms=timeout_ms,
                                states=self._states, listener=_record_outcome)
        else:
            op = DelayedAwait(kind=kind, thresholds=thresholds, require_all=require_all,
                              timeout_ms=timeout_ms, states=self._states,
                              listener=_record_outcome)
        if not self._purgatory(kind).try_complete_else_watch(op, op.thresholds):
            pending = metrics.PENDING.labels(kind)
            pending.inc()
            op.add_done_callback(lambda _op: pending.dec())
        return op

    def report(self, reports: Iterable[tuple[str, int, int]]) -> int:
        """Store each (key, position, error_code) and complete the operations that now can;
        returns how many completed."""
        keys: dict[str, None] = {}
        for key, position, error_code in reports:
            self._states.report(key, position, error_code)
            keys[key] = None
        completed = 0
        purgatories = tuple(self._by_kind.values())
        for key in keys:
            for purgatory in purgatories:
                completed += purgatory.check_and_complete(key)
        return completed

    def sweep_watched_keys(self) -> int:
        """Withdraw published keys that have had no operation for the linger time."""
        kinds = [self._by_kind[kind] for kind in REPORTED_KINDS]
        return self.watched.sweep(lambda key: any(p.watchers_of(key) for p in kinds))

    def cancel(self, op: DelayedAwait) -> bool:
        """Abandon ``op`` (its waiter went away); True if it was still pending."""
        if self._purgatory(op.kind).cancel(op):
            metrics.ABANDONED.labels(op.kind).inc()
            return True
        return False

    def purge_completed(self) -> int:
        """Purge completed operations from every kind's watcher lists now."""
        return sum(p.purge_completed() for p in self._by_kind.values())

    def describe(self) -> Description:
        pending = {kind: p.pending for kind, p in self._by_kind.items()}
        watched = [p.watched_keys() for p in self._by_kind.values() if p.watched_keys()]
        if len(watched) <= 1:
            count = len(watched[0]) if watched else 0
        else:
            count = len(set().union(*watched))
        return Description(pending_by_kind=pending, watched_keys=count)

    def shutdown(self) -> None:
        """Abandon everything pending and stop the timer."""
        for purgatory in self._by_kind.values():
            purgatory.shutdown()
        self._timer.shutdown()


def _record_outcome(op: DelayedAwait, result: AwaitResult) -> None:
    if result.outcome is Outcome.COMPLETED:
        metrics.COMPLETED.labels(op.kind).inc()
    else:
        metrics.EXPIRED.labels(op.kind).inc()
        metrics.EXPIRATION_LATENESS.labels(op.kind).observe(
            max(result.waited - op.delay_ms / 1000, 0.0))
    metrics.COMPLETION_DELAY.labels(op.kind, result.outcome.value).observe(result.waited)
