"""Client telemetry (KIP-714), as Kafka's ``ClientMetricsManager`` runs it: the subscription
clients get, the state kept per client instance, the checks on every push, and the store of
what clients pushed, which the handler exposes beside its own metrics.

Subscription. One per handler, from its flags (all handlers of a cluster run with the same):
the metric name prefixes asked for (``--client-telemetry-metrics``: a comma list, ``*`` for
every metric, empty for none, Kafka's ``metrics`` of a client-metrics resource), the push
interval (``--client-telemetry-push-interval-ms``, Kafka's ``interval.ms``, 5 minutes) and the
largest push accepted (``--client-telemetry-max-bytes``, Kafka's ``telemetry.max.bytes``,
1 MiB). Answers are Kafka's: accepted compression types zstd, lz4, gzip, snappy in that order
of preference, delta temporality, and a subscription id computed as Kafka computes it:
CRC32C of the prefixes and the push interval, XOR the client instance id's hash. A client with
no subscription gets no metrics and asks again after the push interval.

Where state lives. A handler keeps no state another handler needs. The subscription id is a
function of the flags and the client instance id, so every handler answers the same id and
accepts a push whichever handler answered GetTelemetrySubscriptions: a subscription survives
requests reaching other handlers (and handler restarts) because nothing about it is stored.
Like a Kafka broker, each handler keeps a small cache of the client instances it heard from
(at most 16,384, each forgotten ``max(60 s, 3 push intervals)`` after its last request):
the times of its last requests (the push-rate check), whether it sent its terminating push, its
last error. A client's first request to a handler starts a fresh entry, as a request to another
Kafka broker does, so the rate check holds per handler: with several handlers a client pushing
too often is caught by each handler it reaches twice within an interval.

Pushed metrics live in the handler that received them (:class:`ClientMetricsStore`), as Kafka
hands each push to the broker's exporter plugin: decompressed (within the max bytes, a bigger
payload is TELEMETRY_TOO_LARGE), decoded as OTLP ``MetricsData`` (failing: INVALID_RECORD),
filtered to the subscribed prefixes. Sums pushed as deltas (what the subscription asks for) are
added up per series: any handler's counter holds the deltas it received, so their sum over
handlers is the client's total. Gauges keep their last value and are shown for 1.5 push
intervals after it came (the client's next push may reach another handler, which then shows the
newer value); ``kbroker_handler_client_last_push_timestamp_seconds`` says per client instance
which handler heard last, so a reader (the Spark report) takes each client's gauges from it.
Histograms and summaries are not kept (KIP-714 clients push gauges and sums). Handler restarts
lose what the handler held; clients push again every interval.

Cardinality, bounded: a family per subscribed metric name (only names under the subscribed
prefixes are kept), labels ``client_instance_id``, ``client_id`` and the data point's
attributes (at most 8, e.g. ``node_id``); at most ``--client-telemetry-max-series`` series per
handler (10,000), points beyond it dropped and counted; a client's series go when its cache
entry does.

Names: ``kbroker_client_`` + the metric's name without ``org.apache.kafka.``, dots as
underscores, the unit in base units last (``ms`` to ``_seconds``, divided by 1000; ``By`` to
``_bytes``), ``_total`` on counters: ``org.apache.kafka.producer.node.request.latency.avg`` (ms)
is ``kbroker_client_producer_node_request_latency_avg_seconds``. Kafka's clients send no unit
(:func:`kafka_unit`): their latencies and times are milliseconds.
"""

from __future__ import annotations

import math
import re
import struct
import threading
import time
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import cramjam
import crc32c

from services.common.errors import ErrorCode
from services.common.records.compression import GZIP, LZ4, NONE, SNAPPY, ZSTD, is_xerial

ALL_METRICS = "*"
# Kafka's order of preference; a client takes the first it supports.
ACCEPTED_COMPRESSION_TYPES = (ZSTD, LZ4, GZIP, SNAPPY)
CACHE_MAX_SIZE = 16384
CACHE_EXPIRY_MS = 60_000
ZERO_UUID = uuid.UUID(int=0)
# Kafka's Uuid.RESERVED: the zero id, the metadata topic's id (1) and ONE_UUID.
RESERVED_UUIDS = frozenset({ZERO_UUID, uuid.UUID(int=1)})
METRIC_PREFIX = "org.apache.kafka."
FAMILY_PREFIX = "kbroker_client_"
MAX_ATTRIBUTES = 8
GAUGE_FRESHNESS_INTERVALS = 1.5
# Labels Prometheus gives the scrape target: point attributes so named get a prefix.
TARGET_LABELS = frozenset({"job", "instance", "service", "namespace", "pod"})
UNITS = {"ms": ("seconds", 1e-3), "s": ("seconds", 1.0), "us": ("seconds", 1e-6),
         "ns": ("seconds", 1e-9), "By": ("bytes", 1.0), "bytes": ("bytes", 1.0)}

NONE_CODE = ErrorCode.none.value
INVALID_REQUEST = ErrorCode.invalid_request.value
INVALID_RECORD = ErrorCode.invalid_record.value
THROTTLING_QUOTA_EXCEEDED = ErrorCode.throttling_quota_exceeded.value
UNKNOWN_SUBSCRIPTION_ID = ErrorCode.unknown_subscription_id.value
UNSUPPORTED_COMPRESSION_TYPE = ErrorCode.unsupported_compression_type.value
TELEMETRY_TOO_LARGE = ErrorCode.telemetry_too_large.value


def java_uuid_hash(value: uuid.UUID) -> int:
    """Kafka's ``Uuid.hashCode``: the xor of the halves, folded to a signed int32."""
    msb, lsb = value.int >> 64, value.int & (2**64 - 1)
    h = msb ^ lsb
    return _int32((h ^ (h >> 32)) & 0xFFFFFFFF)


def _int32(value: int) -> int:
    return struct.unpack(">i", struct.pack(">I", value & 0xFFFFFFFF))[0]


@dataclass(frozen=True, slots=True)
class Subscription:
    """What every client is asked to push (see the module docstring)."""

    metrics: tuple[str, ...] = ()
    push_interval_ms: int = 300_000
    max_bytes: int = 1_048_576

    @classmethod
    def from_flags(cls, metrics: str, push_interval_ms: int, max_bytes: int) -> Subscription:
        prefixes = tuple(dict.fromkeys(m.strip() for m in metrics.split(",") if m.strip()))
        if ALL_METRICS in prefixes:
            prefixes = (ALL_METRICS,)
        if push_interval_ms <= 0 or max_bytes <= 0:
            raise ValueError("the push interval and the max bytes must be positive")
        return cls(prefixes, push_interval_ms, max_bytes)

    def subscription_id(self, client_instance_id: uuid.UUID) -> int:
        """CRC32C of the prefixes (as Java prints a set) and the push interval, XOR the
        client instance id's hash: Kafka's ``computeSubscriptionId``."""
        text = "[" + ", ".join(sorted(self.metrics)) + "]" + str(self.push_interval_ms)
        return _int32(crc32c.crc32c(text.encode()) ^ java_uuid_hash(client_instance_id))

    def wants(self, name: str) -> bool:
        return self.metrics == (ALL_METRICS,) or any(name.startswith(p) for p in self.metrics)

    @property
    def expiry_ms(self) -> int:
        return max(CACHE_EXPIRY_MS, 3 * self.push_interval_ms)


@dataclass(slots=True)
class ClientInstance:
    """One client instance as this handler knows it (Kafka's ``ClientMetricsInstance``)."""

    instance_id: uuid.UUID
    subscription_id: int
    last_get_ms: float = -math.inf
    last_push_ms: float = -math.inf
    last_seen_ms: float = 0.0
    terminating: bool = False
    last_error: int = NONE_CODE

    def accept_get(self, now_ms: float, interval_ms: int) -> bool:
        """Whether a GetTelemetrySubscriptions comes a push interval after the last request
        (or after an error that asks the client to come back at once)."""
        if self.last_error in (UNKNOWN_SUBSCRIPTION_ID, UNSUPPORTED_COMPRESSION_TYPE):
            self.last_get_ms = now_ms
            return True
        if now_ms - max(self.last_get_ms, self.last_push_ms) >= interval_ms:
            self.last_get_ms = now_ms
            return True
        return False

    def accept_push(self, now_ms: float, interval_ms: int) -> bool:
        """Whether a push comes a push interval after the last one; the first push after a
        GetTelemetrySubscriptions is always in time (clients add jitter to the interval)."""
        if self.last_get_ms > self.last_push_ms or now_ms - self.last_push_ms >= interval_ms:
            self.last_push_ms = now_ms
            return True
        return False


@dataclass(frozen=True, slots=True)
class SubscriptionAnswer:
    error_code: int
    client_instance_id: uuid.UUID
    subscription_id: int = 0
    push_interval_ms: int = 0
    max_bytes: int = 0
    metrics: tuple[str, ...] = ()


def parse_instance_id(text: str) -> uuid.UUID | None:
    """The client instance id of a request (``""`` is the zero id); None when malformed."""
    if not text:
        return ZERO_UUID
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


class TelemetryError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def decompress(codec: int, data: bytes, max_bytes: int) -> bytes:
    """A push's payload decompressed, at most ``max_bytes`` of it (Kafka's
    ``ClientTelemetryUtils.decompress`` with its limit): TELEMETRY_TOO_LARGE beyond,
    INVALID_RECORD when it does not decompress, UNSUPPORTED_COMPRESSION_TYPE for an unknown
    codec."""
    if codec == NONE:
        out = data
    elif codec == GZIP:
        inflater = zlib.decompressobj(wbits=31)
        try:
            out = inflater.decompress(data, max_bytes + 1)
        except zlib.error as exc:
            raise TelemetryError(INVALID_RECORD, f"gzip: {exc}") from None
        if len(out) <= max_bytes and not inflater.eof:
            raise TelemetryError(INVALID_RECORD, "gzip: truncated stream")
    elif codec in (LZ4, ZSTD, SNAPPY):
        buffer = bytearray(max_bytes + 1)
        try:
            if codec == SNAPPY and is_xerial(data):
                from services.common.records.compression import decompress as records

                out = records(SNAPPY, data)
            else:
                into = {LZ4: cramjam.lz4.decompress_into, ZSTD: cramjam.zstd.decompress_into,
                        SNAPPY: cramjam.snappy.decompress_raw_into}[codec]
                out = bytes(buffer[:into(data, buffer)])
        except Exception as exc:  # noqa: BLE001 - each codec raises its own errors
            text = str(exc)
            if "failed to write whole buffer" in text or "smaller than required" in text:
                raise TelemetryError(TELEMETRY_TOO_LARGE, "decompressed telemetry exceeds "
                                     f"{max_bytes} bytes") from None
            raise TelemetryError(INVALID_RECORD, f"cannot decompress: {text}") from None
    else:
        raise TelemetryError(UNSUPPORTED_COMPRESSION_TYPE, f"unknown compression type {codec}")
    if len(out) > max_bytes:
        raise TelemetryError(TELEMETRY_TOO_LARGE,
                             f"decompressed telemetry exceeds {max_bytes} bytes")
    return bytes(out)


# -- the store ---------------------------------------------------------------------------------

GAUGE, COUNTER = "gauge", "counter"
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]  # (family, labels)


@dataclass(slots=True)
class Series:
    kind: str
    help: str
    value: float = 0.0
    updated_ms: float = 0.0


@dataclass(slots=True)
class PushedClient:
    """What one client instance pushed to this handler."""

    client_id: str
    last_push_ms: float = 0.0
    last_push_wall: float = 0.0
    series: dict[SeriesKey, Series] = field(default_factory=dict)


def _sanitize(name: str) -> str:
    return re.sub(r"_+", "_", re.sub(r"[^a-zA-Z0-9_]", "_", name)).strip("_")


def kafka_unit(metric: str) -> str:
    """The unit of a Kafka client metric that came without one. The Java client and librdkafka
    leave the unit out; Kafka's client metrics give latencies and times in milliseconds
    unless the name says otherwise (``io.wait.time.ns.avg``)."""
    if not metric.startswith(METRIC_PREFIX):
        return ""
    words = set(metric.removeprefix(METRIC_PREFIX).split("."))
    if not words & {"latency", "time"} or "ratio" in words:
        return ""
    for unit in ("ns", "us", "ms"):
        if unit in words:
            return unit
    return "ms"


def family_name(metric: str, unit: str, counter: bool) -> tuple[str, float]:
    """The Prometheus family of an OTLP metric and the factor to base units (see the module
    docstring)."""
    unit = unit or kafka_unit(metric)
    words = _sanitize(metric.removeprefix(METRIC_PREFIX)).lower().split("_")
    if counter and words[-1] == "total":
        words.pop()
    suffix, scale = UNITS.get(unit, ("", 1.0))
    if suffix:
        # The unit goes last, in base units (io.wait.time.ns.avg: io_wait_time_avg_seconds).
        words = [w for w in words if w != unit.lower()]
        if words[-1] != suffix:
            words.append(suffix)
    return FAMILY_PREFIX + "_".join(words), scale


def _attribute_value(value: object) -> str:
    which = value.WhichOneof("value")  # type: ignore[attr-defined]
    if which in ("string_value", "int_value", "double_value", "bool_value"):
        return str(getattr(value, which)).lower() if which == "bool_value" else str(
            getattr(value, which))
    return ""


class ClientMetricsStore:
    """Pushed client metrics of this handler, bounded (see the module docstring).
    Thread-safe: pushes come on the event loop, scrapes on other threads."""

    def __init__(self, max_series: int = 10_000) -> None:
        self.max_series = max_series
        self._clients: dict[uuid.UUID, PushedClient] = {}
        self._series_count = 0
        self._lock = threading.Lock()
        self.dropped: dict[str, int] = {}

    @property
    def series_count(self) -> int:
        return self._series_count

    def _drop(self, reason: str, count: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + count

    def record(self, instance_id: uuid.UUID, client_id: str, data: object,
               subscription: Subscription, now_ms: float, wall: float) -> None:
        """Add one decoded ``MetricsData`` push."""
        with self._lock:
            client = self._clients.get(instance_id)
            if client is None:
                client = self._clients[instance_id] = PushedClient(client_id)
            client.client_id = client_id
            client.last_push_ms, client.last_push_wall = now_ms, wall
            for resource_metrics in data.resource_metrics:  # type: ignore[attr-defined]
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        self._record_metric(client, instance_id, metric, subscription, now_ms)

    def _record_metric(self, client: PushedClient, instance_id: uuid.UUID, metric: object,
                       subscription: Subscription, now_ms: float) -> None:
        m = metric
        kind = m.WhichOneof("data")  # type: ignore[attr-defined]
        if not subscription.wants(m.name):  # type: ignore[attr-defined]
            self._drop("unsubscribed")
            return
        if kind == "sum":
            points, monotonic = m.sum.data_points, m.sum.is_monotonic  # type: ignore[attr-defined]
            delta = m.sum.aggregation_temporality == 1  # type: ignore[attr-defined]
        elif kind == "gauge":
            points, monotonic, delta = m.gauge.data_points, False, False  # type: ignore[attr-defined]
        else:
            self._drop("unsupported_type")
            return
        counter = monotonic
        name, scale = family_name(m.name, m.unit, counter)  # type: ignore[attr-defined]
        unit = m.unit or kafka_unit(m.name)  # type: ignore[attr-defined]
        help_text = (f"Client metric {m.name} ({unit or '1'}), pushed by clients "  # type: ignore[attr-defined]
                     f"(KIP-714){', in base units' if scale != 1.0 else ''}.")
        for point in points:
            labels = [("client_instance_id", str(instance_id)), ("client_id", client.client_id)]
            for attribute in list(point.attributes)[:MAX_ATTRIBUTES]:
                key = _sanitize(attribute.key)
                if not key or key in ("client_instance_id", "client_id"):
                    continue
                labels.append((f"attr_{key}" if key in TARGET_LABELS else key,
                               _attribute_value(attribute.value)))
            value = (point.as_double if point.WhichOneof("value") == "as_double"
                     else float(point.as_int)) * scale
            key = (name, tuple(sorted(labels)))
            series = client.series.get(key)
            if series is None:
                if self._series_count >= self.max_series:
                    self._drop("series_limit")
                    continue
                series = client.series[key] = Series(COUNTER if counter else GAUGE, help_text)
                self._series_count += 1
            if series.kind != (COUNTER if counter else GAUGE):
                self._drop("type_changed")
                continue
            series.value = series.value + value if delta else value
            series.updated_ms = now_ms

    def forget(self, instance_id: uuid.UUID) -> None:
        with self._lock:
            client = self._clients.pop(instance_id, None)
            if client is not None:
                self._series_count -= len(client.series)

    def families(self, now_ms: float, push_interval_ms: int) -> Iterator[
            tuple[str, str, str, list[tuple[dict[str, str], float]]]]:
        """(family, type, help, [(labels, value)]) of every series shown now, and the last
        push time of every client instance."""
        fresh_ms = GAUGE_FRESHNESS_INTERVALS * push_interval_ms
        out: dict[str, tuple[str, str, list[tuple[dict[str, str], float]]]] = {}
        pushes: list[tuple[dict[str, str], float]] = []
        with self._lock:
            for instance_id, client in self._clients.items():
                pushes.append(({"client_instance_id": str(instance_id),
                                "client_id": client.client_id}, client.last_push_wall))
                for (name, labels), series in client.series.items():
                    if series.kind == GAUGE and now_ms - series.updated_ms > fresh_ms:
                        continue
                    entry = out.setdefault(name, (series.kind, series.help, []))
                    if entry[0] == series.kind:
                        entry[2].append((dict(labels), series.value))
        for name in sorted(out):
            kind, help_text, samples = out[name]
            yield name, kind, help_text, samples
        yield ("kbroker_handler_client_last_push_timestamp_seconds", GAUGE,
               "When this handler last received a push from each client instance (Unix time); "
               "a client's gauges are the ones of the handler that heard from it last.", pushes)


# -- the manager -------------------------------------------------------------------------------


class ClientMetricsManager:
    """Subscriptions, client instances and pushes (see the module docstring). Runs on the
    event loop; ``clock`` is monotonic seconds (tests pass their own)."""

    def __init__(self, subscription: Subscription, store: ClientMetricsStore | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 on_outcome: Callable[[str, int], None] | None = None) -> None:
        self.subscription = subscription
        self.store = store or ClientMetricsStore()
        self._clock = clock
        self._wall = wall_clock
        self._instances: OrderedDict[uuid.UUID, ClientInstance] = OrderedDict()
        self._on_outcome = on_outcome or (lambda api, code: None)

    @property
    def instance_count(self) -> int:
        return len(self._instances)

    def _now_ms(self) -> float:
        return self._clock() * 1000

    def _instance(self, instance_id: uuid.UUID, now_ms: float) -> ClientInstance:
        self._expire(now_ms)
        instance = self._instances.get(instance_id)
        if instance is None:
            instance = ClientInstance(instance_id,
                                      self.subscription.subscription_id(instance_id))
            self._instances[instance_id] = instance
            while len(self._instances) > CACHE_MAX_SIZE:
                evicted, _ = self._instances.popitem(last=False)
                self.store.forget(evicted)
        else:
            self._instances.move_to_end(instance_id)
        instance.last_seen_ms = now_ms
        return instance

    def _expire(self, now_ms: float) -> None:
        expiry = self.subscription.expiry_ms
        while self._instances:
            instance_id, oldest = next(iter(self._instances.items()))
            if now_ms - oldest.last_seen_ms < expiry:
                return
            del self._instances[instance_id]
            self.store.forget(instance_id)

    def get_subscriptions(self, client_instance_id: str) -> SubscriptionAnswer:
        """GetTelemetrySubscriptions: a new client instance id for the zero id, the
        subscription, or THROTTLING_QUOTA_EXCEEDED within the push interval."""
        instance_id = parse_instance_id(client_instance_id)
        if instance_id is None:
            return self._answer("GetTelemetrySubscriptions",
                                SubscriptionAnswer(INVALID_REQUEST, ZERO_UUID))
        if instance_id == ZERO_UUID:
            instance_id = uuid.uuid4()
            while instance_id in self._instances:
                instance_id = uuid.uuid4()
        now_ms = self._now_ms()
        instance = self._instance(instance_id, now_ms)
        if not instance.accept_get(now_ms, self.subscription.push_interval_ms):
            return self._answer("GetTelemetrySubscriptions",
                                SubscriptionAnswer(THROTTLING_QUOTA_EXCEEDED, ZERO_UUID))
        instance.last_error = NONE_CODE
        sub = self.subscription
        return self._answer("GetTelemetrySubscriptions", SubscriptionAnswer(
            NONE_CODE, instance_id, instance.subscription_id, sub.push_interval_ms,
            sub.max_bytes, sub.metrics))

    def push(self, client_instance_id: str, subscription_id: int, terminating: bool,
             compression_type: int, metrics: bytes, client_id: str = "") -> int:
        """PushTelemetry, checked in Kafka's order; the error code to answer."""
        instance_id = parse_instance_id(client_instance_id)
        if instance_id is None or instance_id in RESERVED_UUIDS:
            return self._outcome("PushTelemetry", INVALID_REQUEST)
        now_ms = self._now_ms()
        instance = self._instance(instance_id, now_ms)
        try:
            code = self._check_push(instance, subscription_id, terminating, compression_type,
                                    metrics, now_ms)
        finally:
            instance.terminating = terminating
        if code != NONE_CODE:
            instance.last_error = code
            return self._outcome("PushTelemetry", code)
        if metrics:
            try:
                data = decode(compression_type, metrics, self.subscription.max_bytes)
            except TelemetryError as error:
                instance.last_error = error.code
                return self._outcome("PushTelemetry", error.code)
            self.store.record(instance_id, client_id, data, self.subscription, now_ms,
                              self._wall())
        instance.last_error = NONE_CODE
        return self._outcome("PushTelemetry", NONE_CODE)

    def _check_push(self, instance: ClientInstance, subscription_id: int, terminating: bool,
                    compression_type: int, metrics: bytes, now_ms: float) -> int:
        if instance.terminating:
            return INVALID_REQUEST
        if not instance.accept_push(now_ms, self.subscription.push_interval_ms) \
                and not terminating:
            return THROTTLING_QUOTA_EXCEEDED
        if subscription_id != instance.subscription_id:
            return UNKNOWN_SUBSCRIPTION_ID
        if not NONE <= compression_type <= ZSTD:
            return UNSUPPORTED_COMPRESSION_TYPE
        if len(metrics) > self.subscription.max_bytes:
            return TELEMETRY_TOO_LARGE
        return NONE_CODE

    def _answer(self, api: str, answer: SubscriptionAnswer) -> SubscriptionAnswer:
        self._on_outcome(api, answer.error_code)
        return answer

    def _outcome(self, api: str, code: int) -> int:
        self._on_outcome(api, code)
        return code

    def families(self) -> Iterable[tuple[str, str, str, list[tuple[dict[str, str], float]]]]:
        return self.store.families(self._now_ms(), self.subscription.push_interval_ms)


def decode(compression_type: int, payload: bytes, max_bytes: int) -> object:
    """The OTLP ``MetricsData`` of a push (TelemetryError when it is not one)."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.metrics.v1 import metrics_pb2

    raw = decompress(compression_type, payload, max_bytes)
    data = metrics_pb2.MetricsData()
    try:
        data.ParseFromString(raw)
    except DecodeError as exc:
        raise TelemetryError(INVALID_RECORD, f"not OTLP MetricsData: {exc}") from None
    return data
