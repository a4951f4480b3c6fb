"""``kbroker_metrics``: a PySpark (4.x) Python data source over the services' gRPC
``kbroker.metrics.v1.Metrics/Snapshot`` endpoints, for batch and streaming reads.

One row per Prometheus sample, as the process's registry reported it at snapshot time::

    service    string               the answering service (frontend, handler, log, ...)
    instance   string               its instance name (frontend-0, handler-1, log-2, ...)
    endpoint   string               the gRPC host:port that was read
    timestamp  timestamp            when the process took the snapshot
    family     string               metric family (kbroker_frontend_requests)
    type       string               counter, gauge, histogram, summary, info, ...
    sample     string               sample name (kbroker_frontend_requests_total, ..._bucket)
    labels     map<string,string>   the sample's labels (histogram buckets carry ``le``)
    value      double

Options: ``endpoints`` and/or ``cluster`` (see :mod:`spark.discovery`), ``prefixes`` (comma
separated family-name prefixes, all families when absent; filtering happens in the service),
``timeout`` (seconds per Snapshot call, default 10), ``skip_unavailable`` (``true``: an endpoint
that does not answer yields no rows instead of failing the task; default ``false``).

Partitions: one per endpoint, so each executor task opens one channel and makes one call.
Streaming: every micro-batch takes a fresh snapshot of every endpoint; the offset is the
planning time in milliseconds (strictly increasing), so a restarted query from a checkpoint
never replays an old batch as "new" data - metrics are a reading of now, not a log.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import (
    DoubleType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

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
])

Row = tuple[str, str, str, dt.datetime, str, str, str, dict[str, str], float]


@dataclass(frozen=True)
class EndpointPartition(InputPartition):
    """One endpoint to read (InputPartition subclasses travel to executors by pickle)."""

    endpoint: str


@dataclass(frozen=True, slots=True)
class ReadSettings:
    prefixes: tuple[str, ...]
    timeout: float
    skip_unavailable: bool

    @classmethod
    def from_options(cls, options: dict[str, str]) -> ReadSettings:
        prefixes = tuple(p.strip() for p in options.get("prefixes", "").split(",") if p.strip())
        return cls(
            prefixes=prefixes,
            timeout=float(options.get("timeout", 10)),
            skip_unavailable=options.get("skip_unavailable", "false").lower() == "true",
        )


def snapshot_rows(endpoint: str, settings: ReadSettings) -> Iterator[Row]:
    """Every sample one endpoint reports now, as rows of :data:`SCHEMA`."""
    # Imported on the executor: the driver never needs a channel.
    import grpc

    from kbroker.metrics.v1 import metrics_pb2, metrics_pb2_grpc

    with grpc.insecure_channel(endpoint) as channel:
        stub = metrics_pb2_grpc.MetricsStub(channel)
        try:
            snap = stub.Snapshot(
                metrics_pb2.SnapshotRequest(prefixes=list(settings.prefixes)),
                timeout=settings.timeout,
            )
        except grpc.RpcError as error:
            if settings.skip_unavailable and error.code() in (
                grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED
            ):
                return
            raise
    at = dt.datetime.fromtimestamp(snap.timestamp_ms / 1000, tz=dt.UTC)
    for family in snap.families:
        for sample in family.samples:
            yield (
                snap.service, snap.instance, endpoint, at, family.name, family.type,
                sample.name, dict(sample.labels), sample.value,
            )


class KbrokerMetricsDataSource(DataSource):
    """``spark.read.format("kbroker_metrics")`` and ``spark.readStream.format(...)``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return MetricsBatchReader(dict(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
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


class MetricsStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.endpoints = endpoints_from_options(options)
        self.settings = ReadSettings.from_options(options)
        self._last_ms = 0

    def initialOffset(self) -> dict[str, Any]:
        return {"planned_ms": 0}

    def latestOffset(self) -> dict[str, Any]:
        # Strictly increasing: each trigger is a new batch (a new snapshot).
        self._last_ms = max(int(time.time() * 1000), self._last_ms + 1)
        return {"planned_ms": self._last_ms}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        return [EndpointPartition(e) for e in self.endpoints]

    def read(self, partition: InputPartition) -> Iterator[Row]:
        assert isinstance(partition, EndpointPartition)
        yield from snapshot_rows(partition.endpoint, self.settings)

    def commit(self, end: dict[str, Any]) -> None:
        # Nothing to acknowledge: the services keep no reader state.
        pass


def register(spark: Any) -> None:
    """Make ``format("kbroker_metrics")`` available in this session."""
    spark.dataSource.register(KbrokerMetricsDataSource)
