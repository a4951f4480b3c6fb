"""Payloads written into and read out of serialized messages by hand are the messages of the
schema: what protobuf serializes whole, :func:`split` takes apart into the same fields and
payloads, and what :func:`splice` builds, protobuf parses into the whole message."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.log.v1 import log_pb2
from services.common import payloads
from services.common.payloads import PayloadPath

PRODUCE = PayloadPath(k.ProduceRequest.DESCRIPTOR, "topic_data.partition_data.records")
APPEND = PayloadPath(log_pb2.AppendStreamRequest.DESCRIPTOR, "request.partitions.records")
READ = PayloadPath(log_pb2.ReadResponse.DESCRIPTOR, "results.records")

records = st.one_of(st.none(), st.binary(max_size=300), st.sampled_from([b"", b"\x00" * 70_000]))
partitions = st.lists(st.tuples(st.integers(-1, 2**31 - 1), records), max_size=4)
topics = st.lists(st.tuples(st.text(max_size=8), partitions), max_size=3)


def produce_request(acks: int, spec: list) -> k.ProduceRequest:
    request = k.ProduceRequest(acks=acks, timeout_ms=30_000, transactional_id="t")
    for name, parts in spec:
        topic = request.topic_data.add(name=name)
        for index, data in parts:
            partition = topic.partition_data.add(index=index)
            if data is not None:
                partition.records = data
    return request


@settings(max_examples=150, deadline=None)
@given(st.integers(-1, 1), topics)
def test_split_takes_apart_what_protobuf_wrote(acks: int, spec: list) -> None:
    whole = produce_request(acks, spec)
    data = whole.SerializeToString()
    rest, found = payloads.split(data, PRODUCE)
    assert [None if p is None else bytes(p) for p in found] == [
        data for _, parts in spec for _, data in parts]
    # Views of the received bytes, not copies.
    assert all(p.obj is data for p in found if p is not None and len(p))
    stripped = k.ProduceRequest()
    stripped.CopyFrom(whole)
    payloads.take(stripped, PRODUCE)
    assert k.ProduceRequest.FromString(rest) == stripped
    assert payloads.fill(k.ProduceRequest.FromString(rest), PRODUCE, found) == whole


@settings(max_examples=150, deadline=None)
@given(st.integers(-1, 1), topics)
def test_what_splice_builds_protobuf_parses_whole(acks: int, spec: list) -> None:
    whole = produce_request(acks, spec)
    head = k.ProduceRequest()
    head.CopyFrom(whole)
    taken = payloads.take(head, PRODUCE)
    pieces, size = payloads.splice(head.SerializeToString(), PRODUCE, taken)
    data = b"".join(pieces)
    assert len(data) == size
    assert k.ProduceRequest.FromString(data) == whole
    assert payloads.spliced(head, PRODUCE, taken) == data
    # The payloads are pieces as they are (no copy before the one join).
    assert all(any(piece is p for piece in pieces) for p in taken if p)


def test_a_singular_message_on_the_path_and_proto3_payloads() -> None:
    head = log_pb2.AppendStreamRequest(call_id=7, request=log_pb2.AppendRequest(partitions=[
        log_pb2.PartitionAppend(topic="a", partition=0, verification_guard=3),
        log_pb2.PartitionAppend(topic="b", partition=1)]))
    batches = [b"\x01" * 1000, memoryview(b"\x02" * 20)]
    data = payloads.spliced(head, APPEND, batches)
    parsed = log_pb2.AppendStreamRequest.FromString(data)
    assert [p.records for p in parsed.request.partitions] == [b"\x01" * 1000, b"\x02" * 20]
    assert (parsed.call_id, parsed.request.partitions[0].verification_guard) == (7, 3)
    message, found = payloads.parse(data, log_pb2.AppendStreamRequest, APPEND)
    assert message == head and [bytes(p) for p in found if p is not None] == [
        b"\x01" * 1000, b"\x02" * 20]


def test_a_payload_given_twice_takes_the_last_as_protobuf_does() -> None:
    first = log_pb2.ReadResponse(results=[log_pb2.PartitionReadResult(topic="t", records=b"old")])
    again = log_pb2.PartitionReadResult(records=b"new").SerializeToString()
    inner = first.results[0].SerializeToString() + again
    data = b"\x0a" + bytes([len(inner)]) + inner
    assert log_pb2.ReadResponse.FromString(data).results[0].records == b"new"
    rest, found = payloads.split(data, READ)
    assert [bytes(p) for p in found if p is not None] == [b"new"]
    assert log_pb2.ReadResponse.FromString(rest).results[0].topic == "t"


def test_payload_counts_must_match_and_garbage_is_refused() -> None:
    head = log_pb2.ReadResponse(results=[log_pb2.PartitionReadResult(topic="t")])
    with pytest.raises(ValueError, match="fewer"):
        payloads.splice(head.SerializeToString(), READ, [])
    with pytest.raises(ValueError, match="more"):
        payloads.splice(head.SerializeToString(), READ, [b"a", b"b"])
    with pytest.raises(DecodeError):
        payloads.split(b"\x0a\x05ab", READ)  # a length past the end
    with pytest.raises(DecodeError):
        payloads.split(b"\x0f", READ)  # an unknown wire type


def test_a_path_must_end_in_a_bytes_field() -> None:
    with pytest.raises(ValueError, match="not a bytes field"):
        PayloadPath(log_pb2.ReadResponse.DESCRIPTOR, "results.topic")
    with pytest.raises(ValueError, match="not a message field"):
        PayloadPath(log_pb2.ReadResponse.DESCRIPTOR, "results.topic.x")


def _append_of(batches: list[bytes | None]) -> log_pb2.AppendStreamRequest:
    return log_pb2.AppendStreamRequest(call_id=3, request=log_pb2.AppendRequest(partitions=[
        log_pb2.PartitionAppend(topic="a", partition=number) for number in range(len(batches))]))


@pytest.mark.parametrize("batches, spliced", [
    ([b"\x01" * 1000, None], False),  # small
    ([b"\x02" * payloads.SPLICE_MIN_BYTES, b""], True),  # large
    # Large, but in payloads too small for the walk per payload to pay.
    ([b"\x03" * 3000] * 40, False),
    # One large payload among small ones: spliced, and split (the first payload is large).
    ([b"\x04" * 200_000] + [b"\x05" * 100] * 3, True),
])
def test_messages_of_large_payloads_are_taken_apart_and_the_rest_left_to_protobuf(
        batches: list[bytes | None], spliced: bool) -> None:
    serialized = payloads.Detached(_append_of(batches), APPEND, list(batches)).serialized()
    assert isinstance(serialized, tuple) == spliced
    data = serialized if isinstance(serialized, bytes) else b"".join(serialized[0])
    whole = log_pb2.AppendStreamRequest.FromString(data)
    assert [p.records for p in whole.request.partitions] == [b or b"" for b in batches]
    message, found = payloads.parse_message(data, log_pb2.AppendStreamRequest, APPEND)
    if spliced:
        assert found is not None
        assert [None if p is None else bytes(p) for p in found] == [b or b"" for b in batches]
        assert all(not p.records for p in message.request.partitions)
    else:
        assert found is None and message == whole


def test_a_receiver_goes_by_the_first_payload_unless_the_message_is_very_large() -> None:
    # Spliced by a sender that judges otherwise (any valid serialization may arrive).
    def received(batches: list[bytes]) -> bytes:
        return b"".join(payloads.Detached(_append_of(batches), APPEND, batches).pieces()[0])

    small_first = [b"\x06" * 100, b"\x07" * 100_000]
    message, found = payloads.parse_message(received(small_first), log_pb2.AppendStreamRequest,
                                            APPEND)
    assert found is None
    assert [p.records for p in message.request.partitions] == small_first
    very_large = [b"\x08" * 100, b"\x09" * payloads.SPLIT_ALWAYS_BYTES]
    message, found = payloads.parse_message(received(very_large), log_pb2.AppendStreamRequest,
                                            APPEND)
    assert found is not None and [bytes(p) for p in found] == very_large
    # Bytes that are no message fail as protobuf fails them.
    with pytest.raises(DecodeError):
        payloads.parse_message(b"\x0a\xff" + bytes(payloads.SPLICE_MIN_BYTES),
                               log_pb2.AppendStreamRequest, APPEND)
