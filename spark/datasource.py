"""``kbroker_metrics``: a PySpark (4.x) Python data source over the services' gRPC
``kbroker.metrics.v1.Metrics`` endpoints: ``Snapshot`` for batch reads, ``Stream`` for
streaming reads.

One row per Prometheus sample, as the process's registry reported it at snapshot time::

    service        string              the answering service (frontend, handler, log, ...)
    instance       string              its instance name (frontend-0, handler-1, log-2, ...)
    endpoint       string              the gRPC host:port that was read
    timestamp      timestamp           when the process took the snapshot
    family         string              metric family (kbroker_frontend_requests)
    type           string              counter, gauge, histogram, summary, info, ...
    sample         string              sample name (kbroker_frontend_requests_total, ..._bucket)
    labels         map<string,string>  the sample's labels (histogram buckets carry ``le``)
    value          double
    process_id     string              the snapshot's cursor: the process (a new id after a
    sequence       long                restart, when counters start again from zero) and the
                                       snapshot's number in that process
    process_start  timestamp           when that process started (rates since start)

Options: ``endpoints`` and/or ``cluster`` (see :mod:`spark.discovery`), ``prefixes`` (comma
separated family-name prefixes, all families when absent; filtering happens in the service),
``timeout`` (seconds per Snapshot call, default 10), ``skip_unavailable`` (``true``: an endpoint
that does not answer yields no rows instead of failing; default ``false``), and for streaming
``interval_ms`` (how often each service sends a snapshot, default 1000).

Internal TLS: a cluster whose services require mutual TLS (``internal_tls_*`` on every service)
is read with the same material: options ``internal_tls_ca``, ``internal_tls_cert`` and
``internal_tls_key`` (PEM paths, readable where the tasks run), by default the driver's
``KBROKER_INTERNAL_TLS_CA`` / ``_CERT`` / ``_KEY``. Channels are then made as the services make
theirs (:func:`services.common.channels.internal_sync_channel`): the reader presents its
certificate and checks the server's against the CA and against a service identity
(``kbroker-log``, ...): ``tls_server_name`` when given, otherwise each kind's identity in turn
(the one the endpoint's host names first) until one matches, so one option set reads every kind
of service; the identity that matched is remembered per endpoint. Without TLS material, channels
are plaintext, to loopback endpoints only (as between the services).

Batch: one partition per endpoint, so each executor task opens one channel and makes one call.

Streaming: the driver keeps one ``Metrics/Stream`` open per endpoint (a background thread
each, reconnecting after failures), and each micro-batch takes every snapshot that arrived
since the previous one. Offsets are the cursors: ``{"cursors": {endpoint: {"process_id",
"sequence"}}}``; a query restarted from a checkpoint resumes each stream after its cursor, so
it never takes a snapshot twice, and a service restarted meanwhile shows up as a new
``process_id``. Metrics are readings, not a log: what happened while no one read is summed in
the next snapshot's counters, and a batch planned but not committed before a crash is not
replayed (it comes back empty; the next one carries the current state). Unavailable endpoints
are retried in the background; without ``skip_unavailable`` an endpoint that never answered
within ``timeout`` seconds, or any error other than unavailability, fails the query.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    InputPartition,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.types import (
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from services.common.tls import SERVICE_KINDS, InternalTls, service_identity
from spark.discovery import endpoints_from_options

NAME = "kbroker_metrics"

SCHEMA = StructType([
    StructField("service", StringType(), False),
    StructField("instance", StringType(), False),
    StructField("endpoint", StringType(), False),
    StructField("timestamp", TimestampType(), False),
    StructField("family", StringType(), False),
    StructField("type", StringType(), False),
    StructField("sample", StringType(), False),
    StructField("labels", MapType(StringType(), StringType(), False), False),
    StructField("value", DoubleType(), False),
    StructField("process_id", StringType(), False),
    StructField("sequence", LongType(), False),
    StructField("process_start", TimestampType(), False),
])

Row = tuple[str, str, str, dt.datetime, str, str, str, dict[str, str], float, str, int,
            dt.datetime]

DEFAULT_INTERVAL_MS = 1000
# Snapshots a stream keeps for the next micro-batch; older ones are dropped (the newest
# carries every count).
MAX_QUEUED_SNAPSHOTS = 64


@dataclass(frozen=True)
class EndpointPartition(InputPartition):
    """One endpoint to read (InputPartition subclasses travel to executors by pickle)."""

    endpoint: str


TLS_ENV = "KBROKER_INTERNAL_TLS_"


@dataclass(frozen=True, slots=True)
class ReadSettings:
    prefixes: tuple[str, ...]
    timeout: float
    skip_unavailable: bool
    interval_ms: int = DEFAULT_INTERVAL_MS
    tls: InternalTls = InternalTls()
    tls_server_name: str = ""

    @classmethod
    def from_options(cls, options: dict[str, str],
                     environ: dict[str, str] | None = None) -> ReadSettings:
        """Settings from the data source's options; TLS paths default to ``environ``
        (``os.environ``) as the services read theirs."""
        env = os.environ if environ is None else environ
        prefixes = tuple(p.strip() for p in options.get("prefixes", "").split(",") if p.strip())
        paths = [options.get(f"internal_tls_{part}", env.get(TLS_ENV + part.upper(), ""))
                 for part in ("ca", "cert", "key")]
        return cls(
            prefixes=prefixes,
            timeout=float(options.get("timeout", 10)),
            skip_unavailable=options.get("skip_unavailable", "false").lower() == "true",
            interval_ms=int(options.get("interval_ms", DEFAULT_INTERVAL_MS)),
            tls=InternalTls(*paths),
            tls_server_name=options.get("tls_server_name", ""),
        )


# The service identity whose certificate each endpoint presented (this process's guess cache).
_SERVER_NAMES: dict[str, str] = {}


def server_names(endpoint: str, settings: ReadSettings) -> list[str]:
    """The names the server at ``endpoint`` may be checked against, in the order to try them
    ([""]: plaintext, no name)."""
    if not settings.tls.enabled:
        return [""]
    if settings.tls_server_name:
        return [settings.tls_server_name]
    host = endpoint.rsplit(":", 1)[0]
    names = [service_identity(kind) for kind in
             sorted(SERVICE_KINDS, key=lambda kind: kind not in host)]
    known = _SERVER_NAMES.get(endpoint)
    return [known, *(n for n in names if n != known)] if known else names


def open_channel(endpoint: str, settings: ReadSettings, server_name: str) -> Any:
    """A blocking channel to ``endpoint``: mutual TLS checking ``server_name`` with TLS
    material, plaintext (loopback only) without."""
    from services.common.channels import internal_sync_channel

    return internal_sync_channel(endpoint, settings.tls, "service", server_name=server_name)


def rows_of(endpoint: str, snap: Any) -> Iterator[Row]:
    """The rows of one ``MetricsSnapshot`` read from ``endpoint``."""
    at = dt.datetime.fromtimestamp(snap.timestamp_ms / 1000, tz=dt.UTC)
    started = dt.datetime.fromtimestamp(snap.process_start_ms / 1000, tz=dt.UTC)
    process_id, sequence = snap.cursor.process_id, snap.cursor.sequence
    for family in snap.families:
        for sample in family.samples:
            yield (
                snap.service, snap.instance, endpoint, at, family.name, family.type,
                sample.name, dict(sample.labels), sample.value, process_id, sequence, started,
            )


def _unavailable(error: Any) -> bool:
    import grpc

    return error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def snapshot_rows(endpoint: str, settings: ReadSettings) -> Iterator[Row]:
    """Every sample one endpoint reports now, as rows of :data:`SCHEMA`."""
    # Imported on the executor: the driver never needs a channel.
    import grpc

    from kbroker.metrics.v1 import metrics_pb2, metrics_pb2_grpc

    first_error: Any = None
    for name in server_names(endpoint, settings):
        with open_channel(endpoint, settings, name) as channel:
            stub = metrics_pb2_grpc.MetricsStub(channel)
            try:
                snap = stub.Snapshot(
                    metrics_pb2.SnapshotRequest(prefixes=list(settings.prefixes)),
                    timeout=settings.timeout,
                )
            except grpc.RpcError as error:
                if not _unavailable(error):
                    raise
                # Unreachable, or a certificate not of this name: try the next one.
                first_error = first_error or error
                continue
        if name:
            _SERVER_NAMES[endpoint] = name
        yield from rows_of(endpoint, snap)
        return
    if not settings.skip_unavailable:
        raise first_error


Cursor = dict[str, Any]  # {"process_id": str, "sequence": int}


def _after(snap: Any, cursor: Cursor | None) -> bool:
    """Whether ``snap`` comes after ``cursor`` (any snapshot of another process does)."""
    if not cursor:
        return True
    return (snap.cursor.process_id != cursor["process_id"]
            or snap.cursor.sequence > cursor["sequence"])


class EndpointStream:
    """One endpoint's ``Metrics/Stream``, read on a daemon thread into a bounded queue.
    After a failure it reconnects (backing off up to 5 s), resuming after the last cursor it
    received; a cursor the service refuses (OUT_OF_RANGE) is dropped and the stream starts
    afresh."""

    def __init__(self, endpoint: str, settings: ReadSettings, after: Cursor | None) -> None:
        self.endpoint = endpoint
        self._settings = settings
        self._after = after
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=MAX_QUEUED_SNAPSHOTS)
        self._stopping = threading.Event()
        self._call: Any = None
        self.started = time.monotonic()
        self.delivered = 0
        self.last_error: Any = None
        self.fatal: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"kbroker-metrics-stream-{endpoint}")
        self._thread.start()

    def _run(self) -> None:
        import grpc

        from kbroker.metrics.v1 import metrics_pb2, metrics_pb2_grpc

        backoff = 0.2
        names, attempt = server_names(self.endpoint, self._settings), 0
        while not self._stopping.is_set():
            request = metrics_pb2.StreamRequest(prefixes=list(self._settings.prefixes),
                                                interval_ms=self._settings.interval_ms)
            if self._after:
                request.after.process_id = self._after["process_id"]
                request.after.sequence = self._after["sequence"]
            # Until a snapshot came, every failure moves on to the next server name.
            name = names[attempt % len(names)]
            channel = open_channel(self.endpoint, self._settings, name)
            try:
                self._call = metrics_pb2_grpc.MetricsStub(channel).Stream(request)
                for snap in self._call:
                    self._after = {"process_id": snap.cursor.process_id,
                                   "sequence": snap.cursor.sequence}
                    self._put(snap)
                    backoff = 0.2
                    if name and _SERVER_NAMES.get(self.endpoint) != name:
                        _SERVER_NAMES[self.endpoint] = name
                        names = [name]
            except grpc.RpcError as error:
                if self._stopping.is_set():
                    break
                self.last_error = error
                if error.code() == grpc.StatusCode.OUT_OF_RANGE:
                    self._after = None
                elif not _unavailable(error) and error.code() != grpc.StatusCode.CANCELLED:
                    self.fatal = error
                    break
            finally:
                channel.close()
            attempt += 1
            if len(names) > 1 and attempt % len(names):
                continue  # the next name at once; back off once every name failed
            self._stopping.wait(backoff)
            backoff = min(backoff * 2, 5.0)

    def _put(self, snap: Any) -> None:
        while True:
            try:
                self._queue.put_nowait(snap)
                self.delivered += 1
                return
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self._queue.get_nowait()  # the oldest goes: newer ones carry its counts

    def take(self) -> list[Any]:
        """Every snapshot received since the last call (oldest first)."""
        out = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out

    def check(self, settings: ReadSettings) -> None:
        """Raise what makes this endpoint unusable (see the module docstring)."""
        if self.fatal is not None:
            raise RuntimeError(f"{self.endpoint}: metrics stream failed: {self.fatal}")
        if (not settings.skip_unavailable and self.delivered == 0
                and time.monotonic() - self.started > settings.timeout):
            raise RuntimeError(f"{self.endpoint}: no metrics stream within "
                               f"{settings.timeout:g} s: {self.last_error}")

    def stop(self) -> None:
        self._stopping.set()
        call = self._call
        if call is not None:
            call.cancel()


class KbrokerMetricsDataSource(DataSource):
    """``spark.read.format("kbroker_metrics")`` and ``spark.readStream.format(...)``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return MetricsBatchReader(dict(self.options))

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        return MetricsStreamReader(dict(self.options))


class MetricsBatchReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.endpoints = endpoints_from_options(options)
        self.settings = ReadSettings.from_options(options)

    def partitions(self) -> list[InputPartition]:
        return [EndpointPartition(e) for e in self.endpoints]

    def read(self, partition: InputPartition) -> Iterator[Row]:
        assert isinstance(partition, EndpointPartition)
        yield from snapshot_rows(partition.endpoint, self.settings)


class MetricsStreamReader(SimpleDataSourceStreamReader):
    """The driver-side streaming reader: offsets are cursors, data comes from the streams."""

    def __init__(self, options: dict[str, str]) -> None:
        self.endpoints = endpoints_from_options(options)
        self.settings = ReadSettings.from_options(options)
        self._streams: dict[str, EndpointStream] = {}

    def initialOffset(self) -> dict[str, Any]:
        return {"cursors": {}}

    def read(self, start: dict[str, Any]) -> tuple[Iterator[Row], dict[str, Any]]:
        cursors: dict[str, Cursor] = dict(start.get("cursors") or {})
        rows: list[Row] = []
        for endpoint in self.endpoints:
            stream = self._streams.get(endpoint)
            if stream is None:
                stream = self._streams[endpoint] = EndpointStream(
                    endpoint, self.settings, cursors.get(endpoint))
            stream.check(self.settings)
            for snap in stream.take():
                if not _after(snap, cursors.get(endpoint)):
                    continue  # already in a committed batch (a resumed query)
                rows.extend(rows_of(endpoint, snap))
                cursors[endpoint] = {"process_id": snap.cursor.process_id,
                                     "sequence": snap.cursor.sequence}
        return iter(rows), {"cursors": cursors}

    def readBetweenOffsets(self, start: dict[str, Any], end: dict[str, Any]) -> Iterator[Row]:
        # Replaying a batch after a crash: services keep no history of snapshots, so there is
        # nothing to give back; the next batch carries the current counts.
        return iter([])

    def commit(self, end: dict[str, Any]) -> None:
        # Nothing to acknowledge: the services keep no reader state.
        pass

    def stop(self) -> None:
        for stream in self._streams.values():
            stream.stop()
        self._streams.clear()


def register(spark: Any) -> None:
    """Make ``format("kbroker_metrics")`` available in this session."""
    spark.dataSource.register(KbrokerMetricsDataSource)
