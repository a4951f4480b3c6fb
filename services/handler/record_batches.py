"""Sizing runs of v2 record batches by their headers alone (records are never decoded).

    RecordBatch => BaseOffset:int64 BatchLength:int32 PartitionLeaderEpoch:int32 Magic:int8
                   CRC:uint32 Attributes:int16 ... Records

BatchLength counts the bytes after itself, so a batch spans ``12 + BatchLength`` bytes
(Kafka's ``LOG_OVERHEAD``). A run of batches is cut only at batch boundaries: a consumer gets
whole batches or none of a partition.
"""

from __future__ import annotations

import struct

LOG_OVERHEAD = 12
_BATCH_LENGTH = struct.Struct(">i")
_BATCH_LENGTH_OFFSET = 8


def whole_batches_size(records: bytes | memoryview, limit: int, at_least_one: bool) -> int:
    """The size of the longest prefix of whole batches in ``records`` that fits in ``limit``
    bytes. With ``at_least_one`` the first batch counts even if it alone exceeds ``limit``
    (Kafka's rule for the first partition of a fetch). A truncated or malformed batch ends the
    run."""
    size = len(records)
    pos = 0
    while pos + LOG_OVERHEAD <= size:
        (length,) = _BATCH_LENGTH.unpack_from(records, pos + _BATCH_LENGTH_OFFSET)
        end = pos + LOG_OVERHEAD + length
        if length < 0 or end > size:
            break
        if end > limit and not (at_least_one and pos == 0):
            break
        pos = end
    return pos


def trim_to_whole_batches(records: bytes, limit: int, at_least_one: bool) -> bytes:
    """``records`` (whole batches, as log nodes return them) cut to :func:`whole_batches_size`;
    the same object when nothing is cut. Data that already fits is returned without walking its
    batch headers: the common case of a fetch costs nothing per batch."""
    if len(records) <= limit:
        return records
    keep = whole_batches_size(records, limit, at_least_one)
    return records if keep == len(records) else records[:keep]
