"""The frontend's view of the cluster metadata: it follows the replicator's WatchMetadata
stream, waits for a replicator that is not up yet, reconnects after one restarts, and tells
its listeners of every snapshot."""

from __future__ import annotations

import asyncio
import socket

import grpc

from kbroker.replicator.v1 import replicator_pb2, replicator_pb2_grpc
from services.common.tls import InternalTls
from services.frontend.cluster_view import ClusterView


class Replicator(replicator_pb2_grpc.ReplicatorServicer):
    def __init__(self, version: int) -> None:
        self.version = version

    async def WatchMetadata(self, request, context):
        yield replicator_pb2.ClusterMetadata(version=self.version, cluster_id="c")
        await asyncio.Event().wait()


async def serve(port: int, version: int) -> grpc.aio.Server:
    server = grpc.aio.server()
    replicator_pb2_grpc.add_ReplicatorServicer_to_server(Replicator(version), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_follows_a_replicator_that_starts_late_and_restarts() -> None:
    async def main() -> None:
        port = free_port()
        view = ClusterView.of_replicator(f"127.0.0.1:{port}", InternalTls())
        seen: list[int] = []
        view.add_listener(lambda snapshot: seen.append(snapshot.version))
        view.start()
        try:
            await asyncio.sleep(0.5)  # nothing to follow yet
            assert view.latest is None and seen == []
            server = await serve(port, 7)
            await asyncio.wait_for(view.updated.wait(), 10)
            assert view.latest is not None and view.latest.version == 7
            # A restarted replicator's first snapshot is current, even with a lower version.
            await server.stop(0)
            view.updated.clear()
            server = await serve(port, 2)
            await asyncio.wait_for(view.updated.wait(), 15)
            assert seen == [7, 2]
            late: list[int] = []
            view.add_listener(lambda snapshot: late.append(snapshot.version))
            assert late == [2], "a new listener hears the current snapshot at once"
            await server.stop(0)
        finally:
            await view.stop()

    asyncio.run(main())


def test_no_replicator_configured_means_an_empty_view() -> None:
    async def main() -> None:
        view = ClusterView.of_replicator("", InternalTls())
        view.start()
        await view.stop()
        assert view.latest is None

    asyncio.run(main())
