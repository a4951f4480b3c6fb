"""Conditional appends (``expected_log_end_offset``): the compare-and-set the group coordinator
serialises its updates with, on a real log node."""

from __future__ import annotations

import asyncio

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from services.common.errors import ErrorCode
from services.log.server import LogService

from ..record_batches import build_batch, values
from .test_service import create, run_node

CONFLICT = ErrorCode.invalid_update_version.value


def _append(topic: str, records: bytes, expected: int | None = None) -> log_pb2.AppendRequest:
    item = log_pb2.PartitionAppend(topic=topic, partition=0, records=records)
    if expected is not None:
        item.expected_log_end_offset = expected
    return log_pb2.AppendRequest(partitions=[item])


def test_an_append_expecting_the_current_end_succeeds_and_a_stale_one_stores_nothing(tmp_path):
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create(stub, "cas")
        first = await stub.Append(_append("cas", build_batch(values(2)), expected=0))
        assert first.results[0].error_code == 0
        assert first.results[0].log_end_offset == 2
        stale = await stub.Append(_append("cas", build_batch(values(1)), expected=0))
        assert stale.results[0].error_code == CONFLICT
        assert stale.results[0].base_offset == -1
        ahead = await stub.Append(_append("cas", build_batch(values(1)), expected=3))
        assert ahead.results[0].error_code == CONFLICT
        state = await stub.DescribePartitions(log_pb2.DescribePartitionsRequest(
            partitions=[log_pb2.TopicPartition(topic="cas", partition=0)]))
        assert state.partitions[0].log_end_offset == 2
        # Unconditional appends are unaffected.
        plain = await stub.Append(_append("cas", build_batch(values(1))))
        assert (plain.results[0].error_code, plain.results[0].base_offset) == (0, 2)

    run_node(tmp_path, body)


def test_of_concurrent_appends_expecting_the_same_end_exactly_one_wins(tmp_path):
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create(stub, "race")
        answers = await asyncio.gather(*(
            stub.Append(_append("race", build_batch(values(1)), expected=0))
            for _ in range(8)))
        codes = sorted(a.results[0].error_code for a in answers)
        assert codes == [0] + [CONFLICT] * 7
        read = await stub.Read(log_pb2.ReadRequest(
            partitions=[log_pb2.PartitionRead(topic="race", partition=0, offset=0,
                                              max_bytes=1 << 20)],
            limit=log_pb2.READ_LIMIT_LOG_END))
        assert read.results[0].log_end_offset == 1

    run_node(tmp_path, body)
