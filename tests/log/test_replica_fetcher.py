"""Follower fetching between two real log nodes (no replicator: the states and settings it
would send are sent here): the follower holds the leader's batches byte for byte over either
transport, the leader's high watermark follows the follower's position and the follower's the
leader's, the log start offset follows the leader's, a follower behind the leader's log start
starts over there, and a follower whose log parted from its new leader's is cut back first."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from services.common.channels import insecure_channel
from services.common.file_records import FileRecordsReader
from services.common.records.record_batch import iter_batches
from services.log.config import LogConfig
from services.log.partition_log import PartitionLog
from services.log.server import LogService, start

from ..log_records import own
from ..record_batches import build_batch, values

TIMEOUT = 60
LEADER = log_pb2.REPLICA_ROLE_LEADER
FOLLOWER = log_pb2.REPLICA_ROLE_FOLLOWER


class Node:
    def __init__(self, service: LogService) -> None:
        self.service = service
        self.channel = insecure_channel(f"127.0.0.1:{service.port}")
        self.stub = log_pb2_grpc.LogServiceStub(self.channel)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.service.port}"

    def log(self, topic: str) -> PartitionLog:
        return self.service.manager.get(topic, 0)


@contextlib.asynccontextmanager
async def two_nodes(tmp_path: Path, transport: str = "stream", local_files: bool = True,
                    **settings: str) -> AsyncIterator[tuple[Node, Node]]:
    services = []
    try:
        for node_id in (0, 1):
            services.append(await start(LogConfig(
                node_id=node_id, data_dir=str(tmp_path / f"log-{node_id}"),
                grpc_address="127.0.0.1:0", replica_fetch_transport=transport,
                local_files=local_files)))
        nodes = [Node(s) for s in services]
        message = log_pb2.ReplicationSettings(
            configs={"replica.fetch.wait.max.ms": "200", "replica.fetch.backoff.ms": "50",
                     **settings},
            log_nodes={0: nodes[0].address, 1: nodes[1].address})
        for node in nodes:
            await node.stub.UpdateReplicationSettings(message)
        yield nodes[0], nodes[1]
        for node in nodes:
            await node.channel.close()
    finally:
        for service in services:
            await service.stop(0)


def states(topic: str, epoch: int, leader: int = 0, isr: tuple[int, ...] = (0, 1),
           partition_epoch: int = 1) -> list[log_pb2.ReplicaState]:
    """The states of both nodes' replicas of ``topic``-0, by node."""
    return [log_pb2.ReplicaState(
        topic=topic, partition=0, leader_epoch=epoch, leader=leader, replicas=[0, 1],
        isr=isr, partition_epoch=partition_epoch,
        role=LEADER if node == leader else FOLLOWER) for node in (0, 1)]


async def create(nodes: tuple[Node, Node], topic: str, epoch: int = 0, **configs: str) -> None:
    for node, state in zip(nodes, states(topic, epoch), strict=True):
        response = await node.stub.CreatePartitions(log_pb2.CreatePartitionsRequest(
            partitions=[log_pb2.PartitionSpec(topic=topic, partition=0, topic_id="tid",
                                              state=state, configs=configs)]))
        assert [r.error_code for r in response.results] == [0]


async def give(nodes: tuple[Node, Node], new_states: list[log_pb2.ReplicaState]) -> None:
    """Each node its state."""
    for node, state in zip(nodes, new_states, strict=True):
        response = await node.stub.UpdateReplicaStates(
            log_pb2.UpdateReplicaStatesRequest(states=[state]))
        assert [r.error_code for r in response.results] == [0]


async def append(node: Node, topic: str, records: bytes) -> log_pb2.PartitionAppendResult:
    response = await node.stub.Append(log_pb2.AppendRequest(partitions=[
        log_pb2.PartitionAppend(topic=topic, partition=0, records=records)]))
    return response.results[0]


def everything(node: Node, topic: str) -> bytes:
    partition_log = node.log(topic)
    out, offset = b"", partition_log.log_start_offset
    while offset < partition_log.log_end_offset:
        data = partition_log.read(offset, 1 << 20, log_pb2.READ_LIMIT_LOG_END)
        out += data
        *_, last = iter_batches(data)
        offset = last.header.next_offset
    return out


async def eventually(condition: Callable[[], bool | Awaitable[bool]], within: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("transport", ["stream", "unary"])
@pytest.mark.parametrize("local_files", [True, False], ids=["files", "carried"])
def test_a_follower_holds_the_leaders_batches_and_both_high_watermarks_follow(
        tmp_path: Path, transport: str, local_files: bool) -> None:
    """Its batches read from the leader's segment files (both nodes on this host), or carried
    in the leader's answers."""
    async def main() -> None:
        async with two_nodes(tmp_path, transport, local_files) as (leader, follower):
            await create((leader, follower), "t", epoch=2)
            end = 0
            for n in range(1, 20):
                result = await append(leader, "t", build_batch(values(n % 4 + 1)))
                assert result.error_code == 0
                end = result.log_end_offset
            await eventually(lambda: leader.log("t").high_watermark == end
                             and follower.log("t").high_watermark == end)
            assert everything(follower, "t") == everything(leader, "t")
            assert {b.header.partition_leader_epoch
                    for b in iter_batches(everything(follower, "t"))} == {2}

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))


def test_ranges_a_follower_cannot_read_as_named_are_fetched_again_carried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As when the leader's segment is replaced or cut between its answer and the read."""
    unreadable: list[str] = []

    def gone(self: FileRecordsReader, path: str, inode: int, position: int,
             size: int) -> bytes | None:
        unreadable.append(path)
        return None

    async def main() -> None:
        async with two_nodes(tmp_path) as (leader, follower):
            await create((leader, follower), "t", epoch=1)
            result = await append(leader, "t", build_batch(values(3)))
            await eventually(lambda: follower.log("t").log_end_offset == 3)
            monkeypatch.setattr(FileRecordsReader, "read", gone)
            result = await append(leader, "t", build_batch(values(4)))
            await eventually(lambda: follower.log("t").high_watermark == result.log_end_offset)
            assert everything(follower, "t") == everything(leader, "t")
            assert len(unreadable) == 1

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))


def test_the_log_start_offset_follows_the_leaders_within_the_high_watermark(
        tmp_path: Path) -> None:
    async def main() -> None:
        async with two_nodes(tmp_path) as (leader, follower):
            await create((leader, follower), "t")
            for _ in range(3):
                end = (await append(leader, "t", build_batch(values(3)))).log_end_offset
            await eventually(lambda: follower.log("t").high_watermark == end)
            await leader.service.manager.delete_records("t", 0, 6)
            await append(leader, "t", build_batch(values(1)))
            await eventually(lambda: follower.log("t").log_start_offset == 6)

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))


def test_a_follower_behind_the_leaders_log_start_starts_over_there(tmp_path: Path) -> None:
    async def main() -> None:
        async with two_nodes(tmp_path) as (leader, follower):
            # The follower was away: the leader leads alone meanwhile and deletes records.
            alone = states("t", 0, isr=(0,))
            response = await leader.stub.CreatePartitions(log_pb2.CreatePartitionsRequest(
                partitions=[log_pb2.PartitionSpec(topic="t", partition=0, topic_id="tid",
                                                  state=alone[0])]))
            assert response.results[0].error_code == 0
            for _ in range(4):
                await append(leader, "t", build_batch(values(3)))
            assert await leader.service.manager.delete_records("t", 0, 9) == 9
            response = await follower.stub.CreatePartitions(log_pb2.CreatePartitionsRequest(
                partitions=[log_pb2.PartitionSpec(topic="t", partition=0, topic_id="tid",
                                                  state=alone[1])]))
            assert response.results[0].error_code == 0
            await eventually(lambda: follower.log("t").log_end_offset == 12)
            assert (follower.log("t").log_start_offset, everything(follower, "t")) == (
                9, everything(leader, "t"))

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))


def test_a_follower_is_cut_back_to_its_new_leader_before_it_fetches(tmp_path: Path) -> None:
    async def main() -> None:
        async with two_nodes(tmp_path) as (zero, one):
            await create((zero, one), "t")
            committed = (await append(zero, "t", build_batch(values(3)))).log_end_offset
            await eventually(lambda: one.log("t").high_watermark == committed)
            # Node 1 leads alone at epoch 1 (node 0 is not told): node 0 still takes appends
            # at epoch 0 that 1 never gets; then 1 leads at epoch 2 and 0 follows it.
            response = await one.stub.UpdateReplicaStates(log_pb2.UpdateReplicaStatesRequest(
                states=[states("t", 1, leader=1, isr=(1,), partition_epoch=2)[1]]))
            assert response.results[0].error_code == 0
            lost = await append(zero, "t", build_batch(values(2)))
            assert lost.error_code == 0 and lost.log_end_offset == committed + 2
            written = await append(one, "t", build_batch(values(4)))
            assert written.error_code == 0 and written.base_offset == committed
            await give((zero, one), states("t", 2, leader=1, partition_epoch=3))
            await eventually(lambda: zero.log("t").log_end_offset == committed + 4
                             and everything(zero, "t") == everything(one, "t"))
            assert zero.log("t").leader_epochs.latest_epoch == 1

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))


def test_a_leader_address_the_follower_may_not_dial_is_logged_once_and_waits_for_new_settings(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with two_nodes(tmp_path) as (leader, follower):
            # Plaintext gRPC is for loopback only: the follower cannot dial this address.
            settings = log_pb2.ReplicationSettings(
                configs={"replica.fetch.wait.max.ms": "200", "replica.fetch.backoff.ms": "50"},
                log_nodes={0: "leader.example:9093", 1: follower.address})
            await follower.stub.UpdateReplicationSettings(settings)
            await create((leader, follower), "t", epoch=1)
            end = (await append(leader, "t", build_batch(values(3)))).log_end_offset
            await asyncio.sleep(1.0)  # twenty backoffs' worth
            assert follower.log("t").log_end_offset == 0
            refused = [r for r in caplog.records if "cannot reach it" in r.getMessage()]
            assert len(refused) == 1 and refused[0].levelname == "ERROR", refused
            assert "leader.example:9093" in refused[0].getMessage()
            assert not [r for r in own(caplog.records) if r.exc_info], "a traceback was logged"
            # Settings naming the leader's real address: the follower catches up.
            settings.log_nodes[0] = leader.address
            await follower.stub.UpdateReplicationSettings(settings)
            await eventually(lambda: follower.log("t").log_end_offset == end)

    with caplog.at_level("INFO"):
        asyncio.run(asyncio.wait_for(main(), TIMEOUT))
