"""Tests of services.log.record_codec: varints, records and batches against the independent test
builder, every compression codec against the reference libraries, and the key check of
compacted topics."""

from __future__ import annotations

import gzip
import os
import struct

import lz4.frame
import pytest
import snappy
import zstandard
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st
from kafka import codec as kafka_codec

from services.common.errors import ErrorCode, KafkaError
from services.log import record_codec
from services.log.record_batch import iter_batches, read_header, stored_batch_problem
from services.log.record_codec import Record, RecordError

from ..record_batches import build_batch, record, values, varint

CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def compressed_batch(
    entries: list[tuple[bytes | None, bytes | None]], codec: str, base_timestamp: int = 1000
) -> bytes:
    """A batch of ``(key, value)`` records compressed by the reference library of ``codec``
    (snappy in the Java client's xerial framing)."""
    raw = b"".join(record(i, i, key, value) for i, (key, value) in enumerate(entries))
    payload = {
        "gzip": lambda: gzip.compress(raw),
        "snappy": lambda: kafka_codec.snappy_encode(raw, xerial_compatible=True),
        "lz4": lambda: lz4.frame.compress(raw),
        "zstd": lambda: zstandard.ZstdCompressor().compress(raw),
    }[codec]()
    count = len(entries)
    after_crc = struct.pack(
        ">hiqqqhii", CODECS[codec], count - 1, base_timestamp, base_timestamp + count - 1,
        -1, -1, -1, count) + payload
    return struct.pack(">qiibI", 0, 9 + len(after_crc), -1, 2, crc32c(after_crc)) + after_crc


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_varints_round_trip_and_match_the_test_builder(value: int) -> None:
    encoded = record_codec.write_varint(value)
    assert encoded == varint(value)
    assert record_codec.read_varint(encoded + b"\xff", 0) == (value, len(encoded))


@given(st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=20)),
                          st.one_of(st.none(), st.binary(max_size=200))),
                min_size=1, max_size=20))
def test_records_decode_and_reencode_byte_for_byte(entries) -> None:  # type: ignore[no-untyped-def]
    keys = [key for key, _ in entries]
    batch = build_batch([value for _, value in entries], keys=keys)  # type: ignore[misc]
    header = read_header(batch)
    records = record_codec.decode_records(batch, header)
    assert [(r.key, r.value) for r in records] == entries
    assert [r.offset_delta for r in records] == list(range(len(entries)))
    assert record_codec.encode_batch(header, records) == batch


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_every_codec_reads_the_reference_library_and_writes_what_it_reads(codec: str) -> None:
    entries = [(f"k{i}".encode(), os.urandom(50) * 40) for i in range(60)]  # > 64 KiB raw
    batch = compressed_batch(entries, codec)
    header = read_header(batch)
    records = record_codec.decode_records(batch, header)
    assert [(r.key, r.value) for r in records] == entries
    rebuilt = record_codec.encode_batch(
        header, records, xerial=record_codec.is_xerial(batch[61:]))
    assert stored_batch_problem(rebuilt, 0, 0) is None
    payload = rebuilt[61:]
    raw = b"".join(record(i, i, key, value) for i, (key, value) in enumerate(entries))
    decoded = {
        "gzip": gzip.decompress,
        "snappy": kafka_codec.snappy_decode,
        "lz4": lz4.frame.decompress,
        "zstd": lambda data: zstandard.ZstdDecompressor().decompressobj().decompress(data),
    }[codec](payload)
    assert decoded == raw
    if codec == "lz4":
        # Kafka's framing: independent blocks (FLG 0x60), 64 KiB blocks, no checksums.
        assert payload[:7] == bytes.fromhex("04224d18604082")
    if codec == "snappy":
        assert payload.startswith(b"\x82SNAPPY\x00")
        raw_snappy = record_codec.compress(2, raw)
        assert snappy.uncompress(raw_snappy) == raw
        assert record_codec.decompress(2, raw_snappy) == raw


def test_undecodable_records_are_errors() -> None:
    batch = bytearray(build_batch(values(2)))
    header = read_header(batch)
    with pytest.raises(RecordError):
        record_codec.decode_records(bytes(batch[:-3]), header._replace(
            batch_length=header.batch_length - 3))
    with pytest.raises(RecordError):
        record_codec.decode_records(batch, header._replace(record_count=3))
    with pytest.raises(RecordError):
        record_codec.decompress(4, b"not zstd at all")


def test_a_record_round_trips_with_headers_and_negative_deltas() -> None:
    headers = varint(1) + varint(1) + b"h" + varint(2) + b"hv"
    original = Record(offset_delta=5, timestamp_delta=-(10**12), key=b"", value=None,
                      headers=headers)
    encoded = record_codec.encode_record(original)
    length, start = record_codec.read_varint(encoded, 0)
    assert start + length == len(encoded)
    header = read_header(build_batch(values(1)))._replace(last_offset_delta=5)
    batch = record_codec.encode_batch(header, [original])
    assert record_codec.decode_records(batch, read_header(batch)) == [original]


def test_keyless_records_fail_the_compacted_topic_check() -> None:
    good = build_batch(values(3))
    record_codec.check_keys(good, list(iter_batches(good)))
    for bad in (build_batch(values(3), keys=[b"a", None, b"c"]),
                compressed_batch([(b"a", b"1"), (None, b"2")], "zstd")):
        records = good + bad
        with pytest.raises(KafkaError) as raised:
            record_codec.check_keys(records, list(iter_batches(records)))
        assert raised.value.errno == ErrorCode.invalid_record.value == 87
    control = build_batch(values(1), keys=[None], attributes=0x20)
    record_codec.check_keys(control, list(iter_batches(control)))
    broken = bytearray(compressed_batch([(b"a", b"1")], "gzip"))
    broken[-6] ^= 0xFF  # the gzip trailer's CRC
    with pytest.raises(KafkaError) as raised:
        record_codec.check_keys(broken, list(iter_batches(broken)))
    assert raised.value.errno == ErrorCode.corrupt_message.value
