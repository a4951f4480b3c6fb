"""Service tests of a log node's replication side: replica states (leader, follower, epochs,
ISRs), follower fetches served (positions, the high watermark, the long poll, epoch fencing),
ISR changes asked for on the control stream, follower appends and cuts, OffsetForLeaderEpoch,
and what a replicated replica is after a restart. Real LogService on port 0 (node 0), data in
tmp_path."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import NamedTuple

import grpc

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from services.common.channels import insecure_channel
from services.common.errors import ErrorCode, KafkaError
from services.common.file_records import FileRecordsReader, local_host_key
from services.common.progress_reports import Progress
from services.common.records.record_batch import iter_batches
from services.log.config import LogConfig
from services.log.purgatory_notifier import PurgatoryNotifier
from services.log.server import LogService, leader_high_watermarks, start

from ..record_batches import build_batch, values
from .test_service import append, describe, read, run_node

LEADER = log_pb2.REPLICA_ROLE_LEADER
FOLLOWER = log_pb2.REPLICA_ROLE_FOLLOWER
LOG_END = log_pb2.READ_LIMIT_LOG_END
# This node is node 0; its peer in the states below is node 1.
PEER = 1


def state(topic: str, role: int, epoch: int, alone: bool = False, partition: int = 0,
          partition_epoch: int = 0) -> log_pb2.ReplicaState:
    """A state of node 0's replica: a leader with follower 1 (in the ISR unless ``alone``),
    or a follower of node 1."""
    if role == LEADER:
        leader, replicas, isr = 0, [0, PEER], [0] if alone else [0, PEER]
    else:
        leader, replicas, isr = PEER, [PEER, 0], [PEER, 0]
    return log_pb2.ReplicaState(topic=topic, partition=partition, role=role, leader_epoch=epoch,
                                in_sync_alone=alone, leader=leader, replicas=replicas, isr=isr,
                                partition_epoch=partition_epoch)


async def create_with(stub: log_pb2_grpc.LogServiceStub, topic: str,
                      replica: log_pb2.ReplicaState) -> None:
    response = await stub.CreatePartitions(log_pb2.CreatePartitionsRequest(partitions=[
        log_pb2.PartitionSpec(topic=topic, partition=0, topic_id="tid", state=replica)]))
    assert [r.error_code for r in response.results] == [0]


async def become(stub: log_pb2_grpc.LogServiceStub, *states: log_pb2.ReplicaState) -> list[int]:
    response = await stub.UpdateReplicaStates(log_pb2.UpdateReplicaStatesRequest(states=states))
    return [r.error_code for r in response.results]


class Copied(NamedTuple):
    error_code: int
    log_end_offset: int
    high_watermark: int


async def replicate(service: LogService, topic: str, records: bytes, epoch: int,
                    high_watermark: int = -1) -> Copied:
    """A follower append, as the node's fetcher makes it."""
    partition_log = service.manager.get(topic, 0)
    try:
        await partition_log.append_as_follower(records, epoch, high_watermark)
        code = 0
    except KafkaError as exc:
        code = exc.errno
    return Copied(code, partition_log.log_end_offset, partition_log.high_watermark)


async def fetch(stub: log_pb2_grpc.LogServiceStub, topic: str, offset: int, epoch: int,
                replica: int = PEER, max_wait_ms: int = 0) -> log_pb2.ReplicaFetchResult:
    """One follower fetch of ``topic``-0 by node ``replica`` at ``offset``."""
    response = await stub.ReplicaFetchOnce(log_pb2.ReplicaFetchRequest(
        replica_id=replica, max_wait_ms=max_wait_ms, partitions=[log_pb2.ReplicaFetchPartition(
            topic=topic, partition=0, leader_epoch=epoch, fetch_offset=offset,
            max_bytes=1 << 20)]))
    [result] = response.results
    return result


def epochs_of(records: bytes) -> list[int]:
    return [b.header.partition_leader_epoch for b in iter_batches(records)]


def test_a_leader_stamps_its_epoch_and_a_follower_refuses_client_appends(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "led", state("led", LEADER, 4))
        await create_with(stub, "followed", state("followed", FOLLOWER, 4))
        result = await append(stub, "led", build_batch(values(2), partition_leader_epoch=-1))
        assert (result.error_code, result.log_end_offset) == (0, 2)
        # Replicated: the leader's own append does not commit anything.
        assert result.high_watermark == 0
        stored = await stub.Read(log_pb2.ReadRequest(limit=LOG_END, partitions=[
            log_pb2.PartitionRead(topic="led", partition=0, offset=0, max_bytes=1 << 20)]))
        assert epochs_of(stored.results[0].records) == [4]
        refused = await append(stub, "followed", build_batch(values(1)))
        assert refused.error_code == ErrorCode.not_leader_or_follower.value
        described = await describe(stub, "led")
        assert (described.role, described.leader_epoch, described.latest_log_epoch) == (
            LEADER, 4, 4)

    run_node(tmp_path, body)


def test_a_leader_alone_in_the_isr_commits_at_once(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "t", state("t", LEADER, 0))
        await append(stub, "t", build_batch(values(3)))
        assert (await describe(stub, "t")).high_watermark == 0
        # The ISR shrank to the leader: everything it has is committed.
        assert await become(stub, state("t", LEADER, 0, alone=True)) == [0]
        assert (await describe(stub, "t")).high_watermark == 3
        result = await append(stub, "t", build_batch(values(2)))
        assert result.high_watermark == result.log_end_offset == 5

    run_node(tmp_path, body)


def test_states_from_older_epochs_are_fenced(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "t", state("t", FOLLOWER, 5))
        assert await become(stub, state("t", LEADER, 4)) == [ErrorCode.fenced_leader_epoch.value]
        assert await become(stub, state("t", LEADER, 6), state("nope", LEADER, 1)) == [
            0, ErrorCode.unknown_topic_or_partition.value]
        assert (await describe(stub, "t")).role == LEADER

    run_node(tmp_path, body)


def test_follower_appends_copy_the_leaders_batches_exactly(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "lead", state("lead", LEADER, 2))
        await create_with(stub, "copy", state("copy", FOLLOWER, 2))
        await append(stub, "lead", build_batch(values(3), producer_id=9, producer_epoch=0,
                                               base_sequence=0))
        await append(stub, "lead", build_batch(values(1)))
        await append(stub, "lead", build_batch(values(4)))
        leader = (await stub.Read(log_pb2.ReadRequest(limit=LOG_END, partitions=[
            log_pb2.PartitionRead(topic="lead", partition=0, offset=0, max_bytes=1 << 20)])))
        records = leader.results[0].records
        result = await replicate(service, "copy", records, epoch=2, high_watermark=6)
        assert (result.error_code, result.log_end_offset, result.high_watermark) == (0, 8, 6)
        copied = await stub.Read(log_pb2.ReadRequest(limit=LOG_END, partitions=[
            log_pb2.PartitionRead(topic="copy", partition=0, offset=0, max_bytes=1 << 20)]))
        assert copied.results[0].records == records
        assert (await describe(stub, "copy")).latest_log_epoch == 2
        # Nothing new: only the high watermark moves, never backwards.
        moved = await replicate(service, "copy", b"", epoch=2, high_watermark=8)
        assert moved.high_watermark == 8
        assert (await replicate(service, "copy", b"", epoch=2,
                                high_watermark=1)).high_watermark == 8

    run_node(tmp_path, body)


def test_follower_appends_that_overlap_the_log_store_nothing(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "t", state("t", FOLLOWER, 1))
        first = build_batch(values(2), base_offset=0)
        assert (await replicate(service, "t", first, epoch=1)).log_end_offset == 2
        overlap = await replicate(service, "t", first, epoch=1)
        assert (overlap.error_code, overlap.log_end_offset) == (
            ErrorCode.offset_out_of_range.value, 2)
        # Within one append too: a batch going back below the one before it.
        back = build_batch(values(2), base_offset=4) + build_batch(values(2), base_offset=3)
        assert (await replicate(service, "t", back, epoch=1)).error_code == \
            ErrorCode.offset_out_of_range.value
        corrupt = bytearray(build_batch(values(2), base_offset=2))
        corrupt[70] ^= 1
        damaged = await replicate(service, "t", bytes(corrupt), epoch=1)
        assert damaged.error_code == ErrorCode.corrupt_message.value
        assert (await replicate(service, "t", build_batch(values(1), base_offset=2), epoch=0)
                ).error_code == ErrorCode.fenced_leader_epoch.value
        assert (await replicate(service, "t", build_batch(values(1), base_offset=2), epoch=3)
                ).error_code == ErrorCode.unknown_leader_epoch.value
        assert (await describe(stub, "t")).log_end_offset == 2
        # A gap is no error (a compacted leader's log has them): the log goes on after it.
        gap = await replicate(service, "t", build_batch(values(2), base_offset=5), epoch=1)
        assert (gap.error_code, gap.log_end_offset) == (0, 7)
        after_gap = await stub.Read(log_pb2.ReadRequest(limit=LOG_END, partitions=[
            log_pb2.PartitionRead(topic="t", partition=0, offset=2, max_bytes=1 << 20)]))
        assert [b.header.base_offset for b in iter_batches(after_gap.results[0].records)] == [5]

    run_node(tmp_path, body)


def test_a_follower_behind_its_leaders_log_start_starts_over(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "t", state("t", FOLLOWER, 0))
        batch = build_batch(values(3), producer_id=4, producer_epoch=0, base_sequence=0,
                            partition_leader_epoch=0)
        assert (await replicate(service, "t", batch, epoch=0)).log_end_offset == 3
        follower = service.manager.get("t", 0)
        await follower.start_over_at(40)
        assert (follower.log_end_offset, follower.high_watermark) == (40, 40)
        described = await describe(stub, "t")
        assert (described.log_start_offset, described.log_end_offset) == (40, 40)
        assert described.latest_log_epoch == -1
        assert (await read(stub, "t", 3)).error_code == ErrorCode.offset_out_of_range.value
        assert (await replicate(service, "t", build_batch(values(2), base_offset=40),
                                epoch=0)).log_end_offset == 42
        # The producer state went with the data: a sequence from before is no duplicate.
        assert await become(stub, state("t", LEADER, 1)) == [0]
        again = await append(stub, "t", build_batch(values(3), producer_id=4,
                                                    producer_epoch=0, base_sequence=0))
        assert (again.error_code, again.base_offset) == (0, 42)

    run_node(tmp_path, body)


def test_a_leader_refuses_follower_appends(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "t", state("t", LEADER, 1))
        refused = await replicate(service, "t", build_batch(values(1)), epoch=1)
        assert refused.error_code == ErrorCode.not_leader_or_follower.value

    run_node(tmp_path, body)


def test_a_follower_fetch_is_its_position_and_moves_the_high_watermark(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "t", state("t", LEADER, 3))
        await append(stub, "t", build_batch(values(5)))
        first = await fetch(stub, "t", 0, epoch=3)
        assert (first.error_code, first.high_watermark, first.log_end_offset) == (0, 0, 5)
        assert [b.header.base_offset for b in iter_batches(first.records)] == [0]
        # The next fetch says the follower has it all: committed.
        second = await fetch(stub, "t", 5, epoch=3)
        assert (second.records, second.high_watermark) == (b"", 5)
        assert (await read(stub, "t", 0)).high_watermark == 5
        # An epoch the leader does not have, a node that holds no replica, a replica that
        # does not lead: the fetch is refused and no position is recorded.
        assert (await fetch(stub, "t", 5, epoch=2)).error_code == \
            ErrorCode.fenced_leader_epoch.value
        assert (await fetch(stub, "t", 5, epoch=4)).error_code == \
            ErrorCode.unknown_leader_epoch.value
        assert (await fetch(stub, "t", 5, epoch=3, replica=7)).error_code == \
            ErrorCode.not_leader_or_follower.value
        await create_with(stub, "f", state("f", FOLLOWER, 3))
        assert (await fetch(stub, "f", 0, epoch=3)).error_code == \
            ErrorCode.not_leader_or_follower.value
        beyond = await fetch(stub, "t", 9, epoch=3)
        assert (beyond.error_code, beyond.log_end_offset) == (
            ErrorCode.offset_out_of_range.value, 5)

    run_node(tmp_path, body)


def test_a_follower_on_this_host_gets_ranges_of_the_leaders_segment_files(
        tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "t", state("t", LEADER, 1))
        await append(stub, "t", build_batch(values(5)))
        await append(stub, "t", build_batch(values(2)))
        carried = await fetch(stub, "t", 0, epoch=1)
        named = (await stub.ReplicaFetchOnce(log_pb2.ReplicaFetchRequest(
            replica_id=PEER, local_reader=local_host_key(), partitions=[
                log_pb2.ReplicaFetchPartition(topic="t", partition=0, leader_epoch=1,
                                              fetch_offset=0, max_bytes=1 << 20)]))).results[0]
        assert named.records == b"" and named.log_end_offset == carried.log_end_offset == 7
        files = named.file_records
        reader = FileRecordsReader()
        assert reader.read(files.path, files.inode, files.position,
                           files.size) == carried.records
        reader.close()
        # Nothing to read: neither batches nor a range.
        caught_up = (await stub.ReplicaFetchOnce(log_pb2.ReplicaFetchRequest(
            replica_id=PEER, local_reader=local_host_key(), partitions=[
                log_pb2.ReplicaFetchPartition(topic="t", partition=0, leader_epoch=1,
                                              fetch_offset=7, max_bytes=1 << 20)]))).results[0]
        assert not caught_up.HasField("file_records") and caught_up.high_watermark == 7

    run_node(tmp_path, body)


def test_a_follower_fetch_waits_for_data_on_its_session(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "t", state("t", LEADER, 0))
        session = stub.ReplicaFetch()
        request = log_pb2.ReplicaFetchRequest(replica_id=PEER, max_wait_ms=5000, partitions=[
            log_pb2.ReplicaFetchPartition(topic="t", partition=0, leader_epoch=0,
                                          fetch_offset=0, max_bytes=1 << 20)])
        started = time.monotonic()
        await session.write(request)
        waiting = asyncio.ensure_future(session.read())
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await append(stub, "t", build_batch(values(2)))
        response = await asyncio.wait_for(waiting, 3)
        assert [b.header.base_offset for b in iter_batches(response.results[0].records)] == [0]
        assert time.monotonic() - started < 3
        # The next request on the session reports the follower at 2: committed.
        request.partitions[0].fetch_offset = 2
        request.max_wait_ms = 200
        started = time.monotonic()
        await session.write(request)
        empty = await session.read()
        assert empty.results[0].records == b"" and time.monotonic() - started >= 0.19
        assert empty.results[0].high_watermark == 2
        # A new state answers a waiting fetch at once, with the error it now gets.
        request.max_wait_ms = 5000
        await session.write(request)
        waiting = asyncio.ensure_future(session.read())
        await asyncio.sleep(0.2)
        assert await become(stub, state("t", LEADER, 1)) == [0]
        fenced = await asyncio.wait_for(waiting, 3)
        assert fenced.results[0].error_code == ErrorCode.fenced_leader_epoch.value
        session.cancel()

    run_node(tmp_path, body)


async def next_isr_change(changes: grpc.aio.StreamStreamCall) -> log_pb2.IsrChange:
    message = await asyncio.wait_for(changes.read(), 10)
    [change] = message.changes
    return change


def test_a_leader_asks_to_add_a_caught_up_follower_and_stops_committing_alone(
        tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "t", state("t", LEADER, 2, alone=True, partition_epoch=7))
        await append(stub, "t", build_batch(values(3)))
        assert (await describe(stub, "t")).high_watermark == 3  # alone: committed at once
        changes = stub.AlterPartitions()
        assert (await fetch(stub, "t", 0, epoch=2)).records
        caught_up = await fetch(stub, "t", 3, epoch=2)
        assert caught_up.high_watermark == 3
        change = await next_isr_change(changes)
        assert (change.topic, change.leader, change.leader_epoch, change.partition_epoch,
                list(change.current_isr), list(change.new_isr)) == ("t", 0, 2, 7, [0], [0, 1])
        # Until the change is answered the follower counts: appends wait for it.
        later = await append(stub, "t", build_batch(values(2)))
        assert later.high_watermark == 3
        answer = state("t", LEADER, 2, partition_epoch=8)
        await changes.write(log_pb2.IsrChangeAnswers(answers=[log_pb2.IsrChangeAnswer(
            topic="t", partition=0, state=answer)]))
        for _ in range(500):
            if (await describe(stub, "t")).partition_epoch == 8:
                break
            await asyncio.sleep(0.01)
        assert (await describe(stub, "t")).partition_epoch == 8
        assert (await fetch(stub, "t", 5, epoch=2)).high_watermark == 5
        changes.cancel()

    run_node(tmp_path, body)


def test_a_leader_asks_to_remove_a_follower_that_stopped_fetching(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await stub.UpdateReplicationSettings(log_pb2.ReplicationSettings(
            configs={"replica.lag.time.max.ms": "200"}))
        changes = stub.AlterPartitions()
        started = time.monotonic()
        await create_with(stub, "t", state("t", LEADER, 0, partition_epoch=3))
        await append(stub, "t", build_batch(values(3)))
        change = await next_isr_change(changes)
        assert time.monotonic() - started >= 0.19
        assert (list(change.current_isr), list(change.new_isr)) == ([0, 1], [0])
        # A retriable answer: asked again a while later.
        await changes.write(log_pb2.IsrChangeAnswers(answers=[log_pb2.IsrChangeAnswer(
            topic="t", partition=0, error_code=ErrorCode.request_timed_out.value)]))
        again = await next_isr_change(changes)
        assert list(again.new_isr) == [0]
        # A new control stream (another replicator) is sent what is still pending.
        changes.cancel()
        other = stub.AlterPartitions()
        assert list((await next_isr_change(other)).new_isr) == [0]
        await other.write(log_pb2.IsrChangeAnswers(answers=[log_pb2.IsrChangeAnswer(
            topic="t", partition=0, state=state("t", LEADER, 0, alone=True, partition_epoch=4))]))
        for _ in range(500):
            if (await describe(stub, "t")).high_watermark == 3:
                break
            await asyncio.sleep(0.01)
        assert (await describe(stub, "t")).high_watermark == 3  # alone now: committed
        other.cancel()

    run_node(tmp_path, body)


def test_a_leader_that_was_stopped_does_not_blame_its_followers(tmp_path: Path) -> None:
    """The node's event loop stands still for longer than replica.lag.time.max.ms (as under
    SIGSTOP): no follower could fetch meanwhile, so none leaves the ISR for it; one that then
    stops fetching leaves after the lag time the leader ran."""
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await stub.UpdateReplicationSettings(log_pb2.ReplicationSettings(
            configs={"replica.lag.time.max.ms": "600"}))
        changes = stub.AlterPartitions()
        await create_with(stub, "t", state("t", LEADER, 0, partition_epoch=3))
        await append(stub, "t", build_batch(values(3)))
        await fetch(stub, "t", 3, epoch=0)  # caught up
        reading = asyncio.get_running_loop().create_task(next_isr_change(changes))
        time.sleep(1.5)  # noqa: ASYNC251 - the whole node stands still
        started = time.monotonic()
        change = await reading  # the follower never fetched again
        # A wall clock would have removed it at once.
        assert 0.25 <= time.monotonic() - started < 1.5
        assert (list(change.current_isr), list(change.new_isr)) == ([0, 1], [0])
        changes.cancel()

    run_node(tmp_path, body)


def test_a_stale_state_of_the_same_epoch_changes_nothing(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "t", state("t", LEADER, 1, alone=True, partition_epoch=5))
        await append(stub, "t", build_batch(values(2)))
        assert await become(stub, state("t", LEADER, 1, partition_epoch=4)) == [0]
        described = await describe(stub, "t")
        assert (described.partition_epoch, described.high_watermark) == (5, 2)
        assert (await append(stub, "t", build_batch(values(1)))).high_watermark == 3

    run_node(tmp_path, body)


def test_a_long_poll_read_returns_as_soon_as_data_arrives(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "t", state("t", LEADER, 0))
        request = log_pb2.ReadRequest(limit=LOG_END, max_wait_ms=5000, partitions=[
            log_pb2.PartitionRead(topic="t", partition=0, offset=0, max_bytes=1 << 20)])
        started = time.monotonic()
        waiting = asyncio.ensure_future(stub.Read(request))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await append(stub, "t", build_batch(values(2)))
        response = await asyncio.wait_for(waiting, 3)
        assert [b.header.base_offset for b in iter_batches(response.results[0].records)] == [0]
        assert time.monotonic() - started < 3
        # Nothing arrives: the read answers empty after its wait.
        request.partitions[0].offset = 2
        request.max_wait_ms = 200
        started = time.monotonic()
        empty = await stub.Read(request)
        assert empty.results[0].records == b"" and time.monotonic() - started >= 0.19

    run_node(tmp_path, body)


def test_offset_for_leader_epoch(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "t", state("t", LEADER, 1))
        await append(stub, "t", build_batch(values(3)))
        assert await become(stub, state("t", LEADER, 4)) == [0]
        await append(stub, "t", build_batch(values(2)))
        response = await stub.OffsetForLeaderEpoch(log_pb2.OffsetForLeaderEpochRequest(
            partitions=[log_pb2.PartitionLeaderEpoch(topic="t", partition=0, leader_epoch=e)
                        for e in (1, 2, 4, 7)] + [
                log_pb2.PartitionLeaderEpoch(topic="x", partition=0, leader_epoch=1)]))
        assert [(r.error_code, r.leader_epoch, r.end_offset) for r in response.results] == [
            (0, 1, 3), (0, 1, 3), (0, 4, 5), (0, -1, -1),
            (ErrorCode.unknown_topic_or_partition.value, -1, -1)]

    run_node(tmp_path, body)


def test_a_replicated_replica_waits_for_its_state_after_a_restart(tmp_path: Path) -> None:
    async def main() -> None:
        config = LogConfig(data_dir=str(tmp_path / "data"), grpc_address="127.0.0.1:0")
        service = await start(config)
        try:
            channel = insecure_channel(f"127.0.0.1:{service.port}")
            stub = log_pb2_grpc.LogServiceStub(channel)
            await create_with(stub, "replicated", state("replicated", LEADER, 2))
            await create_with(stub, "alone", state("alone", LEADER, 0, alone=True))
            for topic in ("replicated", "alone"):
                await append(stub, topic, build_batch(values(4)))
            assert (await fetch(stub, "replicated", 4, epoch=2)).high_watermark == 4
            await channel.close()
        finally:
            await service.stop(0)
        service = await start(config)
        channel = insecure_channel(f"127.0.0.1:{service.port}")
        stub = log_pb2_grpc.LogServiceStub(channel)
        try:
            replicated = await describe(stub, "replicated")
            assert (replicated.role, replicated.leader_epoch) == (
                log_pb2.REPLICA_ROLE_UNKNOWN, 2)
            # The high watermark checkpointed at the clean shutdown: committed, so readable.
            assert (replicated.log_end_offset, replicated.high_watermark) == (4, 4)
            refused = await append(stub, "replicated", build_batch(values(1)))
            assert refused.error_code == ErrorCode.not_leader_or_follower.value
            alone = await describe(stub, "alone")
            assert (alone.role, alone.high_watermark) == (LEADER, 4)
            assert (await append(stub, "alone", build_batch(values(1)))).error_code == 0
            assert await become(stub, state("replicated", LEADER, 2)) == [0]
            assert (await append(stub, "replicated", build_batch(values(1)))).error_code == 0
        finally:
            await channel.close()
            await service.stop(0)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_follower_is_cut_back_to_its_new_leaders_log(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "t", state("t", FOLLOWER, 1))
        offset = 0
        for n, epoch in ((3, 0), (2, 1), (4, 1), (1, 1)):  # batches of 3, 2, 4 and 1 records
            batch = build_batch(values(n), base_offset=offset, partition_leader_epoch=epoch,
                                producer_id=7, producer_epoch=0, base_sequence=offset)
            assert (await replicate(service, "t", batch, epoch=1)).error_code == 0
            offset += n
        await replicate(service, "t", b"", epoch=1, high_watermark=10)

        async def cut(to: int) -> Copied:
            partition_log = service.manager.get("t", 0)
            try:
                await partition_log.truncate_to(to)
                code = 0
            except KafkaError as exc:
                code = exc.errno
            return Copied(code, partition_log.log_end_offset, partition_log.high_watermark)

        # Offset 7 lies inside the batch 5..8: the cut comes before it.
        result = await cut(7)
        assert (result.error_code, result.log_end_offset, result.high_watermark) == (0, 5, 5)
        kept = await stub.Read(log_pb2.ReadRequest(limit=LOG_END, partitions=[
            log_pb2.PartitionRead(topic="t", partition=0, offset=0, max_bytes=1 << 20)]))
        assert [(b.header.base_offset, b.header.last_offset)
                for b in iter_batches(kept.results[0].records)] == [(0, 2), (3, 4)]
        assert (await cut(9)).log_end_offset == 5  # past the end: nothing changes
        # The log goes on from the cut, the producer's sequence from the last batch kept.
        again = build_batch(values(2), base_offset=5, partition_leader_epoch=2, producer_id=7,
                            producer_epoch=0, base_sequence=5)
        assert await become(stub, state("t", FOLLOWER, 2)) == [0]
        assert (await replicate(service, "t", again, epoch=2)).log_end_offset == 7
        assert await become(stub, state("t", LEADER, 3)) == [0]
        duplicate = await append(stub, "t", build_batch(values(2), producer_id=7,
                                                        producer_epoch=0, base_sequence=5))
        assert (duplicate.error_code, duplicate.base_offset) == (0, 5)
        assert (await cut(2)).error_code == ErrorCode.not_leader_or_follower.value
        epochs = await stub.OffsetForLeaderEpoch(log_pb2.OffsetForLeaderEpochRequest(
            partitions=[log_pb2.PartitionLeaderEpoch(topic="t", partition=0, leader_epoch=1)]))
        assert (epochs.results[0].leader_epoch, epochs.results[0].end_offset) == (1, 5)

    run_node(tmp_path, body)


def test_a_cut_across_segments_keeps_a_consistent_log(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "t", state("t", FOLLOWER, 0))
        for offset in range(0, 40, 4):
            batch = build_batch(values(4, size=100), base_offset=offset, partition_leader_epoch=0)
            assert (await replicate(service, "t", batch, epoch=0)).error_code == 0
        assert (await describe(stub, "t")).segments > 3
        assert await service.manager.get("t", 0).truncate_to(12) == 12
        described = await describe(stub, "t")
        assert described.log_end_offset == 12
        assert (await read(stub, "t", 11)).error_code == 0
        assert (await read(stub, "t", 13)).error_code == ErrorCode.offset_out_of_range.value
        batch = build_batch(values(4, size=100), base_offset=12, partition_leader_epoch=0)
        assert (await replicate(service, "t", batch, epoch=0)).log_end_offset == 16

    run_node(tmp_path, body, segment_bytes=1000)


def test_leaders_report_their_high_watermark_per_epoch_too_with_their_isr(
        tmp_path: Path) -> None:
    reported: list[tuple[str, int, tuple[int, ...]]] = []

    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "t", state("t", LEADER, 5, alone=True))
        notifier = PurgatoryNotifier("127.0.0.1:1")
        notifier.report = lambda key, position, isr=(): reported.append(  # type: ignore[method-assign]
            (key, position, tuple(isr)))
        for partition_log in service.manager.partitions():
            partition_log._on_high_watermark = notifier.on_high_watermark
        await append(stub, "t", build_batch(values(2)))
        assert reported == [("t-0", 2, ()), ("t-0@5@tid", 2, (0,))]
        # With a follower in the ISR the high watermark waits for it; when the ISR shrinks
        # back to the leader alone it moves at once, and the report names that ISR: an acks=all
        # write it satisfies did not reach two replicas.
        reported.clear()
        assert await become(stub, state("t", LEADER, 5, partition_epoch=1)) == [0]
        await append(stub, "t", build_batch(values(2)))
        assert reported == []
        assert await become(stub, state("t", LEADER, 5, alone=True, partition_epoch=2)) == [0]
        assert reported == [("t-0", 4, ()), ("t-0@5@tid", 4, (0,))]
        # What a newly watched epoch key is answered with carries the ISR too.
        position_of = leader_high_watermarks(service.manager)
        assert position_of("t-0@5@tid") == Progress(4, (0,))
        assert position_of("t-0") == Progress(4, ())
        await notifier.close()

    run_node(tmp_path, body)


def test_only_leaders_report_high_watermarks(tmp_path: Path) -> None:
    reported: list[tuple[str, int, int]] = []

    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "lead", state("lead", LEADER, 0, alone=True))
        await create_with(stub, "copy", state("copy", FOLLOWER, 0))
        for partition_log in service.manager.partitions():
            partition_log._on_high_watermark = lambda *args: reported.append(args)
        await append(stub, "lead", build_batch(values(2)))
        await replicate(service, "copy", build_batch(values(2)), epoch=0, high_watermark=2)
        assert reported == [("lead", 0, 2, 0, "tid", (0,))]

    run_node(tmp_path, body)


def test_a_leader_stepping_down_reports_the_end_of_its_epoch(tmp_path: Path) -> None:
    ended: list[tuple[str, int, int, int]] = []

    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        service.replicas._on_epoch_ended = lambda *args: ended.append(args)
        await create_with(stub, "t", state("t", LEADER, 1))
        await append(stub, "t", build_batch(values(3)))
        assert (await fetch(stub, "t", 3, epoch=1)).high_watermark == 3
        await append(stub, "t", build_batch(values(2)))
        assert await become(stub, state("t", LEADER, 1, partition_epoch=2)) == [0]
        assert ended == []  # the same epoch goes on
        assert await become(stub, state("t", FOLLOWER, 2)) == [0]
        # What waits on epoch 1 beyond its last high watermark fails.
        assert ended == [("t", 0, 1, 3, "tid")]
        # And so does what is parked on it later, when the purgatory asks about the key.
        position_of = leader_high_watermarks(service.manager)
        assert position_of("t-0@1@tid") == Progress(
            -1, error_code=ErrorCode.not_leader_or_follower.value)
        assert position_of("t-0@2@tid") is None  # a follower's epoch
        assert position_of("t-0@1@other") is None  # another topic of the same name
        assert position_of("t-0") is None

    run_node(tmp_path, body)
