"""The gRPC clients' own logic: failure classification, metadata conversion and channel
upkeep (the calls themselves run in test_service.py), and the stream the produce waits share
to a real purgatory."""

import asyncio
from pathlib import Path

import grpc

from kbroker.purgatory.v1 import purgatory_pb2
from kbroker.replicator.v1 import replicator_pb2
from services.common.tls import InternalTls
from services.handler.clients import (
    LogNodeClients,
    PurgatoryClient,
    call_failure,
    metadata_from_proto,
)
from services.handler.collaborators import OutcomeUnknownError, UnreachableError
from services.purgatory.config import PurgatoryConfig
from services.purgatory.server import start as start_purgatory

from ..tls_material import internal_tls_dir
from .fakes import cluster


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def test_only_failures_to_connect_are_unreachable():
    refused = rpc_error(grpc.StatusCode.UNAVAILABLE,
                        "failed to connect to all addresses; last error: UNKNOWN: "
                        "ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused")
    assert isinstance(call_failure(refused, "x"), UnreachableError)
    for code, details in [(grpc.StatusCode.UNAVAILABLE, "Socket closed"),
                          (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"),
                          (grpc.StatusCode.INTERNAL, "boom")]:
        assert isinstance(call_failure(rpc_error(code, details), "x"), OutcomeUnknownError)


def test_replicator_metadata_becomes_a_snapshot():
    message = replicator_pb2.ClusterMetadata(
        version=4, cluster_id="c", controller_id=1,
        log_nodes=[replicator_pb2.LogNode(node_id=1, address="h:1", rack="", alive=True),
                   replicator_pb2.LogNode(node_id=2, address="h:2", rack="r2", alive=False)],
        topics=[replicator_pb2.TopicMetadata(
            name="t", topic_id="5F7C0E53-7BD1-4D52-9B67-1B2A1C3E4F50", configs={"a": "b"},
            partitions=[replicator_pb2.PartitionMetadata(partition=0, leader=2, leader_epoch=3,
                                                         replicas=[2, 1], isr=[2])])])
    snapshot = metadata_from_proto(message)
    assert (snapshot.version, snapshot.cluster_id, snapshot.controller_id) == (4, "c", 1)
    assert snapshot.log_nodes[1].rack is None and snapshot.log_nodes[2].rack == "r2"
    topic = snapshot.topic("t")
    assert topic.topic_id == "5f7c0e53-7bd1-4d52-9b67-1b2a1c3e4f50"
    assert dict(topic.configs) == {"a": "b"}
    assert topic.partitions[0].replicas == (2, 1)
    assert snapshot.offline_replicas(topic.partitions[0]) == [2]


def test_channels_of_departed_log_nodes_are_closed(tmp_path: Path):
    # Log nodes off loopback (node-N:1) are reached over TLS only.
    internal_tls_dir(tmp_path)
    tls = InternalTls(str(tmp_path / "ca.crt"), str(tmp_path / "handler.crt"),
                      str(tmp_path / "handler.key"))

    async def main():
        clients = LogNodeClients(tls)
        snapshot = cluster(nodes=(0, 1))
        for node in snapshot.log_nodes.values():
            clients._stub(node)
        assert set(clients._stubs) == {"node-0:1", "node-1:1"}
        clients.on_metadata(cluster(nodes=(1,)))
        assert set(clients._stubs) == {"node-1:1"}
        await clients.close()
        assert set(clients._stubs) == set()

    asyncio.run(main())


def test_an_unreachable_purgatory_fails_fast():
    async def main():
        purgatory = PurgatoryClient("127.0.0.1:1")
        try:
            return await asyncio.wait_for(
                purgatory.wait(purgatory_pb2.OPERATION_KIND_FETCH, {"t-0": 1}, False, 10_000), 5)
        except UnreachableError:
            return "unreachable"
        finally:
            await purgatory.close()

    assert asyncio.run(main()) == "unreachable"


def test_produce_waits_share_a_stream_to_the_purgatory():
    async def main():
        service = await start_purgatory(PurgatoryConfig(grpc_address="127.0.0.1:0"))
        purgatory = PurgatoryClient(f"127.0.0.1:{service.port}")
        try:
            waits = [asyncio.ensure_future(purgatory.wait(
                purgatory_pb2.OPERATION_KIND_PRODUCE, {f"t-{i}": 2}, True, 10_000))
                for i in range(3)]
            expired = await purgatory.wait(purgatory_pb2.OPERATION_KIND_PRODUCE, {"t-9": 1},
                                           True, 50)
            assert expired.outcome == purgatory_pb2.OUTCOME_EXPIRED
            for i in (2, 0, 1):
                await purgatory.complete({f"t-{i}": 2})
                answer = await asyncio.wait_for(waits[i], 5)
                assert answer.outcome == purgatory_pb2.OUTCOME_COMPLETED
                assert [(k.key, k.position) for k in answer.keys] == [(f"t-{i}", 2)]
            # All of them on one stream.
            assert purgatory._await_stream.in_flight == 0
            assert purgatory._await_stream._call is not None
        finally:
            await purgatory.close()
            await service.stop(0)

    asyncio.run(main())


def test_an_unreachable_purgatory_fails_a_produce_wait_fast():
    async def main():
        purgatory = PurgatoryClient("127.0.0.1:1")
        try:
            return await asyncio.wait_for(
                purgatory.wait(purgatory_pb2.OPERATION_KIND_PRODUCE, {"t-0": 1}, True, 10_000),
                5)
        except UnreachableError:
            return "unreachable"
        finally:
            await purgatory.close()

    assert asyncio.run(main()) == "unreachable"
