"""Record batches as the handler tests need them: a producer's batch of values (keys optional,
timestamp now by default) and the offsets of the batches a fetch returned."""

from __future__ import annotations

import time

from ..record_batches import batch_offsets, build_batch

__all__ = ["batch_offsets", "record_batch"]


def record_batch(
    values: list[bytes],
    *,
    keys: list[bytes | None] | None = None,
    base_offset: int = 0,
    timestamp_ms: int | None = None,
    producer_id: int = -1,
) -> bytes:
    """One uncompressed magic-2 batch holding ``values`` (one record each, all stamped
    ``timestamp_ms``)."""
    if not values:
        raise ValueError("a batch holds at least one record")
    timestamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    return build_batch(values, keys=keys or [None] * len(values), base_offset=base_offset,
                       base_timestamp=timestamp, timestamp_step=0, producer_id=producer_id)
