"""The log node's metrics against a real LogService on port 0: per-partition segments, bytes
and offsets read from the live logs at collection time, flush latency, append and read bytes."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import REGISTRY

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from services.log import metrics
from services.log.server import LogService

from ..record_batches import build_batch, values
from .test_service import create, run_node


def gauge(name: str, topic: str, partition: int = 0) -> float | None:
    return REGISTRY.get_sample_value(name, {"topic": topic, "partition": str(partition)})


def test_partition_gauges_flush_latency_and_byte_counters(tmp_path: Path) -> None:
    topic = "metered"

    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        # Small segments: each append of ~500 bytes rolls a new one.
        await create(stub, topic, segment_bytes="600")
        assert gauge("kbroker_log_partition_segments", topic) == 1
        assert gauge("kbroker_log_partition_size_bytes", topic) == 0
        appended_before = REGISTRY.get_sample_value(
            "kbroker_log_appended_bytes_total", {"topic": topic}) or 0.0
        flushes_before = REGISTRY.get_sample_value("kbroker_log_flush_seconds_count") or 0.0
        sizes = []
        for i in range(3):
            batch = build_batch(values(5, size=80, tag=f"b{i}-"))
            sizes.append(len(batch))
            response = await stub.Append(log_pb2.AppendRequest(partitions=[
                log_pb2.PartitionAppend(topic=topic, partition=0, records=batch)]))
            assert response.results[0].error_code == 0, response
        assert gauge("kbroker_log_partition_segments", topic) == 3
        assert gauge("kbroker_log_partition_size_bytes", topic) == sum(sizes)
        assert gauge("kbroker_log_partition_log_end_offset", topic) == 15
        assert gauge("kbroker_log_partition_log_start_offset", topic) == 0
        appended = REGISTRY.get_sample_value(
            "kbroker_log_appended_bytes_total", {"topic": topic}) - appended_before
        assert appended == sum(sizes)

        # An explicit flush forces the active segment; rolled ones flush in the background.
        log = service.manager.get(topic, 0)
        await log.flush()
        await log.drain()
        flushes = REGISTRY.get_sample_value("kbroker_log_flush_seconds_count") - flushes_before
        assert flushes >= 1

    run_node(tmp_path, body)
    # A stopped node no longer reports its partitions.
    assert gauge("kbroker_log_partition_segments", topic) is None
    assert metrics.PARTITION_LOGS.sources == set()
