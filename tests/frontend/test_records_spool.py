"""A large Produce's record batches left in the frontend's spool file for the log nodes on its
host to read: the spool's files (written once, removed when their calls end, orphans of a dead
frontend removed), and a real frontend that names the batches to a handler on its host and sends
them carried to one that cannot read them."""

from __future__ import annotations

import asyncio
import datetime
import errno
import os
import subprocess
import sys

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.produce.v9 import request as produce_v9
from prometheus_client import REGISTRY

from services.common.file_records import SPOOL_FILE, FileRecordsReader
from services.common.records.record_batch import HEADER_SIZE
from services.frontend.records_spool import MIN_BYTES, MIN_PAYLOAD_BYTES, RecordsSpool
from services.handler import exchange
from tests.record_batches import build_batch

from .fake_handler import FakeHandler
from .kafka_wire import KafkaWire
from .test_metrics import frontend

SPOOLED = "kbroker_frontend_records_spool_bytes_total"
DECLINED = "kbroker_frontend_records_spool_declined_total"


def large_batch(seed: int, size: int = 40_000) -> bytes:
    return build_batch([bytes([seed]) * 1000 for _ in range(size // 1000)])


def spool_files(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if SPOOL_FILE.fullmatch(name))


def read_back(spooled) -> list[bytes | None]:
    reader = FileRecordsReader(names=SPOOL_FILE)
    try:
        return [reader.read(r.path, r.inode, r.position, r.size) for r in spooled.ranges]
    finally:
        reader.close()


def test_large_payloads_are_written_and_read_back_as_named(tmp_path) -> None:
    spool = RecordsSpool(str(tmp_path))
    batches = [large_batch(1), None, large_batch(2)]
    spooled = spool.write(batches)
    assert spooled is not None
    assert [r.payload for r in spooled.ranges] == [0, 2]
    assert read_back(spooled) == [batches[0], batches[2]]
    assert spooled.heads == [batches[0][:HEADER_SIZE], None, batches[2][:HEADER_SIZE]]
    assert spooled.size == len(batches[0]) + len(batches[2])
    spool.release(spooled, settled=True)
    spool.close()
    assert spool_files(tmp_path) == []
    assert spool.write(batches) is None  # closed: carried
    assert spool_files(tmp_path) == []


def test_small_payloads_are_carried(tmp_path) -> None:
    spool = RecordsSpool(str(tmp_path))
    assert spool.write([b"x" * (MIN_BYTES - 1)]) is None
    # Enough in all, too little per partition on average.
    many = [b"x" * (MIN_PAYLOAD_BYTES - 1)] * (MIN_BYTES // MIN_PAYLOAD_BYTES + 1)
    assert spool.write(many) is None
    assert spool_files(tmp_path) == []


def test_a_full_file_is_written_over_once_every_call_naming_it_was_settled(tmp_path) -> None:
    spool = RecordsSpool(str(tmp_path), file_bytes=200_000)
    first = spool.write([large_batch(1, 90_000)])
    second = spool.write([large_batch(2, 90_000)])
    third = spool.write([large_batch(3, 90_000)])  # no room left: a second file
    assert first and second and third
    full = first.ranges[0].inode
    assert second.ranges[0].inode == full != third.ranges[0].inode
    assert len(spool_files(tmp_path)) == 2
    spool.release(first, settled=True)
    assert read_back(second) == [large_batch(2, 90_000)]  # still named: untouched
    spool.release(second, settled=True)
    fourth = spool.write([large_batch(4, 90_000)])  # fits beside the third
    fifth = spool.write([large_batch(5, 90_000)])  # the first file again, from its start
    assert fourth and fifth
    assert (fifth.ranges[0].inode, fifth.ranges[0].position) == (full, 0)
    assert read_back(fifth) == [large_batch(5, 90_000)]
    # A call that ended unsettled (its ranges may still be read): its file is removed.
    spool.release(third, settled=False)
    spool.release(fourth, settled=True)
    assert len(spool_files(tmp_path)) == 1
    spool.close()
    assert len(spool_files(tmp_path)) == 1  # still named by the fifth
    spool.release(fifth, settled=True)
    assert spool_files(tmp_path) == []


def test_a_failed_write_carries_the_batches_for_a_while(tmp_path) -> None:
    directory = tmp_path / "spool"
    directory.mkdir()
    spool = RecordsSpool(str(directory))
    directory.rmdir()
    assert spool.write([large_batch(1, 70_000)]) is None
    directory.mkdir()
    assert spool.write([large_batch(1, 70_000)]) is None  # paused
    assert spool_files(directory) == []


def test_a_file_whose_space_cannot_be_allocated_is_not_used(tmp_path, monkeypatch) -> None:
    # A tmpfs without room: the space of a new file is refused when the file is made, so no
    # batch is ever copied into mapped pages the tmpfs could not back (SIGBUS).
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    spool = RecordsSpool(str(tmp_path))
    assert spool.write([large_batch(1, 70_000)]) is None
    assert spool_files(tmp_path) == []  # the file made for it is removed again
    monkeypatch.undo()
    assert spool.write([large_batch(1, 70_000)]) is None  # paused
    assert spool_files(tmp_path) == []


def test_a_file_has_its_whole_space_allocated_when_made(tmp_path) -> None:
    spool = RecordsSpool(str(tmp_path), file_bytes=200_000)
    spooled = spool.write([large_batch(1, 70_000)])
    assert spooled is not None
    stat = os.stat(spooled.ranges[0].path)
    assert stat.st_size == 200_000
    assert stat.st_blocks * 512 >= 200_000  # allocated, not a sparse file
    spool.release(spooled, settled=True)
    spool.close()


def test_the_files_of_a_dead_frontend_are_removed(tmp_path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True, timeout=30)
    orphan = tmp_path / f"kbroker-records-{int(dead.stdout)}-0123456789abcdef.spool"
    mine = tmp_path / f"kbroker-records-{os.getpid()}-0123456789abcdef.spool"
    other = tmp_path / "kbroker-records-1-notaspoolfile"
    for path in (orphan, mine, other):
        path.write_bytes(b"x")
    RecordsSpool(str(tmp_path))
    assert not orphan.exists()
    assert mine.exists() and other.exists()


def produce(batches: list[bytes]) -> produce_v9.ProduceRequest:
    return produce_v9.ProduceRequest(
        transactional_id=None, acks=1, timeout=datetime.timedelta(milliseconds=1500),
        topic_data=(produce_v9.TopicProduceData(name="orders", partition_data=tuple(
            produce_v9.PartitionProduceData(index=i, records=batch)
            for i, batch in enumerate(batches))),))


def counted(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def produced(service, batches: list[bytes]) -> None:
    wire = await KafkaWire.connect(service.kafka_port)
    try:
        response = await wire.request(produce(batches), 1)
    finally:
        await wire.close()
    assert [p.error_code for t in response.responses for p in t.partition_responses] == [
        ErrorCode.none] * len(batches)


def test_the_frontend_names_a_large_produces_batches_in_its_spool(tmp_path) -> None:
    batches = [large_batch(1), large_batch(2)]

    async def main() -> None:
        handler = FakeHandler()
        async with frontend(handler, records_spool_dir=str(tmp_path)) as service:
            before = counted(SPOOLED)
            await produced(service, batches)
            assert counted(SPOOLED) - before == sum(map(len, batches))
            assert handler.spooled == 2
            (request,) = handler.called("Produce")
            assert [p.records for p in request.topic_data[0].partition_data] == batches
            # The file takes the next requests until it is full;
            assert len(spool_files(tmp_path)) == 1
        # stopping the frontend removes it.
        assert spool_files(tmp_path) == []

    asyncio.run(main())


def test_a_handler_on_another_host_gets_the_batches_carried(tmp_path, monkeypatch) -> None:
    batches = [large_batch(3), large_batch(4)]
    monkeypatch.setattr(exchange, "is_local", lambda key: False)

    async def main() -> None:
        handler = FakeHandler()
        async with frontend(handler, records_spool_dir=str(tmp_path)) as service:
            declined, spooled = counted(DECLINED), counted(SPOOLED)
            await produced(service, batches)
            assert counted(DECLINED) - declined == 1
            # That handler is then sent them carried at once.
            await produced(service, batches)
            assert counted(DECLINED) - declined == 1
            assert counted(SPOOLED) == spooled
            assert handler.spooled == 0
            for request in handler.called("Produce"):
                assert [p.records for p in request.topic_data[0].partition_data] == batches
        assert spool_files(tmp_path) == []

    asyncio.run(main())


@pytest.mark.parametrize("settings", [{"local_files": False}, {"records_spool_dir": ""}])
def test_without_the_spool_every_batch_is_carried(tmp_path, settings) -> None:
    batches = [large_batch(5), large_batch(6)]
    settings = {"records_spool_dir": str(tmp_path), **settings}

    async def main() -> None:
        handler = FakeHandler()
        async with frontend(handler, **settings) as service:
            await produced(service, batches)
            assert handler.spooled == 0
            (request,) = handler.called("Produce")
            assert [p.records for p in request.topic_data[0].partition_data] == batches
        assert spool_files(tmp_path) == []

    asyncio.run(main())

