"""The log node's Prometheus metrics (seconds and bytes), registered in the process registry
that services.common serves over HTTP and gRPC."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics import LATENCY_BUCKETS

APPENDED_BYTES = Counter(
    "kbroker_log_appended_bytes_total", "Bytes of record batches appended.", ["topic"]
)
APPENDED_BATCHES = Counter(
    "kbroker_log_appended_batches_total", "Record batches appended.", ["topic"]
)
APPEND_REQUESTS = Counter(
    "kbroker_log_append_requests_total", "Partition appends attempted (one per partition of an "
    "Append call).", ["topic"]
)
READ_BYTES = Counter("kbroker_log_read_bytes_total", "Bytes of record batches read.", ["topic"])
APPEND_SECONDS = Histogram(
    "kbroker_log_append_seconds", "Time to validate and append one partition's batches.",
    buckets=LATENCY_BUCKETS,
)
READ_SECONDS = Histogram(
    "kbroker_log_read_seconds", "Time to serve one Read call.", buckets=LATENCY_BUCKETS
)
PARTITIONS = Gauge("kbroker_log_partitions", "Partition replicas held by this node.")
ERRORS = Counter(
    "kbroker_log_errors_total", "Partition-level Kafka errors returned, by API and error name.",
    ["api", "error"],
)
TRUNCATED_BYTES = Counter(
    "kbroker_log_recovery_truncated_bytes_total",
    "Bytes of torn or corrupt log tails removed during recovery at start-up.",
)
PURGATORY_NOTIFICATIONS = Counter(
    "kbroker_log_purgatory_notifications_total",
    "CheckAndComplete calls sent to the purgatory, by outcome.", ["outcome"],
)
