"""The handler's Prometheus metrics: Kafka requests by API and outcome, and purgatory waits;
and the per-request account of time parked in the purgatory that goes back to the frontend.

    kbroker_handler_requests_total{api,error_code}
                                             kafka.network:type=RequestMetrics,
                                             name=RequestsPerSec / ErrorsPerSec (as the API
                                             layer answers; the frontend counts on the wire)
    kbroker_handler_request_seconds{api}
                                             LocalTimeMs + RemoteTimeMs of the API layer
    kbroker_handler_purgatory_wait_seconds{kind}
                                             RemoteTimeMs, per wait
    kbroker_handler_group_writes_total{outcome}
                                             group state appends and lost conditional appends
    kbroker_handler_group_rebalances_total
                                             group-coordinator-metrics rebalance-count
    kbroker_handler_group_session_expiries_total
                                             group-coordinator-metrics (member expirations)
    kbroker_handler_transaction_writes_total{outcome}
                                             transaction state appends and lost conditional
                                             appends
    kbroker_handler_transactions_completed_total{result}
                                             transactions whose markers this handler wrote
                                             (commit, abort)
    kbroker_handler_client_telemetry_instances, _series, _dropped_points_total{reason}
                                             client-metrics instance-count; pushed client
                                             metrics kept and dropped (KIP-714)
    kbroker_client_*{client_instance_id,client_id,...}
                                             what clients pushed (see .client_metrics)
    kbroker_handler_transaction_timer_actions_total{action}
                                             transaction timers acted on: timeout (aborted,
                                             Kafka's abortTimedOutTransactions), takeover,
                                             expired (transactional.id.expiration.ms)

Remote time (Kafka's RemoteTimeMs: kafka.network:type=RequestMetrics,name=RemoteTimeMs) is the
part of a request spent waiting in the purgatory, not working. The handler measures it and
returns it to the frontend, which owns the request phases, as the trailing gRPC metadata
``kbroker-remote-ms`` (decimal milliseconds; absent when the request never parked):

    with remote_time(context):          # servicer: one account per RPC
        ...
        with parked():                  # API code: around each purgatory wait
            await purgatory.wait(...)

The account lives in a context variable, so the API modules need no extra parameter, and it is
a mutable object, so waits in tasks spawned from the request (which run on a copy of the
context) still add to it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from services.common.metrics import (
    LATENCY_BUCKETS,
    REMOTE_TIME_METADATA_KEY,
    Counter,
    LoopCounter,
    LoopHistogram,
    register_collector,
)

REQUESTS = LoopCounter(
    "kbroker_handler_requests_total",
    "Kafka requests handled, by API and error code (the top-level code, else the first"
    " per-item error, else 0): RequestsPerSec and ErrorsPerSec as the API layer answers.",
    ["api", "error_code"],
)
REQUEST_SECONDS = LoopHistogram(
    "kbroker_handler_request_seconds",
    "Time to handle a Kafka request, including purgatory waits (LocalTimeMs + RemoteTimeMs"
    " of the API layer).",
    ["api"],
    buckets=LATENCY_BUCKETS,
)
PURGATORY_WAITS = LoopCounter(
    "kbroker_handler_purgatory_waits_total",
    "Operations parked in the purgatory, by kind and outcome (completed, expired, unavailable,"
    " cancelled).",
    ["kind", "outcome"],
)
PURGATORY_WAIT_SECONDS = LoopHistogram(
    "kbroker_handler_purgatory_wait_seconds",
    "Time operations spent parked in the purgatory, per wait (RemoteTimeMs).",
    ["kind"],
    buckets=LATENCY_BUCKETS,
)


GROUP_WRITES = Counter(
    "kbroker_handler_group_writes_total",
    "Conditional appends of group state to __consumer_offsets, by outcome (appended; stale:"
    " computed on this handler's cached state, which another handler's append had made"
    " stale, computed again on the state read then; conflict: another handler appended first"
    " after the state was read, computed again).",
    ["outcome"],
)
GROUP_REBALANCES = Counter(
    "kbroker_handler_group_rebalances_total",
    "Join phases this handler ended, starting a new generation (Kafka's group-coordinator-"
    "metrics rebalance-count).",
)
GROUP_SESSION_EXPIRIES = Counter(
    "kbroker_handler_group_session_expiries_total",
    "Members' session timers that ran out, by what they meant (removed, keep_alive: waiting"
    " for a join phase, gone: no longer a member, rearmed: alive again by the time the"
    " expiry was handled).",
    ["outcome"],
)


TRANSACTION_WRITES = Counter(
    "kbroker_handler_transaction_writes_total",
    "Conditional appends of transaction state to __transaction_state, by outcome (appended,"
    " stale or conflict, as for kbroker_handler_group_writes_total).",
    ["outcome"],
)
TRANSACTIONS_COMPLETED = Counter(
    "kbroker_handler_transactions_completed_total",
    "Transactions this handler wrote every marker of and completed, by result (commit,"
    " abort).",
    ["result"],
)
TRANSACTION_TIMER_ACTIONS = Counter(
    "kbroker_handler_transaction_timer_actions_total",
    "Transaction timers this handler acted on, by what they meant (timeout: an Ongoing"
    " transaction fenced and aborted; takeover: a prepared transaction nobody finished;"
    " expired: an idle transactional id forgotten).",
    ["action"],
)


def record_request(api: str, error_code: int, seconds: float) -> None:
    """One handled request: counted by API and code, timed by API."""
    REQUESTS.labels(api, error_code).inc()
    REQUEST_SECONDS.labels(api).observe(seconds)


class RemoteTime:
    """Seconds one request spent parked, summed over its waits."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds = 0.0


_REMOTE_TIME: ContextVar[RemoteTime | None] = ContextVar("kbroker_remote_time", default=None)


@contextlib.contextmanager
def parked() -> Iterator[None]:
    """Count the time inside the block as the current request's remote time (a no-op outside
    :func:`remote_time`)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        add_remote_time(time.perf_counter() - started)


def add_remote_time(seconds: float) -> None:
    """Count ``seconds`` the request waited elsewhere (a leader holding an acks=all append's
    answer for its commit) as its remote time."""
    account = _REMOTE_TIME.get()
    if account is not None:
        account.seconds += seconds


@contextlib.contextmanager
def remote_time(context: Any) -> Iterator[RemoteTime]:
    """Open the remote-time account of one RPC; on the way out, put what was parked into the
    trailing metadata of ``context`` (a grpc.aio.ServicerContext)."""
    account = RemoteTime()
    token = _REMOTE_TIME.set(account)
    try:
        yield account
    finally:
        _REMOTE_TIME.reset(token)
        if account.seconds > 0:
            context.set_trailing_metadata(
                ((REMOTE_TIME_METADATA_KEY, f"{account.seconds * 1000:.3f}"),))


class ClientTelemetryCollector(Collector):
    """Client telemetry (KIP-714, :mod:`.client_metrics`) at scrape time: the metrics clients
    pushed to this handler (``kbroker_client_*``, and each client instance's last push), the
    client instances it knows (Kafka's client-metrics instance-count), the series it keeps and
    the points it dropped, by reason (series_limit, unsubscribed, unsupported_type,
    type_changed). Sources are :class:`~.client_metrics.ClientMetricsManager` objects, added
    while their handler runs (tests may run several in one process)."""

    def __init__(self) -> None:
        self.sources: set[Any] = set()

    def collect(self) -> Iterator[Metric]:
        instances = GaugeMetricFamily(
            "kbroker_handler_client_telemetry_instances",
            "Client instances this handler keeps telemetry state for (client-metrics "
            "instance-count).")
        series = GaugeMetricFamily(
            "kbroker_handler_client_telemetry_series",
            "Pushed client metric series this handler keeps.")
        dropped = CounterMetricFamily(
            "kbroker_handler_client_telemetry_dropped_points",
            "Pushed data points not kept, by reason (series_limit, unsubscribed, "
            "unsupported_type, type_changed).", labels=["reason"])
        pushed: dict[str, Metric] = {}
        count = kept = 0
        drops: dict[str, int] = {}
        for manager in list(self.sources):
            count += manager.instance_count
            kept += manager.store.series_count
            for reason, n in manager.store.dropped.items():
                drops[reason] = drops.get(reason, 0) + n
            for name, kind, help_text, samples in manager.families():
                family = pushed.setdefault(name, Metric(name, help_text, kind))
                suffix = "_total" if kind == "counter" else ""
                for labels, value in samples:
                    family.add_sample(name + suffix, labels, value)
        instances.add_metric([], count)
        series.add_metric([], kept)
        for reason, n in sorted(drops.items()):
            dropped.add_metric([reason], n)
        yield instances
        yield series
        yield dropped
        yield from pushed.values()

    def describe(self) -> list[Metric]:
        return []


CLIENT_TELEMETRY = ClientTelemetryCollector()
register_collector(CLIENT_TELEMETRY)
