"""Prometheus metrics of the purgatory service (times in seconds).

Kafka's JMX names beside ours (delayedOperation = Produce, Fetch, ...):

    kbroker_purgatory_pending_operations{kind}   kafka.server:type=DelayedOperationPurgatory,
                                                 name=NumDelayedOperations,delayedOperation=..
    kbroker_purgatory_watched_keys{kind}         (keys with watchers; Kafka's PurgatorySize
                                                 counts watcher entries, not keys)
    kbroker_purgatory_expired_total{kind}        kafka.server:type=DelayedFetchMetrics /
                                                 DelayedProduceMetrics, name=ExpiresPerSec
    kbroker_purgatory_completed_total{kind}      (no Kafka meter: completions by condition)
"""

from __future__ import annotations

from services.common.metrics import LATENCY_BUCKETS, Counter, Gauge, Histogram

PENDING = Gauge(
    "kbroker_purgatory_pending_operations",
    "Operations parked and not yet answered (NumDelayedOperations).", ["kind"]
)
WATCHED_KEYS = Gauge(
    "kbroker_purgatory_watched_keys",
    "Keys with a watcher list (parked operations, or completed ones awaiting the purge); "
    "Kafka's PurgatorySize counts watcher entries instead.",
    ["kind"],
)
COMPLETED = Counter(
    "kbroker_purgatory_completed_total", "Operations completed by their condition.", ["kind"]
)
EXPIRED = Counter(
    "kbroker_purgatory_expired_total", "Operations completed by their timeout (ExpiresPerSec).",
    ["kind"]
)
ABANDONED = Counter(
    "kbroker_purgatory_abandoned_total", "Operations dropped because the waiter went away.",
    ["kind"],
)
COMPLETION_DELAY = Histogram(
    "kbroker_purgatory_completion_delay_seconds",
    "Time from parking an operation to answering it.",
    ["kind", "outcome"],
    buckets=LATENCY_BUCKETS,
)
EXPIRATION_LATENESS = Histogram(
    "kbroker_purgatory_expiration_lateness_seconds",
    "How long after its timeout an expired operation was answered (timer and loop delay).",
    ["kind"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
PURGED = Counter(
    "kbroker_purgatory_purged_total",
    "Entries of completed operations dropped from watcher lists by the periodic purge.",
    ["kind"],
)
