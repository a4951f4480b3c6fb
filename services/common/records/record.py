"""The records inside a v2 record batch (Kafka's ``DefaultRecord``), and whole batches of them
(Kafka's ``MemoryRecordsBuilder``). The produce and fetch paths never come here; the log
cleaner, the key check of compacted topics and the writers and readers of internal topics
(groups, cluster metadata, transaction markers) do.

After the 61-byte batch header (:mod:`.record_batch`) come ``recordCount`` records, compressed
as a whole when the batch's codec is not none (:mod:`.compression`)::

    Record =>
      length          varint   bytes of the rest of the record
      attributes      i8       unused (0)
      timestampDelta  varlong  record timestamp minus the batch's baseTimestamp
      offsetDelta     varint   record offset minus the batch's baseOffset
      keyLength       varint   -1: a null key
      key             bytes
      valueLength     varint   -1: a null value (a tombstone)
      value           bytes
      headerCount     varint
      Header          [headerKeyLength varint, headerKey, headerValueLength varint, value]

Varints are zigzag encoded, seven bits a byte, least significant group first
(:mod:`services.common.varints`). In a batch with a delete horizon (KIP-534) baseTimestamp is
the horizon and record timestamps stay ``baseTimestamp + timestampDelta``, so whoever moves the
base rewrites the deltas.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

from services.common.varints import VarintError, decode_varint, encode_varint

from .compression import compress, decompress
from .record_batch import (
    HEADER_SIZE,
    NO_PARTITION_LEADER_EPOCH,
    BatchHeader,
    Buffer,
    RecordError,
    pack_batch,
)

# A header count of zero.
NO_HEADERS = encode_varint(0)


class Record(NamedTuple):
    """One record as a batch holds it: offset and timestamp relative to the batch's bases;
    ``headers`` stay encoded, header count included."""

    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value: bytes | None
    headers: bytes = NO_HEADERS
    attributes: int = 0


def _read_varint(buffer: Buffer, position: int) -> tuple[int, int]:
    try:
        return decode_varint(buffer, position)
    except VarintError as exc:
        raise RecordError(str(exc)) from None


def _nullable(data: bytes | None) -> bytes:
    return encode_varint(-1) if data is None else encode_varint(len(data)) + data


# ----------------------------------------------------------------------------- writing


def encode_record(record: Record) -> bytes:
    """One record, length prefix included."""
    body = b"".join((
        bytes((record.attributes,)),
        encode_varint(record.timestamp_delta),
        encode_varint(record.offset_delta),
        _nullable(record.key),
        _nullable(record.value),
        record.headers,
    ))
    return encode_varint(len(body)) + body


def encode_batch(header: BatchHeader, records: Sequence[Record], xerial: bool = False) -> bytes:
    """A batch with the fields of ``header`` holding ``records``, compressed with the codec its
    attributes name (snappy in the xerial framing if ``xerial``); batchLength, crc and
    recordCount are computed."""
    payload = compress(header.compression, b"".join(encode_record(r) for r in records), xerial)
    return pack_batch(header._replace(record_count=len(records)), payload)


def build_batch(entries: Sequence[tuple[bytes | None, bytes | None]], timestamp: int, *,
                partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH) -> bytes:
    """One uncompressed batch of ``entries`` (key, value), all stamped ``timestamp``, without a
    producer: what the broker's own writers append. Offsets count from 0; the log node assigns
    the real ones."""
    if not entries:
        raise ValueError("a batch needs at least one record")
    header = BatchHeader(partition_leader_epoch=partition_leader_epoch,
                         last_offset_delta=len(entries) - 1, base_timestamp=timestamp,
                         max_timestamp=timestamp)
    return encode_batch(header, [Record(delta, 0, key, value)
                                 for delta, (key, value) in enumerate(entries)])


# ----------------------------------------------------------------------------- reading


def records_payload(batch: Buffer, header: BatchHeader) -> bytes:
    """The uncompressed records of ``batch`` (the whole batch, header first)."""
    return decompress(header.compression, memoryview(batch)[HEADER_SIZE:header.size])


def _record_spans(payload: bytes, count: int) -> Iterator[tuple[int, int]]:
    """Where each of ``count`` records starts and ends after its length prefix; they must fill
    ``payload`` exactly (checked once the last one is taken)."""
    position = 0
    for _ in range(count):
        length, position = _read_varint(payload, position)
        end = position + length
        if length < 1 or end > len(payload):
            raise RecordError(f"record of {length} bytes overruns the batch")
        yield position, end
        position = end
    if position != len(payload):
        raise RecordError(f"{len(payload) - position} bytes after the last record")


def decode_records(batch: Buffer, header: BatchHeader) -> list[Record]:
    """Every record of ``batch`` (the whole batch, header first); exactly ``recordCount``
    records must fill the payload. Raises :class:`RecordError`."""
    payload = records_payload(batch, header)
    return [_decode_record(payload, start, end)
            for start, end in _record_spans(payload, header.record_count)]


def _decode_record(payload: bytes, position: int, end: int) -> Record:
    attributes = payload[position]
    timestamp_delta, position = _read_varint(payload, position + 1)
    offset_delta, position = _read_varint(payload, position)
    if position > end:
        raise RecordError("record fields overrun the record")
    key, position = _read_bytes(payload, position, end)
    value, position = _read_bytes(payload, position, end)
    if position >= end:
        raise RecordError("record without a header count")
    return Record(offset_delta, timestamp_delta, key, value, payload[position:end], attributes)


def _read_bytes(payload: bytes, position: int, end: int) -> tuple[bytes | None, int]:
    length, position = _read_varint(payload, position)
    if length < 0:
        return None, position
    if position + length > end:
        raise RecordError(f"field of {length} bytes overruns its record")
    return payload[position:position + length], position + length


def iter_key_lengths(payload: bytes, count: int) -> Iterator[int]:
    """The key length (-1: a null key) of each of the ``count`` records in ``payload`` (as
    :func:`records_payload` gives it), reading no record further than its key length. Raises
    :class:`RecordError` when the records do not fill the payload exactly."""
    for start, end in _record_spans(payload, count):
        _, after = _read_varint(payload, start + 1)  # timestamp delta
        _, after = _read_varint(payload, after)  # offset delta
        key_length, after = _read_varint(payload, after)
        if after > end:
            raise RecordError("record fields overrun the record")
        yield key_length


def iter_record_times(batch: Buffer, header: BatchHeader) -> Iterator[tuple[int, int]]:
    """(offset, timestamp) of each record of ``batch`` (the whole batch, header first), in
    order, reading no record past its offset delta. A LogAppendTime batch's records all carry
    the batch's maxTimestamp (as Kafka reads them). Raises :class:`RecordError`."""
    payload = records_payload(batch, header)
    append_time = header.max_timestamp if header.is_log_append_time else None
    for start, end in _record_spans(payload, header.record_count):
        timestamp_delta, after = _read_varint(payload, start + 1)
        offset_delta, after = _read_varint(payload, after)
        if after > end:
            raise RecordError("record fields overrun the record")
        yield (header.base_offset + offset_delta,
               append_time if append_time is not None else header.base_timestamp
               + timestamp_delta)
