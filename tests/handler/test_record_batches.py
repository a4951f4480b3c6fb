from hypothesis import given
from hypothesis import strategies as st

from services.handler.apis.fetch import trim_to_whole_batches, whole_batches_size

from .batches import batch_offsets, record_batch


def run_of(sizes: list[int]) -> tuple[bytes, list[int]]:
    batches = [record_batch([b"v" * size], base_offset=i) for i, size in enumerate(sizes)]
    return b"".join(batches), [len(b) for b in batches]


@given(st.lists(st.integers(0, 300), max_size=8), st.integers(0, 3000), st.booleans())
def test_prefix_is_whole_batches_within_the_limit(sizes, limit, at_least_one):
    records, lengths = run_of(sizes)
    size = whole_batches_size(records, limit, at_least_one)
    boundaries = [sum(lengths[:i]) for i in range(len(lengths) + 1)]
    assert size in boundaries
    if at_least_one and lengths:
        assert size >= lengths[0]
        assert size <= max(limit, lengths[0])
    else:
        assert size <= limit
    # Longest such prefix: the next batch would not fit.
    index = boundaries.index(size)
    if index < len(lengths):
        assert size + lengths[index] > limit


@given(st.lists(st.integers(0, 100), min_size=1, max_size=5), st.integers(1, 60))
def test_a_torn_tail_is_never_returned(sizes, cut):
    records, lengths = run_of(sizes)
    torn = records[: len(records) - min(cut, lengths[-1])]
    size = whole_batches_size(torn, 10**9, at_least_one=True)
    assert size == sum(lengths[:-1])


def test_trim_keeps_the_object_when_nothing_is_cut():
    records, lengths = run_of([10, 20, 30])
    assert trim_to_whole_batches(records, 10**6, False) is records
    cut = trim_to_whole_batches(records, lengths[0] + lengths[1], False)
    assert batch_offsets(cut) == [(0, 1), (1, 1)]
    assert trim_to_whole_batches(records, 1, True) == records[: lengths[0]]
    assert trim_to_whole_batches(records, 1, False) == b""
    assert trim_to_whole_batches(b"", 100, True) == b""


def test_the_test_batch_builder_writes_batches_kafka_readers_accept():
    from kio.records.readers import read_batch

    data = record_batch([b"hello", b"world"], keys=[b"k", None], base_offset=5,
                        timestamp_ms=1_700_000_000_000)
    batch, size = read_batch(data, 0)
    assert size == len(data)
    assert batch.base_offset == 5
    assert [(r.offset, r.key, r.value) for r in batch.records] == [
        (5, b"k", b"hello"), (6, None, b"world")]
    assert batch_offsets(data) == [(5, 2)]
