"""KafkaHandlerStream/Exchange against a real handler (with real log nodes, purgatory and
replicator on port 0): calls over the stream get the answers unary calls get, with their
trailing metadata; unknown methods and unparsable requests are refused per call without
breaking the stream; and the frontend's handler pool uses the stream, or unary calls for a
handler that has none."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc

from kbroker.handler.v1 import handler_pb2, handler_pb2_grpc
from kbroker.kafka.v1 import kafka_pb2 as k
from services.common.channels import insecure_channel
from services.common.file_records import METADATA_KEY, local_host_key
from services.common.metrics import REMOTE_TIME_METADATA_KEY
from services.common.payloads import Detached
from services.common.records.record_batch import HEADER_SIZE
from services.frontend.handler_pool import HandlerPool
from services.frontend.records_spool import RecordsSpool
from services.handler import exchange
from services.handler.exchange import REQUEST_RECORDS
from tests.record_batches import build_batch

from .harness import FRONTEND_METADATA, running_cluster

TIMEOUT = 60.0


def run(coroutine_factory) -> None:
    asyncio.run(asyncio.wait_for(coroutine_factory(), TIMEOUT))


def _call(call_id: int, method: str, request: bytes,
          metadata=FRONTEND_METADATA) -> handler_pb2.HandlerCall:
    call = handler_pb2.HandlerCall(call_id=call_id, method=method, request=request)
    for key, value in metadata:
        call.metadata.add(key=key, value=value)
    return call


def test_calls_over_the_stream_answer_as_unary_calls_do(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_cluster(tmp_path) as cluster:
            await cluster.create_topic("t", partitions=2)
            metadata_request = k.MetadataRequest(
                topics=[k.MetadataRequest.MetadataRequestTopic(name="t")])
            unary = await cluster.stub.Metadata(metadata_request, metadata=FRONTEND_METADATA)
            # An idle long poll parks in the purgatory: its remote time comes back as
            # trailing metadata.
            fetch_request = k.FetchRequest(
                replica_id=-1, max_wait_ms=300, min_bytes=1, max_bytes=1 << 20,
                topics=[k.FetchRequest.FetchTopic(topic="t", partitions=[
                    k.FetchRequest.FetchPartition(
                        partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])])
            channel = insecure_channel(f"127.0.0.1:{cluster.handler.port}")
            try:
                stream = handler_pb2_grpc.KafkaHandlerStreamStub(channel).Exchange()
                await stream.write(_call(1, "Fetch", fetch_request.SerializeToString()))
                await stream.write(_call(2, "Metadata", metadata_request.SerializeToString()))
                await stream.write(_call(3, "NoSuchApi", b""))
                await stream.write(_call(4, "Metadata", b"\xff\xff\xff"))
                replies = {}
                for _ in range(4):
                    reply = await stream.read()
                    replies[reply.call_id] = reply
                await stream.done_writing()
                assert await stream.read() == grpc.aio.EOF
            finally:
                await channel.close()
            # Answered out of order: the long poll last.
            assert replies[2].status_code == 0
            assert k.MetadataResponse.FromString(replies[2].response) == unary
            assert replies[3].status_code == grpc.StatusCode.UNIMPLEMENTED.value[0]
            assert replies[4].status_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
            fetched = k.FetchResponse.FromString(replies[1].response)
            assert fetched.responses[0].partitions[0].error_code == 0
            trailers = {m.key: m.value for m in replies[1].trailing_metadata}
            assert float(trailers[REMOTE_TIME_METADATA_KEY]) >= 250

    run(main)


def test_the_handler_pool_streams_to_handlers_that_serve_streams(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_cluster(tmp_path) as cluster:
            pool = HandlerPool([f"127.0.0.1:{cluster.handler.port}"])
            await pool.start()
            try:
                request = k.MetadataRequest(topics_is_null=True)
                answers = [answer for answer, _remote in await asyncio.gather(*(
                    pool.call("Metadata", request, metadata=FRONTEND_METADATA, time_limit=10,
                              retry_safe=True) for _ in range(20)))]
                [handler] = pool._handlers
                assert handler.stream is not None
                assert handler.stream.batching  # the handler takes batched calls
                assert len({a.SerializeToString() for a in answers}) == 1
                assert answers[0].brokers[0].node_id == 0
            finally:
                await pool.close()

    run(main)


def test_a_produce_whose_batches_are_spooled_is_appended_from_the_spool(tmp_path: Path) -> None:
    """The frontend's handler pool leaves a large Produce's batches in its spool; the handler
    names them to the leader log node, which reads them from there."""
    batches = [build_batch([bytes([i]) * 1000] * 40) for i in range(2)]

    async def main() -> None:
        async with running_cluster(tmp_path) as cluster:
            await cluster.create_topic("t", partitions=2)
            spool_dir = tmp_path / "spool"
            spool_dir.mkdir()
            pool = HandlerPool([f"127.0.0.1:{cluster.handler.port}"],
                               spool=RecordsSpool(str(spool_dir)))
            await pool.start()
            try:
                request = k.ProduceRequest(acks=1, timeout_ms=5000, topic_data=[
                    k.ProduceRequest.TopicProduceData(name="t", partition_data=[
                        k.ProduceRequest.PartitionProduceData(index=p) for p in (0, 1)])])
                answer, _remote = await pool.call(
                    "Produce", Detached(request, REQUEST_RECORDS["Produce"], list(batches)),
                    metadata=(*FRONTEND_METADATA, (METADATA_KEY, local_host_key())),
                    time_limit=10, retry_safe=False)
                assert [p.error_code for p in answer.responses[0].partition_responses] == [0, 0]
                assert len(list(spool_dir.iterdir())) == 1
            finally:
                await pool.close()
            assert list(spool_dir.iterdir()) == []
            for partition, batch in enumerate(batches):
                fetched = await cluster.fetch("t", partition, 0)
                assert fetched.responses[0].partitions[0].records[16:] == batch[16:]

    run(main)


def test_a_spooled_produce_is_answered_settled_unless_a_leader_left_it_unanswered(
        tmp_path: Path, monkeypatch) -> None:
    """The answer says whether the spooled ranges may be written over: yes once the leader
    answered the append that named them, or when nothing was sent (a handler on another
    host); no when the append to the leader failed."""
    batch = build_batch([b"s" * 1000] * 70)
    spool = tmp_path / f"kbroker-records-{os.getpid()}-{os.urandom(8).hex()}.spool"
    spool.write_bytes(batch)
    request = k.ProduceRequest(acks=1, timeout_ms=5000, topic_data=[
        k.ProduceRequest.TopicProduceData(name="t", partition_data=[
            k.ProduceRequest.PartitionProduceData(index=0, records=batch[:HEADER_SIZE])])])

    def call(call_id: int) -> handler_pb2.HandlerCall:
        sent = _call(call_id, "Produce", request.SerializeToString(),
                     (*FRONTEND_METADATA, (METADATA_KEY, local_host_key())))
        sent.file_records.add(payload=0, path=str(spool), inode=os.stat(spool).st_ino,
                              position=0, size=len(batch))
        return sent

    async def main() -> None:
        async with running_cluster(tmp_path) as cluster:
            await cluster.create_topic("t")
            channel = insecure_channel(f"127.0.0.1:{cluster.handler.port}")
            try:
                stream = handler_pb2_grpc.KafkaHandlerStreamStub(channel).Exchange()
                await stream.write(call(1))
                appended = await stream.read()
                assert appended.status_code == 0 and appended.file_records_settled
                answer = k.ProduceResponse.FromString(appended.response)
                assert answer.responses[0].partition_responses[0].error_code == 0
                with monkeypatch.context() as patched:
                    patched.setattr(exchange, "is_local", lambda key: False)
                    await stream.write(call(2))
                    elsewhere = await stream.read()
                assert elsewhere.request_files_unreadable and elsewhere.file_records_settled
                await cluster.stop_log_node(0)
                await stream.write(call(3))
                unanswered = await stream.read()
                assert not unanswered.file_records_settled
                await stream.done_writing()
            finally:
                await channel.close()

    run(main)
