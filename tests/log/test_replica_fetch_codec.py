"""Follower fetch answers written and read around their record batches: what is written is the
protobuf message any client parses, and reading it back gives each result with its records as
a view, whatever the field order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kbroker.log.v1 import log_pb2
from services.log.replica_fetch_codec import decode_fetch_response, encode_fetch_response

results = st.lists(st.tuples(
    st.builds(log_pb2.ReplicaFetchResult, topic=st.text(max_size=8),
              partition=st.integers(0, 1 << 20), error_code=st.integers(0, 120),
              error_message=st.text(max_size=8), high_watermark=st.integers(-1, 1 << 40),
              log_start_offset=st.integers(-1, 1 << 40), log_end_offset=st.integers(-1, 1 << 40)),
    st.binary(max_size=300)), max_size=5)


@given(results)
def test_written_answers_are_the_protobuf_message_and_read_back_whole(answer):
    data = encode_fetch_response(answer)
    parsed = log_pb2.ReplicaFetchResponse.FromString(data)
    expected = []
    for result, records in answer:
        full = log_pb2.ReplicaFetchResult()
        full.CopyFrom(result)
        full.records = records
        expected.append(full)
    assert list(parsed.results) == expected
    decoded = decode_fetch_response(data)
    assert [(r, bytes(v)) for r, v in decoded] == [(r, bytes(v)) for r, v in answer]


def test_an_answer_protobuf_wrote_reads_the_same():
    message = log_pb2.ReplicaFetchResponse(results=[
        log_pb2.ReplicaFetchResult(records=b"batches", topic="t", high_watermark=5),
        log_pb2.ReplicaFetchResult(topic="u", error_code=6)])
    decoded = decode_fetch_response(message.SerializeToString())
    assert [(r.topic, r.high_watermark, r.error_code, bytes(v)) for r, v in decoded] == [
        ("t", 5, 0, b"batches"), ("u", 0, 6, b"")]
