"""The frontend's Prometheus metrics: Kafka's RequestMetrics per API (request count, total time
from frame read to response written, the phases in between, bytes in and out), open
connections, error answers and retries. Times in seconds, sizes in bytes.

The closest of Kafka's JMX names (kafka.network:type=RequestMetrics,request=<api>). The split
differs: "local" here is the frontend's own work and "remote" the whole handler call, which
covers Kafka's LocalTimeMs (API logic) and RemoteTimeMs (purgatory) together; RequestBytes is a
size histogram in Kafka, a byte counter here:

    kbroker_frontend_requests_total{api}                          name=RequestsPerSec
    kbroker_frontend_request_total_seconds{api}                   name=TotalTimeMs
    kbroker_frontend_request_phase_seconds{api,phase="local"}     name=LocalTimeMs
    kbroker_frontend_request_phase_seconds{api,phase="remote"}    name=RemoteTimeMs
    kbroker_frontend_request_phase_seconds{api,phase="response_send"}  name=ResponseSendTimeMs
    kbroker_frontend_request_bytes_total{api}                     name=RequestBytes
    kbroker_frontend_error_responses_total{api,error_code}        name=ErrorsPerSec

The Spark report (spark/jobs/latency_report.py) reads these families by name."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics import LATENCY_BUCKETS

REQUESTS = Counter(
    "kbroker_frontend_requests_total", "Kafka requests received, by API.", ["api"])
REQUEST_TOTAL_SECONDS = Histogram(
    "kbroker_frontend_request_total_seconds",
    "Time from a request's frame read to its response written, by API.", ["api"],
    buckets=LATENCY_BUCKETS)
REQUEST_PHASE_SECONDS = Histogram(
    "kbroker_frontend_request_phase_seconds",
    "Time per request phase, by API: local (decode and conversion in the frontend), remote "
    "(the handler call, purgatory waits included) and response_send (writing to the socket).",
    ["api", "phase"], buckets=LATENCY_BUCKETS)
REQUEST_BYTES = Counter(
    "kbroker_frontend_request_bytes_total", "Request bytes received (frames), by API.", ["api"])
RESPONSE_BYTES = Counter(
    "kbroker_frontend_response_bytes_total", "Response bytes sent (frames), by API.", ["api"])
OPEN_CONNECTIONS = Gauge(
    "kbroker_frontend_open_connections", "Kafka client connections open.")
CLOSED_CONNECTIONS = Counter(
    "kbroker_frontend_connections_closed_total",
    "Connections closed by the frontend, by reason (malformed request, handler unavailable).",
    ["reason"])
ERROR_RESPONSES = Counter(
    "kbroker_frontend_error_responses_total",
    "Responses with a non-zero top-level error code, or built by the frontend because no "
    "handler answered, by API and code.", ["api", "error_code"])
HANDLER_FAILURES = Counter(
    "kbroker_frontend_handler_failures_total",
    "Requests no handler answered, by API and gRPC status.", ["api", "status"])


class ApiMetrics:
    """The per-API children, bound once so a request pays no label lookups."""

    __slots__ = (
        "api",
        "local",
        "remote",
        "request_bytes",
        "requests",
        "response_bytes",
        "send",
        "total",
    )

    def __init__(self, api: str) -> None:
        self.api = api
        self.requests = REQUESTS.labels(api)
        self.total = REQUEST_TOTAL_SECONDS.labels(api)
        self.local = REQUEST_PHASE_SECONDS.labels(api, "local")
        self.remote = REQUEST_PHASE_SECONDS.labels(api, "remote")
        self.send = REQUEST_PHASE_SECONDS.labels(api, "response_send")
        self.request_bytes = REQUEST_BYTES.labels(api)
        self.response_bytes = RESPONSE_BYTES.labels(api)

    def error(self, code: int) -> None:
        ERROR_RESPONSES.labels(self.api, str(code)).inc()
