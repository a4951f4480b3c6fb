"""The handler's Prometheus metrics: Kafka requests by API and outcome, and purgatory waits."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from services.common.metrics import LATENCY_BUCKETS

REQUESTS = Counter(
    "handler_requests_total",
    "Kafka requests handled, by API and error code (the top-level code, else the first"
    " per-item error, else 0).",
    ["api", "error_code"],
)
REQUEST_SECONDS = Histogram(
    "handler_request_seconds",
    "Time to handle a Kafka request, including purgatory waits.",
    ["api"],
    buckets=LATENCY_BUCKETS,
)
PURGATORY_WAITS = Counter(
    "handler_purgatory_waits_total",
    "Operations parked in the purgatory, by kind and outcome (completed, expired, unavailable,"
    " cancelled).",
    ["kind", "outcome"],
)
PURGATORY_WAIT_SECONDS = Histogram(
    "handler_purgatory_wait_seconds",
    "Time operations spent parked in the purgatory.",
    ["kind"],
    buckets=LATENCY_BUCKETS,
)
