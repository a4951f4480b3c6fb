"""Replication with real log nodes, purgatory and replicator: followers copy the leader's
batches byte for byte, the high watermark follows the ISR and completes acks=all waits in the
purgatory, the ISR shrinks when a follower stops and grows when it is back, and replica states
survive restarts of log nodes and of the replicator."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
from prometheus_client import REGISTRY

from kbroker.log.v1 import log_pb2
from kbroker.purgatory.v1 import purgatory_pb2
from services.common.errors import ErrorCode
from services.common.records.record_batch import iter_batches

from ...record_batches import build_batch, values
from .harness import Replication, replication, wait_for

TIMEOUT = 60


def run(tmp_path: Path, scenario, **settings: object) -> None:
    async def main() -> None:
        async with replication(tmp_path, **settings) as r:
            await scenario(r)

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))


async def converged(r: Replication, topic: str, end: int, partition: int = 0) -> bool:
    """Every replica holds ``end`` offsets and the leader's high watermark reached it."""
    meta = await r.partition(topic, partition)
    states = [await r.node(n).describe(topic, partition) for n in meta.replicas]
    leader = await r.node(meta.leader).describe(topic, partition)
    return all(s.log_end_offset == end for s in states) and leader.high_watermark == end


def test_followers_hold_the_leaders_batches_byte_for_byte(tmp_path: Path) -> None:
    async def scenario(r: Replication) -> None:
        await r.create_topic("copied", partitions=3, replication=3)
        meta = await r.partition("copied", 1)
        assert list(meta.isr) == list(meta.replicas) and meta.leader_epoch == 0
        leader = r.node(meta.leader)
        follower = r.node(meta.replicas[1])
        assert (await leader.describe("copied", 1)).role == log_pb2.REPLICA_ROLE_LEADER
        assert (await follower.describe("copied", 1)).role == log_pb2.REPLICA_ROLE_FOLLOWER
        end = 0
        for n in range(1, 30):
            result = await leader.append("copied", build_batch(values(n % 5 + 1)), 1)
            assert result.error_code == 0
            end = result.log_end_offset
        await wait_for(lambda: converged(r, "copied", end, 1))
        copies = [await r.node(n).read_all("copied", 1) for n in meta.replicas]
        assert copies[0] and copies[0] == copies[1] == copies[2]
        assert {b.header.partition_leader_epoch for b in iter_batches(copies[0])} == {0}
        # A follower refuses client appends.
        refused = await follower.append("copied", build_batch(values(1)), 1)
        assert refused.error_code == ErrorCode.not_leader_or_follower.value

    run(tmp_path, scenario)


def test_the_high_watermark_completes_acks_all_waits(tmp_path: Path) -> None:
    async def scenario(r: Replication) -> None:
        await r.create_topic("acked", replication=3)
        meta = await r.partition("acked")
        leader = r.node(meta.leader)
        timings = []
        for _ in range(20):
            started = time.perf_counter()
            result = await leader.append("acked", build_batch(values(2)))
            # The append alone commits nothing: the followers must have it first.
            assert result.high_watermark < result.log_end_offset
            answer = await r.await_produce("acked-0", result.log_end_offset, 5000)
            timings.append(time.perf_counter() - started)
            assert answer.outcome == purgatory_pb2.OUTCOME_COMPLETED
            assert answer.keys[0].position >= result.log_end_offset
        timings.sort()
        assert timings[len(timings) // 2] < 1.0, timings

    run(tmp_path, scenario)


def test_an_exited_follower_leaves_the_isr_at_once_and_rejoins_when_back(
        tmp_path: Path) -> None:
    async def scenario(r: Replication) -> None:
        await r.create_topic("lagging", replication=3)
        meta = await r.partition("lagging")
        leader = r.node(meta.leader)
        gone = r.node(meta.replicas[2])
        first = await leader.append("lagging", build_batch(values(3)))
        await wait_for(lambda: converged(r, "lagging", first.log_end_offset))
        await gone.stop()
        second = await leader.append("lagging", build_batch(values(4)))

        async def shrunk() -> bool:
            return gone.node_id not in (await r.partition("lagging")).isr

        # Its port refuses connections: fenced without waiting for the lag or the session
        # timeout (a silent node waits for them: test_partition_state, tests/replicator).
        await wait_for(shrunk)
        # The remaining ISR holds the new batch: it is committed without the stopped node.
        answer = await r.await_produce("lagging-0", second.log_end_offset, 5000)
        assert answer.outcome == purgatory_pb2.OUTCOME_COMPLETED
        third = await leader.append("lagging", build_batch(values(2)))

        await gone.start()

        async def expanded() -> bool:
            return gone.node_id in (await r.partition("lagging")).isr

        await wait_for(expanded)
        await wait_for(lambda: converged(r, "lagging", third.log_end_offset))
        assert await gone.read_all("lagging") == await leader.read_all("lagging")

    run(tmp_path, scenario)


def test_a_leader_alone_in_the_isr_commits_its_appends(tmp_path: Path) -> None:
    async def scenario(r: Replication) -> None:
        await r.create_topic("alone", replication=2)
        meta = await r.partition("alone")
        leader, follower = r.node(meta.leader), r.node(meta.replicas[1])
        await follower.stop()

        async def alone() -> bool:
            return list((await r.partition("alone")).isr) == [meta.leader]

        await wait_for(alone)
        await wait_for(lambda: _role_alone(leader, "alone"))
        result = await leader.append("alone", build_batch(values(3)))
        assert result.high_watermark == result.log_end_offset

        # The follower comes back: the leader stops committing alone before it rejoins, and
        # it holds everything committed when it does.
        await follower.start()

        async def rejoined() -> bool:
            return list((await r.partition("alone")).isr) == list(meta.replicas)

        await wait_for(rejoined)
        committed = (await leader.describe("alone")).high_watermark
        assert (await follower.describe("alone")).log_end_offset >= committed
        later = await leader.append("alone", build_batch(values(2)))
        assert later.high_watermark < later.log_end_offset
        await wait_for(lambda: converged(r, "alone", later.log_end_offset))

    run(tmp_path, scenario)


async def _role_alone(node, topic: str) -> bool:
    """The leader was told it is alone: it committed what it had (a replicated leader's
    high watermark lags its log end until the replicator moves it)."""
    await node.append(topic, build_batch(values(1)))
    state = await node.describe(topic)
    return state.high_watermark == state.log_end_offset


def test_replication_carries_on_across_log_node_and_replicator_restarts(tmp_path: Path) -> None:
    async def scenario(r: Replication) -> None:
        await r.create_topic("restarts", replication=3)
        meta = await r.partition("restarts")
        leader = r.node(meta.leader)
        first = await leader.append("restarts", build_batch(values(5)))
        await wait_for(lambda: converged(r, "restarts", first.log_end_offset))

        # The leader restarts: it comes back waiting for its state, and gets it again (as
        # a follower of a new leader if the replicator saw its port refuse connections; as
        # the leader still if it was back before).
        await leader.stop()
        await leader.start()

        async def serving_again() -> bool:
            now = await r.partition("restarts")
            try:
                return (now.leader >= 0 and sorted(now.isr) == sorted(now.replicas)
                        and await converged(r, "restarts", first.log_end_offset)
                        and await _is_leader(r.node(now.leader), "restarts"))
            except grpc.aio.AioRpcError:  # a channel still backing off from the restart
                return False

        await wait_for(serving_again)
        leader = r.node((await r.partition("restarts")).leader)
        second = await leader.append("restarts", build_batch(values(2)))
        assert second.error_code == 0

        # The replicator restarts: it learns the offsets again from the log nodes.
        await r.stop_replicator()
        third = await leader.append("restarts", build_batch(values(2)))
        assert third.high_watermark < third.log_end_offset
        await r.start_replicator()
        await wait_for(lambda: converged(r, "restarts", third.log_end_offset))
        copies = [await r.node(n).read_all("restarts") for n in meta.replicas]
        assert copies[0] == copies[1] == copies[2]

    run(tmp_path, scenario)


async def _is_leader(node, topic: str) -> bool:
    return (await node.describe(topic)).role == log_pb2.REPLICA_ROLE_LEADER


def sample(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_metrics_follow_lag_and_isr_changes(tmp_path: Path) -> None:
    async def scenario(r: Replication) -> None:
        await r.create_topic("measured", replication=3)
        meta = await r.partition("measured")
        leader, gone = r.node(meta.leader), r.node(meta.replicas[2])
        labels = {"topic": "measured", "partition": "0", "replica": str(gone.node_id)}
        copied = sample("kbroker_log_replication_in_bytes_total")
        served = sample("kbroker_log_replication_out_bytes_total")
        first = await leader.append("measured", build_batch(values(3)))
        await wait_for(lambda: converged(r, "measured", first.log_end_offset))
        shrinks = sample("kbroker_replicator_isr_shrinks_total")
        expands = sample("kbroker_replicator_isr_expands_total")
        # Two followers copied the batch: their nodes counted it in, the leader's out.
        assert sample("kbroker_log_replication_in_bytes_total") - copied == 2 * len(
            build_batch(values(3)))
        assert sample("kbroker_log_replication_out_bytes_total") - served == 2 * len(
            build_batch(values(3)))
        await gone.stop()
        await leader.append("measured", build_batch(values(4)))

        async def lagging() -> bool:
            return (sample("kbroker_log_follower_lag_messages", **labels) == 4
                    and sample("kbroker_log_follower_lag_seconds", **labels) > 0.3)

        await wait_for(lagging)

        async def shrunk() -> bool:
            return (sample("kbroker_replicator_isr_shrinks_total") >= shrinks + 1
                    and sample("kbroker_replicator_under_replicated_partitions") == 1)

        await wait_for(shrunk)
        await gone.start()

        async def caught_up() -> bool:
            return (sample("kbroker_replicator_isr_expands_total") >= expands + 1
                    and sample("kbroker_log_follower_lag_messages", **labels) == 0
                    and sample("kbroker_replicator_under_replicated_partitions") == 0)

        await wait_for(caught_up)
        assert sample("kbroker_log_isr_change_requests_total", kind="expand") >= 1

    run(tmp_path, scenario)
