"""Every compression codec against its reference library, both ways, and Kafka's framings."""

from __future__ import annotations

import os

import pytest
import snappy
from hypothesis import given
from hypothesis import strategies as st

from services.common.records import compression
from services.common.records.compression import GZIP, LZ4, NONE, SNAPPY, ZSTD
from services.common.records.record import decode_records, encode_batch
from services.common.records.record_batch import HEADER_SIZE, RecordError, compute_crc, read_header

from ...record_batches import REFERENCE_DECOMPRESS, compressed_batch, encode_records


@pytest.mark.parametrize("codec", sorted(REFERENCE_DECOMPRESS))
def test_every_codec_reads_the_reference_library_and_writes_what_it_reads(codec: str) -> None:
    entries = [(f"k{i}".encode(), os.urandom(50) * 40) for i in range(60)]  # > 64 KiB raw
    batch = compressed_batch(entries, codec)
    header = read_header(batch)
    records = decode_records(batch, header)
    assert [(r.key, r.value) for r in records] == entries
    rebuilt = encode_batch(header, records,
                           xerial=compression.is_xerial(batch[HEADER_SIZE:]))
    assert read_header(rebuilt).size == len(rebuilt)
    assert read_header(rebuilt).crc == compute_crc(rebuilt, 0, len(rebuilt))
    payload = rebuilt[HEADER_SIZE:]
    assert REFERENCE_DECOMPRESS[codec](payload) == encode_records(entries)
    if codec == "lz4":
        # Kafka's framing: independent blocks (FLG 0x60), 64 KiB blocks, no checksums.
        assert payload[:7] == bytes.fromhex("04224d18604082")
    if codec == "snappy":
        assert payload.startswith(b"\x82SNAPPY\x00")


def test_raw_snappy_as_librdkafka_writes_it() -> None:
    raw = encode_records([(b"k", b"v" * 1000)] * 20)
    raw_snappy = compression.compress(SNAPPY, raw)
    assert not compression.is_xerial(raw_snappy)
    assert snappy.uncompress(raw_snappy) == raw
    assert compression.decompress(SNAPPY, raw_snappy) == raw
    assert compression.decompress(SNAPPY, snappy.compress(raw)) == raw


@given(data=st.binary(max_size=200_000), codec=st.sampled_from([NONE, GZIP, SNAPPY, LZ4, ZSTD]),
       xerial=st.booleans())
def test_what_is_compressed_decompresses(data: bytes, codec: int, xerial: bool) -> None:
    assert compression.decompress(codec, compression.compress(codec, data, xerial)) == data


def test_undecompressable_data_is_an_error() -> None:
    for codec in (GZIP, SNAPPY, LZ4, ZSTD):
        with pytest.raises(RecordError):
            compression.decompress(codec, b"not compressed at all")
    with pytest.raises(RecordError):  # xerial framing cut inside a block
        compression.decompress(SNAPPY, compression.compress(SNAPPY, b"x" * 100, True)[:-3])
    with pytest.raises(RecordError):
        compression.decompress(5, b"")


@pytest.mark.parametrize(("codec", "xerial"), [
    (GZIP, False), (SNAPPY, False), (SNAPPY, True), (LZ4, False), (ZSTD, False)])
def test_decompression_stops_at_its_limit(codec: int, xerial: bool) -> None:
    data = bytes(200_000) + os.urandom(1000)
    packed = compression.compress(codec, data, xerial=xerial)
    assert compression.decompress(codec, packed, limit=len(data)) == data
    with pytest.raises(RecordError, match=f"more than {len(data) - 1} bytes"):
        compression.decompress(codec, packed, limit=len(data) - 1)


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd"])
def test_a_decompression_bomb_is_refused_without_being_made(codec: str) -> None:
    """A few KB that claim gigabytes: refused at the default limit, having cost no more."""
    import cramjam

    compressor = getattr(cramjam, codec).Compressor()
    chunk = bytes(1 << 20)
    for _ in range(compression.MAX_DECOMPRESSED_BYTES // len(chunk) + 64):
        compressor.compress(chunk)
    bomb = bytes(compressor.finish())
    assert len(bomb) < 2 << 20
    with pytest.raises(RecordError, match="more than"):
        compression.decompress(getattr(compression, codec.upper()), bomb)
