"""The record codec against an independent one: batches written here are read by kio's record
reader with every header field and record intact, batches kio writes decode here; records
re-encode byte for byte, and malformed ones are errors."""

from __future__ import annotations

import datetime
import io

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.records.readers import read_batch
from kio.records.schema import NewRecordBatch, RecordHeader
from kio.records.schema import Record as KioRecord
from kio.records.writers import write_batch
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

from services.common.records.record import (
    NO_HEADERS,
    Record,
    build_batch,
    decode_records,
    encode_batch,
    encode_record,
)
from services.common.records.record_batch import (
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
    RecordError,
    read_header,
)
from services.common.varints import decode_varint, encode_varint

from ...record_batches import build_batch as build_test_batch
from ...record_batches import values

Headers = list[tuple[bytes, bytes | None]]
Drawn = tuple[BatchHeader, list[Record], list[Headers]]

nullable_bytes = st.none() | st.binary(max_size=40)
record_headers = st.lists(st.tuples(st.text(max_size=8).map(str.encode), nullable_bytes),
                          max_size=3)


def encode_headers(headers: Headers) -> bytes:
    """Record headers as the record grammar has them: a count, then each key and value."""
    out = encode_varint(len(headers))
    for key, value in headers:
        out += encode_varint(len(key)) + key
        out += encode_varint(-1) if value is None else encode_varint(len(value)) + value
    return out


@st.composite
def batches(draw: st.DrawFn) -> Drawn:
    count = draw(st.integers(1, 8))
    base_timestamp = draw(st.integers(0, 2**41))
    deltas = sorted(draw(st.lists(st.integers(0, 2**20), min_size=count, max_size=count,
                                  unique=True)))
    headers = [draw(record_headers) for _ in range(count)]
    records = [Record(offset_delta, draw(st.integers(0, 10**9)), draw(nullable_bytes),
                      draw(nullable_bytes), encode_headers(h))
               for offset_delta, h in zip(deltas, headers, strict=True)]
    header = BatchHeader(
        base_offset=draw(st.integers(0, 2**62)),
        partition_leader_epoch=draw(st.integers(-1, 2**31 - 1)),
        attributes=draw(st.sampled_from([0, TIMESTAMP_TYPE_BIT, TRANSACTIONAL_BIT])),
        last_offset_delta=deltas[-1], base_timestamp=base_timestamp,
        max_timestamp=base_timestamp + max(r.timestamp_delta for r in records),
        producer_id=draw(st.integers(-1, 2**63 - 1)),
        producer_epoch=draw(st.integers(-1, 2**15 - 1)),
        base_sequence=draw(st.integers(-1, 2**31 - 1)))
    return header, records, headers


@given(batches())
def test_kio_reads_every_field_and_record_written_here(drawn: Drawn) -> None:
    header, records, headers = drawn
    batch = encode_batch(header, records)
    read, size = read_batch(batch, 0)  # checks the CRC and that the records fill the batch
    assert size == len(batch)
    assert (read.base_offset, read.partition_leader_epoch, read.attributes,
            read.last_offset_delta, read.base_timestamp, read.max_timestamp, read.producer_id,
            read.producer_epoch, read.base_sequence) == (
        header.base_offset, header.partition_leader_epoch, header.attributes,
        header.last_offset_delta, header.base_timestamp, header.max_timestamp,
        header.producer_id, header.producer_epoch, header.base_sequence)
    assert len(read.records) == len(records)
    for got, want, want_headers in zip(read.records, records, headers, strict=True):
        assert got.offset == header.base_offset + want.offset_delta
        assert (got.key, got.value) == (want.key, want.value)
        assert [(h.key, h.value) for h in got.headers] == want_headers
        # kio resolves timestamps to whole seconds.
        assert int(got.timestamp.timestamp()) == (
            header.base_timestamp + want.timestamp_delta) // 1000
    assert decode_records(batch, read_header(batch)) == records


@given(entries=st.lists(st.tuples(nullable_bytes, nullable_bytes), min_size=1, max_size=8),
       seconds=st.integers(0, 2**31))
def test_batches_kio_writes_decode_here(
        entries: list[tuple[bytes | None, bytes | None]], seconds: int) -> None:
    when = TZAwareMicros.parse(datetime.datetime.fromtimestamp(seconds, datetime.UTC))
    new = NewRecordBatch(
        producer_id=i64(9), producer_epoch=i16(1), base_sequence=i32(0), attributes=i16(0),
        records=tuple(
            KioRecord(attributes=i8(0), timestamp=when, offset=i64(i), key=key, value=value,
                      headers=(RecordHeader(key=b"h", value=value),))
            for i, (key, value) in enumerate(entries)))
    out = io.BytesIO()
    write_batch(out, new)
    batch = out.getvalue()
    header = read_header(batch)
    assert (header.producer_id, header.producer_epoch, header.record_count) == (
        9, 1, len(entries))
    assert header.base_timestamp == seconds * 1000
    records = decode_records(batch, header)
    assert [(r.offset_delta, r.timestamp_delta, r.key, r.value) for r in records] == [
        (i, 0, key, value) for i, (key, value) in enumerate(entries)]
    assert [r.headers for r in records] == [encode_headers([(b"h", v)]) for _, v in entries]
    assert encode_batch(header, records) == batch  # and back, byte for byte


@given(entries=st.lists(st.tuples(nullable_bytes, nullable_bytes), min_size=1, max_size=8),
       timestamp=st.integers(0, 2**41), epoch=st.integers(-1, 2**31 - 1))
def test_the_brokers_own_batches_hold_their_entries(
        entries: list[tuple[bytes | None, bytes | None]], timestamp: int, epoch: int) -> None:
    batch = build_batch(entries, timestamp, partition_leader_epoch=epoch)
    header = read_header(batch)
    assert header == BatchHeader(
        batch_length=len(batch) - 12, partition_leader_epoch=epoch, crc=header.crc,
        last_offset_delta=len(entries) - 1, base_timestamp=timestamp, max_timestamp=timestamp,
        record_count=len(entries))
    assert decode_records(batch, header) == [
        Record(i, 0, key, value) for i, (key, value) in enumerate(entries)]
    read, _ = read_batch(batch, 0)
    assert [(r.offset, r.key, r.value) for r in read.records] == [
        (i, key, value) for i, (key, value) in enumerate(entries)]


def test_a_batch_needs_a_record() -> None:
    with pytest.raises(ValueError):
        build_batch([], 0)


def test_a_record_round_trips_with_headers_and_negative_deltas() -> None:
    headers = encode_headers([(b"h", b"hv")])
    original = Record(offset_delta=5, timestamp_delta=-(10**12), key=b"", value=None,
                      headers=headers)
    encoded = encode_record(original)
    length, start = decode_varint(encoded, 0)
    assert start + length == len(encoded)
    batch = encode_batch(BatchHeader(last_offset_delta=5), [original])
    assert decode_records(batch, read_header(batch)) == [original]
    assert Record(0, 0, None, None).headers == NO_HEADERS == encode_headers([])


def test_undecodable_records_are_errors() -> None:
    batch = bytearray(build_test_batch(values(2)))
    header = read_header(batch)
    with pytest.raises(RecordError):
        decode_records(bytes(batch[:-3]), header._replace(batch_length=header.batch_length - 3))
    with pytest.raises(RecordError):
        decode_records(batch, header._replace(record_count=3))
    with pytest.raises(RecordError):  # one record too few to fill the batch
        decode_records(batch, header._replace(record_count=1))
    with pytest.raises(RecordError):  # an overlong varint
        decode_records(bytes(batch[:61]) + b"\xff" * 11, header._replace(batch_length=60))
