"""Appends over one long-lived stream per log node (``LogNodeClients.append`` on
``LogService.AppendStream``), against a real log node on port 0: concurrent calls are matched
to their answers (in batches: the log node takes them), offsets follow arrival order per
partition, and a log node that goes away fails the calls in flight the way a unary call would,
after which a new stream is opened."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from services.common.call_streams import CallStream
from services.common.channels import insecure_channel
from services.handler.clients import LogNodeClients, status_failure
from services.handler.collaborators import OutcomeUnknownError, UnreachableError
from services.handler.metadata_cache import LogNode
from services.log.config import LogConfig
from services.log.server import start

from ..record_batches import build_batch, values

TIMEOUT = 60.0


def run(coroutine_factory) -> None:
    asyncio.run(asyncio.wait_for(coroutine_factory(), TIMEOUT))


async def _create(address: str, topics: list[str]) -> None:
    channel = insecure_channel(address)
    try:
        stub = log_pb2_grpc.LogServiceStub(channel)
        response = await stub.CreatePartitions(log_pb2.CreatePartitionsRequest(partitions=[
            log_pb2.PartitionSpec(topic=t, partition=0, topic_id="tid") for t in topics]))
        assert [r.error_code for r in response.results] == [0] * len(topics)
    finally:
        await channel.close()


def test_concurrent_appends_share_one_stream_and_get_their_own_answers(tmp_path: Path) -> None:
    async def main() -> None:
        service = await start(LogConfig(data_dir=str(tmp_path / "data"),
                                        grpc_address="127.0.0.1:0"))
        address = f"127.0.0.1:{service.port}"
        clients = LogNodeClients()
        try:
            await _create(address, ["a", "b"])
            node = LogNode(node_id=0, address=address)

            async def one(topic: str, records: int) -> int:
                batch = build_batch(values(records))
                [result] = (await clients.append(node, log_pb2.AppendRequest(partitions=[
                    log_pb2.PartitionAppend(topic=topic, partition=0, records=batch)]),
                    10.0)).results
                assert (result.topic, result.error_code) == (topic, 0)
                return result.base_offset

            # 40 appends in flight at once over the same stream, of 1 or 2 records each.
            offsets = await asyncio.gather(
                *(one("a" if i % 2 else "b", 1 + i % 2) for i in range(40)))
            assert len(clients._append_streams) == 1
            # The log node said it takes batched appends.
            assert clients._append_streams[address].batching
            # Per partition, offsets follow the order the appends were sent in.
            a_offsets = [o for i, o in enumerate(offsets) if i % 2]
            b_offsets = [o for i, o in enumerate(offsets) if not i % 2]
            assert a_offsets == list(range(0, 40, 2))
            assert b_offsets == list(range(20))
            # A bad batch is that append's error only.
            bad = bytearray(build_batch(values(1)))
            bad[-1] ^= 0xFF
            [result] = (await clients.append(node, log_pb2.AppendRequest(partitions=[
                log_pb2.PartitionAppend(topic="a", partition=0, records=bytes(bad))]),
                10.0)).results
            assert result.error_code == 2  # CORRUPT_MESSAGE
            assert await one("a", 1) == 40
        finally:
            await clients.close()
            await service.stop(0)

    run(main)


def test_a_log_node_going_away_fails_calls_then_a_new_stream_serves(tmp_path: Path) -> None:
    async def main() -> None:
        config = LogConfig(data_dir=str(tmp_path / "data"), grpc_address="127.0.0.1:0")
        service = await start(config)
        port = service.port
        address = f"127.0.0.1:{port}"
        clients = LogNodeClients()
        node = LogNode(node_id=0, address=address)
        append = log_pb2.AppendRequest(partitions=[
            log_pb2.PartitionAppend(topic="t", partition=0, records=build_batch(values(1)))])
        try:
            await _create(address, ["t"])
            [first] = (await clients.append(node, append, 10.0)).results
            assert first.error_code == 0
            await service.stop(0)
            # Nobody listens now: the call fails as a call to an unreachable node, which it
            # provably never reached (the first one too, which may meet the closed connection).
            for _ in range(3):
                with pytest.raises(UnreachableError):
                    await clients.append(node, append, 5.0)
            # The node comes back on the same port: the next call opens a new stream.
            service = await start(LogConfig(data_dir=config.data_dir,
                                             grpc_address=f"127.0.0.1:{port}"))
            for _ in range(50):
                try:
                    [again] = (await clients.append(node, append, 5.0)).results
                    break
                except UnreachableError:
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError("no new stream after the node came back")
            assert (again.error_code, again.base_offset) == (0, 1)
        finally:
            await clients.close()
            await service.stop(0)

    run(main)


def test_a_call_without_an_answer_in_time_fails_with_outcome_unknown() -> None:
    """A peer that reads the stream but never answers: the call's time limit ends it."""

    async def main() -> None:
        async def silent(request_iterator, context):
            async for _ in request_iterator:
                pass
            return
            yield  # pragma: no cover - a generator that never answers

        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "kbroker.log.v1.LogService", {"AppendStream": grpc.stream_stream_rpc_method_handler(
                silent, log_pb2.AppendStreamRequest.FromString,
                log_pb2.AppendStreamResponse.SerializeToString)}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = insecure_channel(f"127.0.0.1:{port}")
        try:
            stream = CallStream(
                log_pb2_grpc.LogServiceStub(channel).AppendStream,
                lambda code, details: status_failure(code, details, "silent peer"))
            message = log_pb2.AppendStreamRequest()
            with pytest.raises(OutcomeUnknownError, match="no answer"):
                await stream.call(message, 0.5)
            assert message.call_id == 1 and stream.in_flight == 0
            await stream.close()
        finally:
            await channel.close()
            await server.stop(0)

    run(main)



def test_a_request_the_stream_refused_to_take_fails_as_not_sent() -> None:
    """A stream that failed before it took the request (gRPC raises from the write: the
    request was never handed to the transport) fails the call through ``not_sent``, however
    gRPC worded the failure ("Socket closed" from a connection the peer's death closed is not
    the wording of a refused connect): the handler then knows the append never happened."""

    class DeadStream:
        async def write(self, message: object) -> None:
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                       grpc.aio.Metadata(), "Socket closed")

        async def read(self) -> object:
            await asyncio.sleep(0)
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                       grpc.aio.Metadata(), "Socket closed")

        def done(self) -> bool:
            return False

        def cancel(self) -> None:
            pass

    async def main() -> None:
        stream = CallStream(DeadStream, lambda code, details: status_failure(code, details, "p"),
                            not_sent=lambda code, details: UnreachableError(details))
        try:
            for _ in range(2):
                with pytest.raises(UnreachableError):
                    await stream.call(log_pb2.AppendStreamRequest(), 5.0)
            # Without a not_sent of its own, the failure is the caller's failure_of.
            plain = CallStream(DeadStream,
                               lambda code, details: status_failure(code, details, "p"))
            with pytest.raises(OutcomeUnknownError):
                await plain.call(log_pb2.AppendStreamRequest(), 5.0)
            await plain.close()
        finally:
            await stream.close()

    run(main)
