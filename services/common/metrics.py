"""Metrics, in one place: the process's Prometheus registry, its HTTP exposition, the gRPC
``Metrics`` service over the same registry (``Snapshot`` and ``Stream``, see
``proto/kbroker/metrics/v1/metrics.proto``; a reader picks families by prefix or name and may
leave out empty series), and gRPC server metrics in the usual names under the project's prefix
(kbroker_grpc_server_started_total, kbroker_grpc_server_handled_total,
kbroker_grpc_server_handling_seconds).

Naming, for every service (tests/e2e/test_metric_names.py checks it on a live cluster): every
family starts with ``kbroker_<service>_`` (``kbroker_grpc_server_`` here); the unit comes last
(``_seconds``, ``_bytes``), then ``_total`` for counters; no ``_created`` series; help texts
name the Kafka JMX equivalent where there is one. Samples carry no ``job``, ``instance`` or
``service`` labels: Prometheus attaches those to the scrape target, and gRPC snapshots carry
``service`` (frontend, handler, log, purgatory, replicator) and ``instance`` (``<service>-<n>``
locally, the pod name on Kubernetes).

Every snapshot carries a cursor: this process's random id (drawn at import, i.e. at process
start) and a sequence number shared by all snapshots the process takes, so a reader can tell a
restart (counters back at zero) from a gap.

Per-request metrics are :data:`LoopCounter` / :data:`LoopHistogram`: the same exposition as
prometheus_client's, without its per-call locking, for code on the event loop only.

``KBROKER_METRICS_ENABLED=false`` switches recording off for the whole process (to measure
what metrics cost): :data:`Counter`, :data:`Gauge` and :data:`Histogram` are then stand-ins
whose calls do nothing, custom collectors are not registered, gRPC calls are not intercepted,
and the exposition serves only what is still registered (process and platform collectors).
Service metrics modules take their metric classes from here, never from prometheus_client.
"""

from __future__ import annotations

import asyncio
import bisect
import inspect
import itertools
import math
import os
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import grpc
import prometheus_client
from prometheus_client import REGISTRY, start_http_server
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from kbroker.metrics.v1 import metrics_pb2, metrics_pb2_grpc

METRICS_ENABLED = os.environ.get("KBROKER_METRICS_ENABLED", "true").strip().lower() not in (
    "0", "false", "no", "off")

# No `<name>_created` series: the event-loop counters and the collectors have none, so
# prometheus_client's counters and histograms go without theirs too (one rule for every family;
# a restart shows as counters back at zero, and gRPC snapshots carry the process start).
prometheus_client.disable_created_metrics()


class NullMetric:
    """A Counter, Gauge or Histogram (with or without labels) that records nothing: what the
    metric classes are when metrics are switched off."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def labels(self, *args: Any, **kwargs: Any) -> NullMetric:
        return self

    def _record_nothing(self, *args: Any) -> None:
        pass

    inc = dec = set = observe = set_function = remove = clear = _record_nothing


class _LoopCounterValue:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class _LoopHistogramValue:
    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        # The first bucket whose upper bound is >= amount (le), as Prometheus counts.
        self.counts[bisect.bisect_left(self._bounds, amount)] += 1
        self.sum += amount


class _LoopMetric(Collector):
    """Common part of :class:`LoopCounter` and :class:`LoopHistogram`: labelled children in a
    dict, registered as a collector."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (),
                 registry: Any = REGISTRY) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], Any] = {}
        # The same children by the label values as callers give them (not always strings).
        self._by_values: dict[tuple[Any, ...], Any] = {}
        if not self._labelnames:
            self._children[()] = self._by_values[()] = self._new_child()
        if registry is not None:
            registry.register(self)

    def _new_child(self) -> Any:
        raise NotImplementedError

    def labels(self, *values: Any) -> Any:
        child = self._by_values.get(values)
        if child is None:
            if len(values) != len(self._labelnames):
                raise ValueError(f"{self._name}: labels {self._labelnames}, got {values}")
            key = tuple(str(v) for v in values)
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = self._new_child()
            self._by_values[values] = child
        return child


class EventLoopCounter(_LoopMetric):
    """A Prometheus counter for code that runs on one thread (the event loop, where every
    request is served): an increment is a plain addition, without the lock and the label
    hashing prometheus_client pays per call (a few microseconds, several times per request).
    The scrape thread reads the values as they are, as prometheus_client's own histograms
    are read bucket by bucket. Same calls as ``prometheus_client.Counter``:
    ``labels(...).inc(n)``, or ``inc(n)`` without labels."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (),
                 registry: Any = REGISTRY) -> None:
        super().__init__(name.removesuffix("_total"), documentation, labelnames, registry)

    def _new_child(self) -> _LoopCounterValue:
        return _LoopCounterValue()

    def inc(self, amount: float = 1) -> None:
        self._children[()].inc(amount)

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self._name, self._documentation, labels=self._labelnames)
        for key, child in list(self._children.items()):
            family.add_metric(list(key), child.value)
        yield family


class EventLoopHistogram(_LoopMetric):
    """A Prometheus histogram for code on one thread, like :class:`LoopCounter`: an
    observation is a bisection and two additions. ``labels(...).observe(v)``."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (),
                 buckets: Sequence[float] = (), registry: Any = REGISTRY) -> None:
        bounds = sorted(float(b) for b in buckets if b != math.inf)
        self._bounds = (*bounds, math.inf)
        self._les = tuple(floatToGoString(b) for b in self._bounds)
        super().__init__(name, documentation, labelnames, registry)

    def _new_child(self) -> _LoopHistogramValue:
        return _LoopHistogramValue(self._bounds)

    def observe(self, amount: float) -> None:
        self._children[()].observe(amount)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._documentation,
                                       labels=self._labelnames)
        for key, child in list(self._children.items()):
            cumulative = list(itertools.accumulate(child.counts))
            family.add_metric(list(key), list(zip(self._les, cumulative, strict=True)),
                              child.sum)
        yield family


if METRICS_ENABLED:
    Counter: Any = prometheus_client.Counter
    Gauge: Any = prometheus_client.Gauge
    Histogram: Any = prometheus_client.Histogram
    # For metrics updated only on the event loop (the per-request ones): no locks.
    LoopCounter: Any = EventLoopCounter
    LoopHistogram: Any = EventLoopHistogram
else:
    Counter = Gauge = Histogram = LoopCounter = LoopHistogram = NullMetric


def register_collector(collector: Collector) -> None:
    """Add a custom collector (one that reads live state at scrape time) to the registry,
    unless metrics are off."""
    if METRICS_ENABLED:
        REGISTRY.register(collector)


# Trailing gRPC metadata of a handler's answer: milliseconds (decimal) the request spent
# parked in the purgatory, Kafka's RemoteTime; absent when it never parked. The handler
# measures it, the frontend turns it into the "remote" request phase.
REMOTE_TIME_METADATA_KEY = "kbroker-remote-ms"

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)

GRPC_STARTED = LoopCounter(
    "kbroker_grpc_server_started_total", "RPCs started on the server.",
    ["grpc_service", "grpc_method", "grpc_type"],
)
GRPC_HANDLED = LoopCounter(
    "kbroker_grpc_server_handled_total", "RPCs completed on the server, by status code.",
    ["grpc_service", "grpc_method", "grpc_type", "grpc_code"],
)
GRPC_SECONDS = LoopHistogram(
    "kbroker_grpc_server_handling_seconds", "Time to handle an RPC on the server.",
    ["grpc_service", "grpc_method", "grpc_type"], buckets=LATENCY_BUCKETS,
)

CALL_STREAM_MESSAGES = LoopCounter(
    "kbroker_call_stream_messages_total",
    "Messages written on long-lived call streams (requests by the caller, answers by the"
    " server), by stream and side.",
    ["stream", "side"],
)
CALL_STREAM_CALLS = LoopCounter(
    "kbroker_call_stream_calls_total",
    "Calls (or answers) those messages carried: over kbroker_call_stream_messages_total, the"
    " mean batch.",
    ["stream", "side"],
)


def serve_prometheus(port: int, host: str = "127.0.0.1") -> int:
    """Serve Prometheus text on http://host:port/metrics; port 0 picks one. Returns the port."""
    server, _thread = start_http_server(port, addr=host)
    return int(server.server_port)


# This process, for cursors: a restart draws a new id.
PROCESS_ID = uuid.uuid4().hex
PROCESS_START_MS = int(time.time() * 1000)

DEFAULT_STREAM_INTERVAL_MS = 1000
MIN_STREAM_INTERVAL_MS = 100


class _Sequence:
    """Snapshot numbers of this process: 1, 2, 3, ... (thread-safe: the HTTP exposition runs
    in a thread, and tests take snapshots from several)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.last = 0

    def next(self) -> int:
        with self._lock:
            self.last += 1
            return self.last


SEQUENCE = _Sequence()


def stream_interval_seconds(interval_ms: int) -> float:
    """A Stream request's interval as served: 0 is the default, small ones are raised."""
    if interval_ms <= 0:
        interval_ms = DEFAULT_STREAM_INTERVAL_MS
    return max(interval_ms, MIN_STREAM_INTERVAL_MS) / 1000


class MetricsServicer(metrics_pb2_grpc.MetricsServicer):
    """gRPC view of this process's Prometheus registry: a snapshot, or a stream of them."""

    def __init__(self, service: str, instance: str) -> None:
        self._service = service
        self._instance = instance

    async def Snapshot(self, request, context):
        return snapshot(self._service, self._instance, list(request.prefixes),
                        list(request.names), request.drop_empty)

    async def Stream(self, request, context):
        interval = stream_interval_seconds(request.interval_ms)
        prefixes = list(request.prefixes)
        names = list(request.names)
        after = request.after
        reset = False
        if after.process_id:
            if after.process_id != PROCESS_ID:
                reset = True
            elif after.sequence > SEQUENCE.last:
                await context.abort(
                    grpc.StatusCode.OUT_OF_RANGE,
                    f"cursor {after.sequence} is ahead of this process ({SEQUENCE.last})")
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            out = snapshot(self._service, self._instance, prefixes, names, request.drop_empty)
            out.reset = reset
            reset = False
            yield out
            # On schedule while the reader keeps up; a slow reader (the write above waited on
            # flow control) gets the next snapshot one interval after it took this one, not
            # a burst of catch-up snapshots.
            due = max(due + interval, loop.time())
            await asyncio.sleep(due - loop.time())


def snapshot(service: str, instance: str, prefixes: Sequence[str] = (),
             names: Sequence[str] = (), drop_empty: bool = False,
             ) -> metrics_pb2.MetricsSnapshot:
    """The families of the registry a reader asked for (see :func:`wanted`), each with only
    its non-empty series when ``drop_empty`` (see :func:`non_empty_samples`), with the next
    cursor of this process."""
    out = metrics_pb2.MetricsSnapshot(
        service=service, instance=instance, timestamp_ms=int(time.time() * 1000),
        process_start_ms=PROCESS_START_MS,
    )
    out.cursor.process_id = PROCESS_ID
    out.cursor.sequence = SEQUENCE.next()
    wanted_names = frozenset(names)
    for family in REGISTRY.collect():
        if not wanted(family.name, family.type, prefixes, wanted_names):
            continue
        samples = non_empty_samples(family.type, family.samples) if drop_empty \
            else family.samples
        if drop_empty and not samples:
            continue
        fam = out.families.add(name=family.name, type=family.type, help=family.documentation)
        for s in samples:
            fam.samples.add(name=s.name, labels=dict(s.labels), value=float(s.value))
    return out


def wanted(name: str, kind: str, prefixes: Sequence[str], names: frozenset[str]) -> bool:
    """Whether family ``name`` (of type ``kind``) matches a prefix or one of ``names`` (a
    counter also by its exposition name, with ``_total``); every family when both are
    empty."""
    if not prefixes and not names:
        return True
    if name in names or (kind == "counter" and f"{name}_total" in names):
        return True
    return any(name.startswith(p) for p in prefixes)


def non_empty_samples(kind: str, samples: Sequence[Any]) -> list[Any]:
    """The samples of one family that carry something: gauges (and any other type) whole;
    counters without their zero series; histograms and summaries without the label sets
    that observed nothing, and histograms without the buckets no quantile needs (a bucket
    stays if it observed something, or the bucket after it did, since its bound is that
    bucket's lower bound; +Inf always stays). Sample order is kept."""
    if kind == "counter":
        return [s for s in samples if s.value != 0]
    if kind not in ("histogram", "summary"):
        return list(samples)
    by_series: dict[frozenset[tuple[str, str]], list[Any]] = {}
    for s in samples:
        key = frozenset((k, v) for k, v in s.labels.items() if k not in ("le", "quantile"))
        by_series.setdefault(key, []).append(s)
    kept: set[int] = set()
    for series in by_series.values():
        if not any(s.name.endswith("_count") and s.value > 0 for s in series):
            continue
        buckets = [s for s in series if s.name.endswith("_bucket")]
        kept.update(id(s) for s in series if not s.name.endswith("_bucket"))
        counts = [b.value for b in buckets]
        for i, bucket in enumerate(buckets):
            before = counts[i - 1] if i else 0.0
            after = counts[i + 1] if i + 1 < len(counts) else None
            if after is None or counts[i] > before or after > counts[i]:
                kept.add(id(bucket))
    return [s for s in samples if id(s) in kept]


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts and times every unary and streaming-response call (bidirectional streams, which
    carry many calls, are left alone). The wrapped handler of a method is built once and reused
    while the server hands out the same handler for it (generated servicers always do)."""

    def __init__(self) -> None:
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        cached = self._wrapped.get(details.method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        _, service, method = details.method.split("/", 2)  # "/package.Service/Method"
        wrapped = _observed(handler, service, method)
        self._wrapped[details.method] = (handler, wrapped)
        return wrapped


class _RpcMetrics:
    """The gRPC server metrics of one method, children bound once: a call pays no label
    lookups (those take a lock and hash the labels)."""

    __slots__ = ("_handled", "_labels", "_seconds", "_started")

    def __init__(self, labels: tuple[str, str, str]) -> None:
        self._labels = labels
        self._started = GRPC_STARTED.labels(*labels)
        self._seconds = GRPC_SECONDS.labels(*labels)
        self._handled: dict[str, Any] = {}

    def start(self) -> float:
        self._started.inc()
        return time.perf_counter()

    def finish(self, context: grpc.aio.ServicerContext, default: str, started: float) -> None:
        """Count the call under its code (the context's, else ``default``) and time it."""
        code = _code_of(context, default)
        handled = self._handled.get(code)
        if handled is None:
            handled = self._handled[code] = GRPC_HANDLED.labels(*self._labels, code)
        handled.inc()
        self._seconds.observe(time.perf_counter() - started)


# Calls answered once: (handler attribute, grpc_type, its code if the handler raised without
# setting one, the handler factory). A unary call that fails so is UNKNOWN; a client stream
# typically ends so because the peer left.
_SINGLE_ANSWER = (
    ("unary_unary", "unary", "UNKNOWN", grpc.unary_unary_rpc_method_handler),
    ("stream_unary", "client_stream", "CANCELLED", grpc.stream_unary_rpc_method_handler),
)


def _observed(handler: grpc.RpcMethodHandler, service: str, method: str
              ) -> grpc.RpcMethodHandler:
    """``handler`` with every call counted and timed."""
    codec = {"request_deserializer": handler.request_deserializer,
             "response_serializer": handler.response_serializer}
    if handler.unary_stream is not None:
        stream_inner = handler.unary_stream
        stream_rpc = _RpcMetrics((service, method, "server_stream"))

        if not inspect.isasyncgenfunction(stream_inner):
            # A handler that writes its messages with context.write (health's Watch).
            async def server_writes(request, context):
                started = stream_rpc.start()
                outcome = "CANCELLED"
                try:
                    await stream_inner(request, context)
                    outcome = "OK"
                finally:
                    stream_rpc.finish(context, outcome, started)

            return grpc.unary_stream_rpc_method_handler(server_writes, **codec)

        async def server_stream(request, context):
            started = stream_rpc.start()
            outcome = "CANCELLED"  # a stream that raised: typically the peer left
            try:
                async for item in stream_inner(request, context):
                    yield item
                outcome = "OK"
            finally:
                stream_rpc.finish(context, outcome, started)

        return grpc.unary_stream_rpc_method_handler(server_stream, **codec)
    found = [(getattr(handler, attribute), grpc_type, failed, factory)
             for attribute, grpc_type, failed, factory in _SINGLE_ANSWER
             if getattr(handler, attribute) is not None]
    if not found:
        return handler
    [(inner, grpc_type, failed, factory)] = found
    rpc = _RpcMetrics((service, method, grpc_type))

    async def call(request, context):
        started = rpc.start()
        outcome = failed
        try:
            response = await inner(request, context)
            outcome = "OK"
            return response
        finally:
            rpc.finish(context, outcome, started)

    return factory(call, **codec)


def _code_of(context: grpc.aio.ServicerContext, default: str) -> str:
    try:
        code = context.code()
    except Exception:  # noqa: BLE001 - the context may already be finished
        code = None
    if code is None:
        return default
    if isinstance(code, grpc.StatusCode):
        return code.name
    return str(code)
