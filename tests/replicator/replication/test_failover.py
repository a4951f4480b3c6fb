"""Failover with real log nodes, purgatory and replicator: a leader that stops answering is
fenced, a replica of its ISR leads at the next epoch, acks=all waits on the old epoch fail,
and the old leader comes back as a follower cut back to the new leader's log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from kbroker.log.v1 import log_pb2
from kbroker.replicator.v1 import replicator_pb2 as pb
from services.common.errors import ErrorCode
from services.common.progress_reports import epoch_key

from ...record_batches import build_batch, values
from .harness import Replication, wait_for
from .test_service import converged, run


async def leader_changed(r: Replication, topic: str, old_epoch: int) -> bool:
    meta = await r.partition(topic)
    return meta.leader_epoch > old_epoch


def test_a_fenced_leader_is_replaced_and_comes_back_as_a_cut_follower(tmp_path: Path) -> None:
    async def scenario(r: Replication) -> None:
        await r.create_topic("failover", replication=3)
        meta = await r.partition("failover")
        old = r.node(meta.leader)
        committed = await old.append("failover", build_batch(values(3)))
        await wait_for(lambda: converged(r, "failover", committed.log_end_offset))

        # With its followers stopped (and no replicator to shrink the ISR), the next batch
        # stays on the old leader, uncommitted, and its acks=all wait is pending on the
        # epoch-0 key.
        await r.stop_replicator()
        followers = [r.node(n) for n in meta.replicas[1:]]
        for follower in followers:
            await follower.stop()
        lost = await old.append("failover", build_batch(values(2)))
        assert lost.leader_epoch == 0 and lost.high_watermark < lost.log_end_offset
        waiting = asyncio.ensure_future(
            r.await_produce(epoch_key("failover", 0, 0, lost.topic_id), lost.log_end_offset,
                            20_000))
        await old.stop()
        for follower in followers:
            await follower.start()
        await r.start_replicator()

        await wait_for(lambda: leader_changed(r, "failover", 0))
        after = await r.partition("failover")
        assert after.leader_epoch == 1 and after.leader in meta.replicas[1:]
        assert old.node_id not in after.isr
        # The wait on the old epoch fails at once: the new leader does not have the batch.
        answer = await asyncio.wait_for(waiting, 10)
        assert answer.keys[0].error_code == ErrorCode.not_leader_or_follower.value
        new = r.node(after.leader)

        async def leading() -> bool:
            return (await new.describe("failover")).role == log_pb2.REPLICA_ROLE_LEADER

        await wait_for(leading)
        written = await new.append("failover", build_batch(values(4)))
        assert written.error_code == 0 and written.leader_epoch == 1
        assert written.base_offset == committed.log_end_offset
        done = await r.await_produce(epoch_key("failover", 0, 1, written.topic_id),
                                     written.log_end_offset, 10_000)
        assert done.keys[0].error_code == 0

        # The old leader returns: it follows at epoch 1, its uncommitted batch cut away.
        await old.start()
        await wait_for(lambda: _rejoined(r, old.node_id))
        await wait_for(lambda: converged(r, "failover", written.log_end_offset))
        copies = [await r.node(n).read_all("failover") for n in meta.replicas]
        assert copies[0] == copies[1] == copies[2]
        state = await old.describe("failover")
        assert (state.role, state.leader_epoch, state.latest_log_epoch) == (
            log_pb2.REPLICA_ROLE_FOLLOWER, 1, 1)

    run(tmp_path, scenario)


async def _rejoined(r: Replication, node_id: int) -> bool:
    return node_id in (await r.partition("failover")).isr


def test_a_partition_without_an_in_sync_replica_waits_for_its_leader(tmp_path: Path) -> None:
    async def scenario(r: Replication) -> None:
        await r.create_topic("offline", replication=2)
        meta = await r.partition("offline")
        leader, follower = r.node(meta.leader), r.node(meta.replicas[1])
        await follower.stop()
        await wait_for(lambda: _isr_is(r, "offline", [meta.leader]))
        await leader.stop()
        await follower.start()
        # The follower is behind: it must not lead (no unclean election by default).
        await asyncio.sleep(1.5)
        still = await r.partition("offline")
        assert (still.leader, still.leader_epoch) == (meta.leader, 0)
        await leader.start()

        async def leads_again() -> bool:
            try:
                return (await leader.describe("offline")).role == log_pb2.REPLICA_ROLE_LEADER
            except grpc.aio.AioRpcError:
                return False  # the channel may still be backing off from the node's absence

        await wait_for(leads_again)
        assert (await leader.append("offline", build_batch(values(1)))).error_code == 0

    run(tmp_path, scenario)


async def _isr_is(r: Replication, topic: str, isr: list[int]) -> bool:
    return list((await r.partition(topic)).isr) == isr


def test_a_replica_placed_on_a_node_that_was_down_is_created_when_it_returns(
    tmp_path: Path,
) -> None:
    async def scenario(r: Replication) -> None:
        late = r.node(2)
        await late.stop()

        async def down() -> bool:
            metadata = await r.stub.GetMetadata(pb.GetMetadataRequest())
            return not next(n.alive for n in metadata.log_nodes if n.node_id == 2)

        await wait_for(down)
        reply = await r.stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.NewTopic(
            name="late", num_partitions=-1, replication_factor=-1,
            assignments={0: pb.Replicas(node_ids=[0, 1, 2])})]))
        assert reply.topics[0].error_code == 0
        assert list((await r.partition("late")).isr) == [0, 1]
        leader = r.node(0)
        written = await leader.append("late", build_batch(values(5)))
        await late.start()
        await wait_for(lambda: _isr_is(r, "late", [0, 1, 2]))
        await wait_for(lambda: converged(r, "late", written.log_end_offset))
        assert await late.read_all("late") == await leader.read_all("late")

    run(tmp_path, scenario)


def test_leadership_goes_back_to_the_preferred_replica(tmp_path: Path) -> None:
    async def scenario(r: Replication) -> None:
        await r.create_topic("preferred", replication=3)
        meta = await r.partition("preferred")
        first = r.node(meta.leader)
        assert meta.leader == meta.replicas[0]
        await first.stop()
        await wait_for(lambda: leader_changed(r, "preferred", 0))
        await first.start()

        async def back() -> bool:
            now = await r.partition("preferred")
            return now.leader == meta.leader and now.leader_epoch == 2

        await wait_for(back)

        async def leading() -> bool:
            try:
                return (await first.describe("preferred")).role == log_pb2.REPLICA_ROLE_LEADER
            except grpc.aio.AioRpcError:
                return False

        await wait_for(leading)
        written = await first.append("preferred", build_batch(values(2)))
        assert written.error_code == 0 and written.leader_epoch == 2
        await wait_for(lambda: converged(r, "preferred", written.log_end_offset))

    run(tmp_path, scenario, auto_leader_rebalance_enable=True,
        leader_imbalance_check_interval_ms=200)


def test_a_follower_behind_the_leaders_log_start_starts_over_there(tmp_path: Path) -> None:
    async def scenario(r: Replication) -> None:
        await r.create_topic("pruned", replication=3)
        meta = await r.partition("pruned")
        leader, gone = r.node(meta.leader), r.node(meta.replicas[2])
        first = await leader.append("pruned", build_batch(values(3)))
        await wait_for(lambda: converged(r, "pruned", first.log_end_offset))
        await gone.stop()
        await wait_for(lambda: _isr_is(r, "pruned", list(meta.replicas[:2])))
        written = await leader.append("pruned", build_batch(values(6)))
        await wait_for(lambda: _committed(leader, written.log_end_offset))
        deleted = await leader.stub.DeleteRecords(log_pb2.DeleteRecordsRequest(partitions=[
            log_pb2.PartitionDeleteRecords(topic="pruned", partition=0, offset=7)]))
        assert deleted.results[0].low_watermark == 7
        await gone.start()
        await wait_for(lambda: _isr_is(r, "pruned", list(meta.replicas)))
        await wait_for(lambda: converged(r, "pruned", written.log_end_offset))
        state = await gone.describe("pruned")
        assert (state.log_start_offset, state.log_end_offset) == (7, written.log_end_offset)

    run(tmp_path, scenario)


async def _committed(node, offset: int) -> bool:
    return (await node.describe("pruned")).high_watermark >= offset


def test_a_partition_moved_to_one_new_replica_is_led_there(tmp_path: Path) -> None:
    async def scenario(r: Replication) -> None:
        reply = await r.stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.NewTopic(
            name="moved", num_partitions=-1, replication_factor=-1,
            assignments={0: pb.Replicas(node_ids=[0])})]))
        assert reply.topics[0].error_code == 0
        first = await r.node(0).append("moved", build_batch(values(3)))
        assert first.high_watermark == first.log_end_offset == 3
        answer = await r.stub.AlterPartitionReassignments(pb.AlterPartitionReassignmentsRequest(
            reassignments=[pb.Reassignment(topic="moved", partition=0, replicas=[1])]))
        assert [a.error_code for a in answer.results] == [0]

        async def moved() -> bool:
            now = await r.partition("moved")
            return list(now.replicas) == [1] and now.leader == 1

        await wait_for(moved)
        # Node 1 was told it leads alone: it takes appends and commits them at once.
        await wait_for(lambda: _is_leader(r.node(1), "moved"))
        written = await r.node(1).append("moved", build_batch(values(2)))
        assert written.error_code == 0
        assert written.high_watermark == written.log_end_offset == 5

    run(tmp_path, scenario)


async def _is_leader(node, topic: str) -> bool:
    return (await node.describe(topic)).role == log_pb2.REPLICA_ROLE_LEADER
