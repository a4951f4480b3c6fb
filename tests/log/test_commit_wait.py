"""A leader holding the answer to an acks=all append until its high watermark passes the
records (AppendRequest.commit_wait_ms): answered committed with the ISR that committed it, or
as appended once the wait is over or the leader steps down. Real LogService on port 0 (node 0,
its follower node 1 fetching as a follower's fetcher would), data in tmp_path."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from prometheus_client import REGISTRY

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from services.log.server import LogService

from ..record_batches import build_batch, values
from .test_replica_service import FOLLOWER, LEADER, become, create_with, fetch, state
from .test_service import run_node


def acks_all(topic: str, records: bytes, wait_ms: int, min_insync: int = 1,
             ) -> log_pb2.AppendRequest:
    return log_pb2.AppendRequest(commit_wait_ms=wait_ms, partitions=[log_pb2.PartitionAppend(
        topic=topic, partition=0, records=records, min_insync_replicas=min_insync)])


def waits(outcome: str) -> float:
    return REGISTRY.get_sample_value("kbroker_log_commit_wait_seconds_count",
                                     {"outcome": outcome}) or 0


async def running(stub: log_pb2_grpc.LogServiceStub, request: log_pb2.AppendRequest,
                  ) -> asyncio.Task[log_pb2.AppendResponse]:
    task = asyncio.ensure_future(stub.Append(request))
    await asyncio.sleep(0.3)
    assert not task.done()  # held: the follower does not have the records yet
    return task


def test_an_acks_all_append_is_answered_once_its_follower_has_it(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "t", state("t", LEADER, 3))
        committed = waits("committed")
        task = await running(stub, acks_all("t", build_batch(values(4)), wait_ms=10_000))
        assert (await fetch(stub, "t", 0, epoch=3)).log_end_offset == 4
        # The follower's next fetch says it has them: the high watermark passes the append.
        await fetch(stub, "t", 4, epoch=3)
        response = await asyncio.wait_for(task, 5)
        [result] = response.results
        assert (result.error_code, result.log_end_offset, result.high_watermark) == (0, 4, 4)
        assert list(result.commit_isr) == [0, 1]
        assert 200_000 <= response.commit_wait_us < 5_000_000  # held while the test slept
        assert waits("committed") == committed + 1

    run_node(tmp_path, body)


def test_an_append_not_committed_within_the_wait_is_answered_as_appended(
        tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "t", state("t", LEADER, 3))
        handed_on = waits("handed_on")
        started = time.monotonic()
        response = await stub.Append(acks_all("t", build_batch(values(2)), wait_ms=400))
        assert time.monotonic() - started >= 0.35  # held for the wait (timers may fire early)
        [result] = response.results
        assert (result.error_code, result.log_end_offset, result.high_watermark) == (0, 2, 0)
        assert list(result.commit_isr) == []
        assert waits("handed_on") == handed_on + 1
        # acks=1 (no min_insync_replicas) is never held.
        started = time.monotonic()
        [result] = (await stub.Append(acks_all("t", build_batch(values(1)), wait_ms=10_000,
                                               min_insync=0))).results
        assert (result.log_end_offset, result.high_watermark) == (3, 0)
        assert time.monotonic() - started < 5
        # Nor is an append the leader's own ISR commits at once.
        assert await become(stub, state("t", LEADER, 3, alone=True)) == [0]
        response = await stub.Append(acks_all("t", build_batch(values(1)), wait_ms=10_000))
        assert (response.results[0].high_watermark, response.commit_wait_us) == (4, 0)

    run_node(tmp_path, body)


def test_the_isr_that_commits_the_append_is_in_the_answer(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "t", state("t", LEADER, 3))
        task = await running(stub, acks_all("t", build_batch(values(2)), wait_ms=10_000,
                                            min_insync=2))
        # The follower falls out of the ISR at the same epoch: the leader alone commits.
        assert await become(stub, state("t", LEADER, 3, alone=True)) == [0]
        [result] = (await asyncio.wait_for(task, 5)).results
        assert (result.high_watermark, list(result.commit_isr)) == (2, [0])

    run_node(tmp_path, body)


def test_a_leader_that_steps_down_answers_at_once_as_appended(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "t", state("t", LEADER, 3))
        task = await running(stub, acks_all("t", build_batch(values(2)), wait_ms=10_000))
        started = time.monotonic()
        assert await become(stub, state("t", FOLLOWER, 4)) == [0]
        [result] = (await asyncio.wait_for(task, 5)).results
        assert time.monotonic() - started < 5
        assert (result.error_code, result.high_watermark, list(result.commit_isr)) == (0, 0, [])

    run_node(tmp_path, body)


def test_a_transaction_marker_is_held_like_an_acks_all_append(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "t", state("t", LEADER, 3))
        request = log_pb2.WriteTxnMarkersRequest(commit_wait_ms=10_000, markers=[
            log_pb2.TxnMarker(producer_id=9, producer_epoch=0, committed=True,
                              coordinator_epoch=0,
                              partitions=[log_pb2.TopicPartition(topic="t", partition=0)])])
        task = asyncio.ensure_future(stub.WriteTxnMarkers(request))
        await asyncio.sleep(0.3)
        assert not task.done()
        assert (await fetch(stub, "t", 0, epoch=3)).log_end_offset == 1
        await fetch(stub, "t", 1, epoch=3)
        response = await asyncio.wait_for(task, 5)
        [marker] = response.markers
        [result] = marker.partitions
        assert (result.error_code, result.base_offset, result.log_end_offset,
                result.high_watermark) == (0, 0, 1, 1)
        assert 200_000 <= response.commit_wait_us < 5_000_000  # held while the test slept
        # Without a wait it is answered as written.
        request.commit_wait_ms = 0
        response = await asyncio.wait_for(stub.WriteTxnMarkers(request), 5)
        assert response.commit_wait_us == 0
        [marker] = response.markers
        assert (marker.partitions[0].log_end_offset, marker.partitions[0].high_watermark) == (
            2, 1)

    run_node(tmp_path, body)
