"""Controlled shutdown with real log nodes, purgatory and replicator: a log node that is
stopped hands its leaderships over to in-sync followers at the next epoch before it stops,
answering the appends that reach it meanwhile NOT_LEADER_OR_FOLLOWER; appends it took are on
the new leader and their acks=all waits complete; the controller keeps a node in controlled
shutdown out of every ISR while it asks, and lets it back once it stops asking; a node whose
replicator cannot be reached stops after its retries."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

from prometheus_client import REGISTRY

from kbroker.log.v1 import log_pb2
from kbroker.purgatory.v1 import purgatory_pb2_grpc
from kbroker.replicator.v1 import replicator_pb2 as pb
from services.common.channels import insecure_channel
from services.common.errors import ErrorCode
from services.common.progress_reports import epoch_key
from services.local_cluster import free_port
from services.purgatory.config import PurgatoryConfig
from services.purgatory.server import start as start_purgatory

from ...record_batches import build_batch, values
from .harness import Node, Replication, wait_for
from .test_service import converged

TIMEOUT = 60.0
NOT_LEADER = ErrorCode.not_leader_or_follower.value


@contextlib.asynccontextmanager
async def cluster(tmp_path: Path, nodes: int = 3, **replicator_settings: object
                  ) -> AsyncIterator[Replication]:
    """The replication harness with log nodes that know the replicator (its port is chosen
    first), so that stopping one is a controlled shutdown."""
    replicator = f"127.0.0.1:{free_port()}"
    purgatory = await start_purgatory(PurgatoryConfig(grpc_address="127.0.0.1:0"))
    purgatory_channel = insecure_channel(f"127.0.0.1:{purgatory.port}")
    settings = {"replicator_address": replicator, "controlled_shutdown_retry_backoff_ms": 100}
    log_nodes = [Node(i, tmp_path / f"log-{i}", f"127.0.0.1:{purgatory.port}",
                      settings=settings) for i in range(nodes)]
    r = Replication(tmp_path, log_nodes, purgatory,
                    purgatory_pb2_grpc.PurgatoryStub(purgatory_channel),
                    {"grpc_address": replicator, **replicator_settings})
    try:
        for node in log_nodes:
            await node.start()
        await r.start_replicator()
        yield r
    finally:
        await r.stop_replicator()
        for node in log_nodes:
            await node.stop()
        await purgatory_channel.close()
        await purgatory.stop(0)


def run(tmp_path: Path, scenario, **replicator_settings: object) -> None:
    async def main() -> None:
        async with cluster(tmp_path, **replicator_settings) as r:
            await scenario(r)

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))

# The harness fences a silent node after 0.4 s; a node in controlled shutdown that stopped
# asking is released after as long. Tests that look at a node between its hand-over and its
# stop give it longer.
PATIENT = {"node_session_timeout_ms": 5000}


def elections(kind: str) -> float:
    """The replicator's leader elections of ``kind`` so far (this process's registry)."""
    return REGISTRY.get_sample_value("kbroker_replicator_leader_elections_total",
                                     {"kind": kind}) or 0.0


async def in_controlled_shutdown(r: Replication, node_id: int) -> bool:
    metadata = await r.stub.GetMetadata(pb.GetMetadataRequest())
    return next(n.in_controlled_shutdown for n in metadata.log_nodes if n.node_id == node_id)


def test_a_stopping_leader_hands_over_to_an_in_sync_follower_first(tmp_path: Path) -> None:
    async def scenario(r: Replication) -> None:
        await r.create_topic("handed", replication=3)
        before = await r.partition("handed")
        old = r.node(before.leader)
        first = await old.append("handed", build_batch(values(3)))
        await wait_for(lambda: converged(r, "handed", first.log_end_offset))
        controlled, clean = elections("controlled"), elections("clean")
        preferred = elections("preferred")

        # Appends keep coming while the leader stops, each awaited in the purgatory as an
        # acks=all produce is: each is taken (and then committed) or refused
        # NOT_LEADER_OR_FOLLOWER, nothing else.
        taken: list[log_pb2.PartitionAppendResult] = []
        waits: list[asyncio.Future] = []
        refused = 0

        async def keep_appending() -> None:
            nonlocal refused
            while True:
                result = await old.append("handed", build_batch(values(2)))
                if result.error_code == NOT_LEADER:
                    refused += 1
                    return
                assert result.error_code == 0, result
                taken.append(result)
                waits.append(asyncio.ensure_future(r.await_produce(
                    epoch_key("handed", 0, result.leader_epoch, result.topic_id),
                    result.log_end_offset, 10_000)))
                await asyncio.sleep(0.002)

        appending = asyncio.ensure_future(keep_appending())
        await asyncio.sleep(0.05)
        assert old.service is not None
        handed_over = await old.service.shutdown.run()
        await asyncio.wait_for(appending, 5)
        assert handed_over and refused == 1 and taken

        # Before the node stops, the partition has moved: the next epoch, led by a follower
        # that was in sync, and the stopping node out of the ISR and marked.
        after = await r.partition("handed")
        assert after.leader != old.node_id and after.leader in before.isr
        assert after.leader_epoch == before.leader_epoch + 1
        assert old.node_id not in after.isr and len(after.isr) == 2
        assert await in_controlled_shutdown(r, old.node_id)
        # What the old leader took was drained to the followers first: its acks=all waits
        # complete, and the new leader has it.
        for done in await asyncio.gather(*waits):
            assert done.keys[0].error_code == 0, done
        new = r.node(after.leader)
        assert await new.read_all("handed") == await old.read_all("handed")
        assert elections("controlled") == controlled + 1 and elections("clean") == clean

        await old.stop()
        # Gone, the node is fenced; nothing is left to elect.
        await wait_for(lambda: _not(r.stub.GetMetadata(pb.GetMetadataRequest()), old.node_id))
        assert elections("clean") == clean
        assert not await in_controlled_shutdown(r, old.node_id)

        # Restarted, it follows, catches up, rejoins the ISR and gets its preferred
        # leadership back through the auto leader rebalance.
        await old.start()
        written = await new.append("handed", build_batch(values(1)))
        assert written.error_code == 0 and written.leader_epoch == after.leader_epoch

        async def led_again() -> bool:
            meta = await r.partition("handed")
            return meta.leader == old.node_id and len(meta.isr) == 3
        await wait_for(led_again)
        assert elections("preferred") == preferred + 1

    run(tmp_path, scenario, **PATIENT, auto_leader_rebalance_enable=True,
        leader_imbalance_check_interval_ms=200)


async def _not(metadata, node_id: int) -> bool:
    """Whether ``node_id`` is fenced in ``metadata`` (awaited)."""
    return next(n.fenced for n in (await metadata).log_nodes if n.node_id == node_id)


def test_a_node_in_controlled_shutdown_stays_out_of_the_isr_until_it_stops_asking(
        tmp_path: Path) -> None:
    async def scenario(r: Replication) -> None:
        await r.create_topic("kept-out", partitions=3, replication=3)
        await r.create_topic("alone", replication=1)
        (alone,) = (await r.stub.GetMetadata(pb.GetMetadataRequest(topics=["alone"]))
                    ).topics[0].partitions
        asking = alone.leader
        answer = await r.stub.ControlledShutdown(pb.ControlledShutdownRequest(node_id=asking))
        assert answer.error_code == 0
        # A single replica cannot move: the node keeps leading it, and says so.
        assert [(p.topic, p.partition) for p in answer.remaining_leaderships] == [("alone", 0)]
        metadata = await r.stub.GetMetadata(pb.GetMetadataRequest(topics=["kept-out"]))
        for p in metadata.topics[0].partitions:
            assert p.leader != asking and asking not in p.isr, p
        # New replicas go elsewhere.
        await r.stub.ControlledShutdown(pb.ControlledShutdownRequest(node_id=asking))
        await r.create_topic("placed", partitions=3, replication=2)
        placed = await r.stub.GetMetadata(pb.GetMetadataRequest(topics=["placed"]))
        assert all(asking not in p.replicas for p in placed.topics[0].partitions)
        # Caught up, it still stays out while it keeps asking (the session timeout is 0.4 s).
        leader = r.node(metadata.topics[0].partitions[0].leader)
        result = await leader.append("kept-out", build_batch(values(2)))
        assert result.error_code == 0
        until = time.monotonic() + 1.5
        while time.monotonic() < until:
            await r.stub.ControlledShutdown(pb.ControlledShutdownRequest(node_id=asking))
            assert asking not in (await r.partition("kept-out")).isr
            await asyncio.sleep(0.1)
        # Once it stops asking, it is an ordinary follower again and rejoins.
        await wait_for(lambda: _rejoined(r, asking))
        assert not await in_controlled_shutdown(r, asking)

        unknown = await r.stub.ControlledShutdown(pb.ControlledShutdownRequest(node_id=7))
        assert unknown.error_code == ErrorCode.broker_id_not_registered.value

    run(tmp_path, scenario)


async def _rejoined(r: Replication, node_id: int) -> bool:
    metadata = await r.stub.GetMetadata(pb.GetMetadataRequest(topics=["kept-out"]))
    return all(node_id in p.isr for p in metadata.topics[0].partitions)


def test_without_a_reachable_replicator_a_node_stops_after_its_retries(tmp_path: Path) -> None:
    async def scenario(r: Replication) -> None:
        await r.create_topic("stranded", replication=3)
        meta = await r.partition("stranded")
        await r.stop_replicator()
        leader = r.node(meta.leader)
        assert leader.service is not None
        started = time.monotonic()
        assert not await leader.service.shutdown.run()
        # Three retries 0.1 s apart, not the 30 s timeout.
        assert time.monotonic() - started < 5
        refused = await leader.append("stranded", build_batch(values(1)))
        assert refused.error_code == NOT_LEADER
        await r.start_replicator()

    run(tmp_path, scenario)
