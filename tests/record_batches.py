"""Record batches as tests need them: a producer's batch of values with any header fields
(deliberately inconsistent ones included, the CRC always right), batches compressed by the
reference libraries, and the offsets of the batches a read returned.

They are written with the codec (:mod:`services.common.records`), which
``tests/common/records`` checks against independent readers and writers: kio's record reader
and writer, and each codec's reference library.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence

import lz4.frame
import zstandard
from kafka import codec as kafka_codec

from services.common.records.compression import GZIP, LZ4, SNAPPY, ZSTD
from services.common.records.record import Record, encode_record
from services.common.records.record_batch import BatchHeader, iter_batches, pack_batch

Entry = tuple[bytes | None, bytes | None]

CODECS = {"gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}
# The reference library of each codec, both ways (snappy in the Java client's xerial framing).
REFERENCE_COMPRESS = {
    "gzip": gzip.compress,
    "snappy": lambda data: kafka_codec.snappy_encode(data, xerial_compatible=True),
    "lz4": lz4.frame.compress,
    "zstd": lambda data: zstandard.ZstdCompressor().compress(data),
}
REFERENCE_DECOMPRESS = {
    "gzip": gzip.decompress,
    "snappy": kafka_codec.snappy_decode,
    "lz4": lz4.frame.decompress,
    "zstd": lambda data: zstandard.ZstdDecompressor().decompressobj().decompress(data),
}


def encode_records(entries: Sequence[Entry], timestamp_step: int = 1) -> bytes:
    """Uncompressed records of ``(key, value)``: offset deltas 0, 1, ... and timestamp deltas
    ``i * timestamp_step``."""
    return b"".join(encode_record(Record(i, i * timestamp_step, key, value))
                    for i, (key, value) in enumerate(entries))


def build_batch(
    values: Sequence[bytes | None],
    *,
    keys: Sequence[bytes | None] | None = None,
    base_offset: int = 0,
    base_timestamp: int = 1_700_000_000_000,
    timestamp_step: int = 1,
    attributes: int = 0,
    partition_leader_epoch: int = -1,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    magic: int = 2,
    record_count: int | None = None,
    last_offset_delta: int | None = None,
    max_timestamp: int | None = None,
) -> bytes:
    """A valid batch of one record per value (record i has key ``keys[i]``, default ``k<i>``,
    and timestamp base + i * step), its records uncompressed whatever ``attributes`` say; the
    keyword overrides make deliberately inconsistent headers (the CRC stays right)."""
    if keys is None:
        keys = [f"k{i}".encode() for i in range(len(values))]
    payload = encode_records(list(zip(keys, values, strict=True)), timestamp_step)
    if max_timestamp is None:
        max_timestamp = base_timestamp + max(0, (len(values) - 1) * timestamp_step)
    header = BatchHeader(
        base_offset=base_offset, partition_leader_epoch=partition_leader_epoch, magic=magic,
        attributes=attributes,
        last_offset_delta=len(values) - 1 if last_offset_delta is None else last_offset_delta,
        base_timestamp=base_timestamp, max_timestamp=max_timestamp, producer_id=producer_id,
        producer_epoch=producer_epoch, base_sequence=base_sequence,
        record_count=len(values) if record_count is None else record_count)
    return pack_batch(header, payload)


def compressed_batch(entries: Sequence[Entry], codec: str, base_timestamp: int = 1000) -> bytes:
    """A batch of ``(key, value)`` records (timestamps base + i) compressed by the reference
    library of ``codec``."""
    count = len(entries)
    header = BatchHeader(attributes=CODECS[codec], last_offset_delta=count - 1,
                         base_timestamp=base_timestamp,
                         max_timestamp=base_timestamp + count - 1, record_count=count)
    return pack_batch(header, REFERENCE_COMPRESS[codec](encode_records(entries)))


def values(n: int, size: int = 10, tag: str = "v") -> list[bytes]:
    return [f"{tag}{i}".encode().ljust(size, b".") for i in range(n)]


def batch_offsets(records: bytes) -> list[tuple[int, int]]:
    """(base offset, record count) of each whole batch in ``records``."""
    return [(header.base_offset, header.record_count) for _, header in iter_batches(records)]
