"""A Fetch answer whose record batches a handler names as ranges of log segment files: the
frontend hands a large range to a plain TCP client's socket with sendfile, reads a small one (or
any, for a TLS client) itself, and asks again for the batches themselves when a range can no
longer be read as named (the file replaced meanwhile)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from kio.schema.errors import ErrorCode
from prometheus_client import REGISTRY

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.log.v1 import log_pb2
from services.common.file_records import METADATA_KEY, SLICE_MIN_BYTES, local_host_key
from services.common.payloads import Detached
from services.handler.apis.fetch import RESPONSE_RECORDS
from tests.record_batches import build_batch

from ..tls_material import CertificateAuthority, localhost_server
from .fake_handler import FakeHandler
from .kafka_wire import KafkaWire
from .sample_requests import fetch_v12_request
from .secure_frontend import secure_frontend
from .test_metrics import frontend
from .test_tls import client_context, tls_connect, tls_settings

READ_BYTES = "kbroker_frontend_file_records_bytes_total"
SENDFILE_BYTES = "kbroker_frontend_sendfile_bytes_total"
UNREADABLE = "kbroker_frontend_file_records_unreadable_total"
SEGMENT_PREFIX = b"\x00" * 100  # earlier batches of the segment, not asked for


class SegmentHandler(FakeHandler):
    """Answers a Fetch of partition 0 with ``batch``: as a range of ``segment`` when the call
    names this host's key, else in the answer."""

    def __init__(self, segment: Path, batch: bytes) -> None:
        super().__init__("segments")
        self.segment = segment
        self.batch = batch

    async def Fetch(self, request, context):
        await self._enter("Fetch", request, context)
        response = k.FetchResponse(responses=[{"topic": "orders", "partitions": [
            {"partition_index": 0, "high_watermark": 3, "last_stable_offset": 3,
             "log_start_offset": 0}]}])
        if dict(context.invocation_metadata()).get(METADATA_KEY) != local_host_key():
            return Detached(response, RESPONSE_RECORDS, [self.batch])
        files = log_pb2.FileRecords(path=str(self.segment), inode=os.stat(self.segment).st_ino,
                                    position=len(SEGMENT_PREFIX), size=len(self.batch))
        return Detached(response, RESPONSE_RECORDS, [b""], [(0, files)])


def segment_of(tmp_path: Path, batch: bytes, after: bytes = b"") -> Path:
    """A segment file holding ``batch`` after SEGMENT_PREFIX, then ``after``."""
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(SEGMENT_PREFIX + batch + after)
    return segment


def keys_sent(handler: FakeHandler) -> list[str | None]:
    return [metadata.get(METADATA_KEY) for rpc, _, metadata in handler.calls if rpc == "Fetch"]


def counted(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def fetched_records(response) -> bytes:
    partition = response.responses[0].partitions[0]
    assert partition.error_code == ErrorCode.none
    assert partition.high_watermark == 3
    return partition.records


def test_the_frontend_reads_a_fetch_answers_batches_from_the_segment_file(tmp_path) -> None:
    batch = build_batch([b"a", b"b", b"c"])
    segment = segment_of(tmp_path, batch, b"\x01" * 50)

    async def main() -> None:
        handler = SegmentHandler(segment, batch)
        async with frontend(handler) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            read_before, sent_before = counted(READ_BYTES), counted(SENDFILE_BYTES)
            assert fetched_records(await wire.request(fetch_v12_request(), 1)) == batch
            assert counted(READ_BYTES) - read_before == len(batch)
            # A range this small is read into the answer, not sent from the file.
            assert len(batch) < SLICE_MIN_BYTES
            assert counted(SENDFILE_BYTES) == sent_before
            assert keys_sent(handler) == [local_host_key()]
            await wire.close()

    assert local_host_key()
    asyncio.run(main())


def test_a_range_of_a_replaced_file_is_asked_for_again_with_the_batches(tmp_path) -> None:
    batch = build_batch([b"a", b"b", b"c"])
    segment = segment_of(tmp_path, batch)

    class Replacing(SegmentHandler):
        """Names the range, then replaces the file under it (the log cleaner's swap) before
        the frontend reads it: same path, another inode, other bytes."""

        async def Fetch(self, request, context):
            answer = await super().Fetch(request, context)
            if answer.files:
                replacement = self.segment.with_suffix(".swap")
                replacement.write_bytes(b"\x02" * (len(SEGMENT_PREFIX) + len(batch)))
                os.replace(replacement, self.segment)
            return answer

    async def main() -> None:
        handler = Replacing(segment, batch)
        async with frontend(handler) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            unreadable_before = counted(UNREADABLE)
            assert fetched_records(await wire.request(fetch_v12_request(), 1)) == batch
            assert counted(UNREADABLE) - unreadable_before == 1
            assert keys_sent(handler) == [local_host_key(), None]
            await wire.close()

    asyncio.run(main())


def test_a_frontend_told_not_to_read_files_never_offers_to(tmp_path) -> None:
    batch = build_batch([b"a"])
    segment = segment_of(tmp_path, batch)

    async def main() -> None:
        handler = SegmentHandler(segment, batch)
        async with frontend(handler, local_files=False) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            assert fetched_records(await wire.request(fetch_v12_request(), 1)) == batch
            assert keys_sent(handler) == [None]
            await wire.close()

    asyncio.run(main())


def large_batch() -> bytes:
    """A batch well over SLICE_MIN_BYTES and over a loopback socket's send buffer."""
    batch = build_batch([bytes([n % 251]) * 1000 for n in range(6000)])
    assert len(batch) > 4 << 20
    return batch


def test_a_large_range_goes_from_the_segment_file_to_the_socket_with_sendfile(tmp_path) -> None:
    batch = large_batch()
    segment = segment_of(tmp_path, batch, b"\x01" * 50)

    async def main() -> None:
        handler = SegmentHandler(segment, batch)
        async with frontend(handler) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            for _ in range(2):  # and the connection goes on after it
                read_before, sent_before = counted(READ_BYTES), counted(SENDFILE_BYTES)
                assert fetched_records(await wire.request(fetch_v12_request(), 1)) == batch
                assert counted(READ_BYTES) - read_before == len(batch)
                assert counted(SENDFILE_BYTES) - sent_before == len(batch)
            assert keys_sent(handler) == [local_host_key()] * 2
            await wire.close()

    asyncio.run(main())


def test_a_tls_connection_gets_a_large_range_read_and_written(tmp_path) -> None:
    ca = CertificateAuthority.create(tmp_path / "tls")
    server = localhost_server(ca)
    batch = large_batch()
    segment = segment_of(tmp_path, batch)

    async def main() -> None:
        handler = SegmentHandler(segment, batch)
        async with secure_frontend(handler, **tls_settings(
                ca, server, listeners="SSL://127.0.0.1:0")) as (service, _):
            wire = await tls_connect(service.ports["SSL"], client_context(ca))
            read_before, sent_before = counted(READ_BYTES), counted(SENDFILE_BYTES)
            assert fetched_records(await wire.request(fetch_v12_request(), 1)) == batch
            assert counted(READ_BYTES) - read_before == len(batch)
            assert counted(SENDFILE_BYTES) == sent_before
            assert keys_sent(handler) == [local_host_key()]
            await wire.close()

    asyncio.run(main())
