"""Sizing runs of v2 record batches by their headers alone (records are never decoded; the
format is :mod:`services.common.records.record_batch`).

A batch spans ``12 + batchLength`` bytes (Kafka's ``LOG_OVERHEAD``). A run of batches is cut
only at batch boundaries: a consumer gets whole batches or none of a partition.
"""

from __future__ import annotations

from services.common.records.record_batch import LOG_OVERHEAD, read_log_overhead


def whole_batches_size(records: bytes | memoryview, limit: int, at_least_one: bool) -> int:
    """The size of the longest prefix of whole batches in ``records`` that fits in ``limit``
    bytes. With ``at_least_one`` the first batch counts even if it alone exceeds ``limit``
    (Kafka's rule for the first partition of a fetch). A truncated or malformed batch ends the
    run."""
    size = len(records)
    pos = 0
    read = read_log_overhead
    while pos + LOG_OVERHEAD <= size:
        _, length = read(records, pos)
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
