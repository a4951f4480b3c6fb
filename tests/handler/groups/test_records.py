"""Record batches of ``__consumer_offsets``: the log node accepts them as they are, and they
read back (the record formats are tested in ``tests/handler/test_coordinator_records.py``)."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from services.handler.groups import records as r
from services.log.record_batch import validate_append

blobs = st.binary(max_size=64)


@given(items=st.lists(st.tuples(blobs.filter(bool), st.none() | blobs), min_size=1,
                      max_size=8), base=st.integers(0, 2**40))
def test_batches_are_valid_for_the_log_node_and_read_back(
        items: list[tuple[bytes, bytes | None]], base: int) -> None:
    batch = bytearray(r.build_batch(items, 1_700_000_000_000))
    validate_append(bytes(batch), 1 << 20)
    batch[0:8] = struct.pack(">q", base)  # as the log node assigns it
    got = list(r.read_records(bytes(batch)))
    assert [(g.offset, g.key, g.value) for g in got] == [
        (base + i, k, v) for i, (k, v) in enumerate(items)]
    assert r.batches_end(bytes(batch)) == base + len(items)
    assert list(r.read_records(bytes(batch)[:-1])) == []  # a torn batch yields nothing
