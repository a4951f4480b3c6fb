"""The frontend's Prometheus metrics: Kafka's RequestMetrics per API (requests, the time of
each request phase, bytes in and out), per-topic bytes (BrokerTopicMetrics), open connections
and error codes in responses. Times in seconds, sizes in bytes.

A request's clock, on its connection (:mod:`.connection`)::

    received  the frame's last byte arrived (the connection buffers what the socket delivers)
    started   the connection takes the frame up (decode starts)
    ready     the answer is encoded
    sending   writing the answer starts
    done      the answer is written (drained into the socket)

and the phases, which add up to the total, each next to its Kafka JMX name
(kafka.network:type=RequestMetrics,name=<name>,request=<api>):

    phase="request_queue"   started - received        RequestQueueTimeMs
        a pipelined request waits here for the ones before it on its connection (requests
        on a connection are served strictly in order), and any request waits for the event
        loop to get to its connection
    phase="local"           ready - started - remote  LocalTimeMs
        decoding and converting in the frontend, the handler call (network hop, API logic,
        log node calls) less its purgatory waits, encoding the answer
    phase="remote"          remote                    RemoteTimeMs
        time the request was parked in the purgatory (a long-poll Fetch waiting for data;
        an acks=all Produce waiting for replication), as the handler reports it in the
        trailing gRPC metadata kbroker-remote-ms
    phase="response_queue"  sending - ready           ResponseQueueTimeMs
        the encoded answer waiting to be written; a connection writes its answer as soon as
        it is encoded, so this stays near zero by design (it is the part that would grow
        with a separate writer)
    phase="response_send"   done - sending            ResponseSendTimeMs
    kbroker_frontend_request_total_seconds  done - received  TotalTimeMs

A Produce with acks=0 has no answer: its response phases are 0. Each family's help names its
Kafka equivalent where there is one; bytes are counted per topic as Kafka's BrokerTopicMetrics
(produced records that were appended, records in Fetch answers) and per API as counters where
Kafka keeps a size histogram (RequestBytes).

The Spark report (spark/jobs/latency_report.py) reads these families by name."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from google.protobuf.message import Message
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from services.common.metrics import (
    LATENCY_BUCKETS,
    METRICS_ENABLED,
    Gauge,
    LoopCounter,
    LoopHistogram,
    register_collector,
)

PHASES = ("request_queue", "local", "remote", "response_queue", "response_send")

REQUESTS = LoopCounter(
    "kbroker_frontend_requests_total", "Kafka requests received, by API (RequestsPerSec).",
    ["api"])
REQUEST_TOTAL_SECONDS = LoopHistogram(
    "kbroker_frontend_request_total_seconds",
    "Time from a request's frame read to its response written, by API (TotalTimeMs).",
    ["api"], buckets=LATENCY_BUCKETS)
REQUEST_PHASE_SECONDS = LoopHistogram(
    "kbroker_frontend_request_phase_seconds",
    "Time per request phase, by API: request_queue (RequestQueueTimeMs: frame read until "
    "taken up), local (LocalTimeMs: frontend and handler work), remote (RemoteTimeMs: parked "
    "in the purgatory), response_queue (ResponseQueueTimeMs: encoded until writing starts), "
    "response_send (ResponseSendTimeMs: writing to the socket).",
    ["api", "phase"], buckets=LATENCY_BUCKETS)
REQUEST_BYTES = LoopCounter(
    "kbroker_frontend_request_bytes_total",
    "Request bytes received (frames), by API (RequestBytes).", ["api"])
RESPONSE_BYTES = LoopCounter(
    "kbroker_frontend_response_bytes_total", "Response bytes sent (frames), by API.", ["api"])
TOPIC_BYTES_IN = LoopCounter(
    "kbroker_frontend_topic_produced_bytes_total",
    "Record bytes produced and appended, by topic (BrokerTopicMetrics BytesInPerSec).",
    ["topic"])
TOPIC_BYTES_OUT = LoopCounter(
    "kbroker_frontend_topic_fetched_bytes_total",
    "Record bytes sent in Fetch responses, by topic (BrokerTopicMetrics BytesOutPerSec).",
    ["topic"])
OPEN_CONNECTIONS = Gauge(
    "kbroker_frontend_open_connections",
    "Kafka client connections open (socket-server-metrics connection-count).")
CLOSED_CONNECTIONS = LoopCounter(
    "kbroker_frontend_connections_closed_total",
    "Connections closed by the frontend, by reason (malformed request, handler unavailable).",
    ["reason"])
# Kafka's ErrorsPerSec counts each occurrence, NONE included; here a response counts once per
# distinct non-zero code anywhere in it (top-level, per topic, per partition).
ERROR_RESPONSES = LoopCounter(
    "kbroker_frontend_error_responses_total",
    "Responses carrying a non-zero error code (top-level or for any topic or partition), "
    "by API and code, once per distinct code in a response (ErrorsPerSec). Includes the "
    "answers the frontend builds when no handler answered.", ["api", "error_code"])
HANDLER_FAILURES = LoopCounter(
    "kbroker_frontend_handler_failures_total",
    "Requests no handler answered, by API and gRPC status.", ["api", "status"])
PRODUCE_RESENDS = LoopCounter(
    "kbroker_frontend_produce_resends_total",
    "Idempotent Produce requests sent again to another handler after one failed "
    "mid-request, by outcome: answered (stored on every partition), or closed (the resend "
    "failed, on a partition or as a whole, so the connection closed).", ["outcome"])

FILE_RECORDS_BYTES = LoopCounter(
    "kbroker_frontend_file_records_bytes_total",
    "Record batch bytes of Fetch answers the frontend read from log segment files on its own "
    "host rather than receiving them through a handler.")
FILE_RECORDS_UNREADABLE = LoopCounter(
    "kbroker_frontend_file_records_unreadable_total",
    "Fetch answers whose segment file ranges could no longer be read as named (the segment "
    "deleted, replaced or truncated meanwhile, or the file not visible here), asked for again "
    "with the record batches carried.")
SENDFILE_BYTES = LoopCounter(
    "kbroker_frontend_sendfile_bytes_total",
    "Record batch bytes of Fetch answers handed from segment files to client sockets with "
    "sendfile, never copied through the frontend (plain TCP connections; a TLS connection's "
    "are read and written).")
SPOOLED_BYTES = LoopCounter(
    "kbroker_frontend_records_spool_bytes_total",
    "Record batch bytes of Produce requests the frontend wrote to spool files for the leader "
    "log nodes on its host to read, rather than sending them through a handler.")
SPOOL_DECLINED = LoopCounter(
    "kbroker_frontend_records_spool_declined_total",
    "Produce requests whose spooled batches their handler could not read (it runs on another "
    "host), sent again with the batches carried.")

# Client quotas (:mod:`.quotas`), by quota type (produce, fetch, request): Kafka keeps these per
# user and client id; here they are summed over clients to keep the label set small.
QUOTA_THROTTLE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
QUOTA_THROTTLE_SECONDS = LoopHistogram(
    "kbroker_frontend_quota_throttle_seconds",
    "Throttle time of throttled responses (the connection is muted that long after the "
    "answer), by the quota type that decided it (throttle-time per user/client-id).",
    ["quota_type"], buckets=QUOTA_THROTTLE_BUCKETS)
QUOTA_BYTES = LoopCounter(
    "kbroker_frontend_quota_bytes_total",
    "Bytes counted against client byte-rate quotas, by quota type: produce (request bytes), "
    "fetch (response bytes sent); its rate is the byte-rate of quota-bound clients.",
    ["quota_type"])


class ApiMetrics:
    """The per-API children, bound once so a request pays no label lookups."""

    __slots__ = ("api", "local", "remote", "request_bytes", "request_queue", "requests",
                 "response_bytes", "response_queue", "send", "total")

    def __init__(self, api: str) -> None:
        self.api = api
        self.requests = REQUESTS.labels(api)
        self.total = REQUEST_TOTAL_SECONDS.labels(api)
        self.request_queue = REQUEST_PHASE_SECONDS.labels(api, "request_queue")
        self.local = REQUEST_PHASE_SECONDS.labels(api, "local")
        self.remote = REQUEST_PHASE_SECONDS.labels(api, "remote")
        self.response_queue = REQUEST_PHASE_SECONDS.labels(api, "response_queue")
        self.send = REQUEST_PHASE_SECONDS.labels(api, "response_send")
        self.request_bytes = REQUEST_BYTES.labels(api)
        self.response_bytes = RESPONSE_BYTES.labels(api)

    def observe(self, request_bytes: int, response_bytes: int, received: float, started: float,
                remote: float, ready: float, sending: float, done: float) -> None:
        """One request's counts and phases, from its clock (see the module docstring)."""
        self.requests.inc()
        self.request_bytes.inc(request_bytes)
        if response_bytes:
            self.response_bytes.inc(response_bytes)
        self.total.observe(done - received)
        self.request_queue.observe(max(started - received, 0.0))
        self.local.observe(max(ready - started - remote, 0.0))
        self.remote.observe(remote)
        self.response_queue.observe(sending - ready)
        self.send.observe(done - sending)

    def errors(self, codes: Iterable[int]) -> None:
        for code in codes:
            ERROR_RESPONSES.labels(self.api, str(code)).inc()


def produce_outcome(body: Any, response: Message) -> set[int]:
    """Count BytesIn for a Produce and return the response's error codes. ``body`` is the
    decoded (kio) request: its records are the frame's bytes, so sizes cost nothing, where
    the protobuf request would copy every batch to measure it."""
    codes: set[int] = set()
    failed: set[tuple[str, int]] = set()
    for topic in response.responses:  # type: ignore[attr-defined]
        for p in topic.partition_responses:
            code = p.error_code
            if code:
                codes.add(code)
                failed.add((topic.name, p.index))
    if not METRICS_ENABLED:
        return codes
    for data in body.topic_data:
        size = 0
        for p in data.partition_data:
            if p.records and (not failed or (data.name, p.index) not in failed):
                size += len(p.records)
        if size:
            TOPIC_BYTES_IN.labels(data.name).inc(size)
    return codes


def count_fetched_bytes(response: Message, entity: Any) -> None:
    """Count BytesOut for a Fetch answer. ``entity`` is the answer converted for the client's
    version (records as bytes, measured for free); topic names come from the protobuf answer,
    where the handler sets them even for clients that name topics by id."""
    for proto_topic, topic in zip(response.responses, entity.responses,  # type: ignore[attr-defined]
                                  strict=True):
        size = 0
        for p in topic.partitions:
            if p.records:
                size += len(p.records)
        if size and proto_topic.topic:
            TOPIC_BYTES_OUT.labels(proto_topic.topic).inc(size)

# Authentication (Kafka's socket-server-metrics of the same names, per listener). The
# mechanism is the SASL mechanism, or the listener's protocol for PLAINTEXT and SSL.
SUCCESSFUL_AUTHENTICATIONS = LoopCounter(
    "kbroker_frontend_successful_authentication_total",
    "Connections that authenticated, by listener and mechanism "
    "(successful-authentication-total).", ["listener", "mechanism"])
FAILED_AUTHENTICATIONS = LoopCounter(
    "kbroker_frontend_failed_authentication_total",
    "Connections whose authentication failed (wrong credentials, unsupported mechanism, a "
    "request out of turn, no valid certificate principal, timed out), by listener and "
    "mechanism (failed-authentication-total).", ["listener", "mechanism"])
SUCCESSFUL_REAUTHENTICATIONS = LoopCounter(
    "kbroker_frontend_successful_reauthentication_total",
    "SASL re-authentications (KIP-368) that succeeded, by listener and mechanism "
    "(successful-reauthentication-total).", ["listener", "mechanism"])
FAILED_REAUTHENTICATIONS = LoopCounter(
    "kbroker_frontend_failed_reauthentication_total",
    "SASL re-authentications that failed, by listener and mechanism "
    "(failed-reauthentication-total).", ["listener", "mechanism"])
EXPIRED_CONNECTIONS_KILLED = LoopCounter(
    "kbroker_frontend_expired_connections_killed_total",
    "Connections closed because their SASL session expired without re-authentication, by "
    "listener (expired-connections-killed-count).", ["listener"])


class MemoryPoolCollector(Collector):
    """The request memory pool's gauges (Kafka's socket-server-metrics MemoryPoolAvailable,
    MemoryPoolUsed and MemoryPoolDepletedTimeTotal), read at scrape time from the pools of the
    frontends running in this process (one in a service process; tests may run several)."""

    def __init__(self) -> None:
        self.pools: weakref.WeakSet[Any] = weakref.WeakSet()

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        pools = list(self.pools)
        bounded = [p for p in pools if p.bounded]
        yield GaugeMetricFamily(
            "kbroker_frontend_memory_pool_used_bytes",
            "Bytes of requests held: received, being received or being processed "
            "(MemoryPoolUsed).", value=sum(p.used for p in pools))
        yield GaugeMetricFamily(
            "kbroker_frontend_memory_pool_available_bytes",
            "Bytes left before connections stop being read (MemoryPoolAvailable; absent "
            "without queued.max.request.bytes).", value=sum(max(p.available, 0)
                                                            for p in bounded))
        yield GaugeMetricFamily(
            "kbroker_frontend_memory_pool_waiting_connections",
            "Connections not read because the request memory pool is used up.",
            value=sum(p.waiting for p in pools))
        yield CounterMetricFamily(
            "kbroker_frontend_memory_pool_depleted_seconds",
            "Time the request memory pool was used up (MemoryPoolDepletedTimeTotal).",
            value=sum(p.depleted_seconds() for p in bounded))

    def describe(self) -> list[GaugeMetricFamily]:
        return []


class FetchSessionCollector(Collector):
    """The fetch session cache's gauges (Kafka's FetchSessionCache NumIncrementalFetchSessions,
    NumIncrementalFetchPartitionsCached and IncrementalFetchSessionEvictionsPerSec)."""

    def __init__(self) -> None:
        self.caches: weakref.WeakSet[Any] = weakref.WeakSet()

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        caches = list(self.caches)
        yield GaugeMetricFamily(
            "kbroker_frontend_fetch_sessions",
            "Incremental fetch sessions held (NumIncrementalFetchSessions).",
            value=sum(len(c) for c in caches))
        yield GaugeMetricFamily(
            "kbroker_frontend_fetch_session_partitions",
            "Partitions in the fetch sessions held (NumIncrementalFetchPartitionsCached).",
            value=sum(c.partitions_cached for c in caches))
        yield CounterMetricFamily(
            "kbroker_frontend_fetch_session_evictions",
            "Fetch sessions evicted for new ones (IncrementalFetchSessionEvictionsPerSec).",
            value=sum(c.evictions for c in caches))

    def describe(self) -> list[GaugeMetricFamily]:
        return []


FETCH_SESSIONS = FetchSessionCollector()
register_collector(FETCH_SESSIONS)


def register_fetch_sessions(cache: Any) -> None:
    FETCH_SESSIONS.caches.add(cache)


MEMORY_POOLS = MemoryPoolCollector()
register_collector(MEMORY_POOLS)


def register_memory_pool(pool: Any) -> None:
    MEMORY_POOLS.pools.add(pool)
