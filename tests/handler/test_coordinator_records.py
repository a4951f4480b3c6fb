"""The coordinator records, through the one schema-driven codec: round trips of every key and
value of ``__consumer_offsets`` and ``__transaction_state`` (Hypothesis), the versions we
write, Kafka's own older versions and tagged fields, byte for byte as Kafka writes them."""

from __future__ import annotations

import struct
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.handler import coordinator_records as r
from services.handler.coordinator.schema import (
    RecordFormatError,
    decode,
    decode_key,
    encode,
    lowest_version,
)
from services.handler.groups.state import offset_record

names = st.text(max_size=30)
ints16 = st.integers(-(2**15), 2**15 - 1)
ints32 = st.integers(-(2**31), 2**31 - 1)
ints64 = st.integers(-(2**63), 2**63 - 1)
blobs = st.binary(max_size=64)


def tuples(strategy: st.SearchStrategy, size: int = 3) -> st.SearchStrategy:
    return st.lists(strategy, max_size=size).map(tuple)


offset_values = st.builds(
    r.OffsetCommitValue, offset=ints64, leader_epoch=ints32, metadata=names,
    commit_timestamp=ints64, expire_timestamp=st.just(-1))
expiring_values = st.builds(
    r.OffsetCommitValue, offset=ints64, leader_epoch=st.just(-1), metadata=names,
    commit_timestamp=ints64, expire_timestamp=st.integers(0, 2**63 - 1))
extensions = st.builds(
    r.GroupExtension, state=st.integers(0, 4), join_deadline=ints64,
    initial_delay_remaining=ints64, new_member_added=st.booleans(),
    pending=tuples(st.builds(r.PendingMember, member_id=names, expires=ints64)),
    members=tuples(st.builds(
        r.MemberExtension, member_id=names, joined=st.booleans(), protocol_type=names,
        protocols=tuples(st.builds(r.ProtocolMetadata, name=names, metadata=blobs)))),
    sync_deadline=st.just(-1) | ints64, pending_sync=tuples(names))
members = st.builds(
    r.MemberMetadata, member_id=names, group_instance_id=st.none() | names, client_id=names,
    client_host=names, rebalance_timeout=ints32, session_timeout=ints32, subscription=blobs,
    assignment=blobs)
group_values = st.builds(
    r.GroupMetadataValue, protocol_type=names, generation=ints32,
    protocol=st.none() | names, leader=st.none() | names, current_state_timestamp=ints64,
    members=tuples(members, 4), extension=st.none() | extensions)
transaction_values = st.builds(
    r.TransactionLogValue, producer_id=ints64, previous_producer_id=ints64,
    next_producer_id=ints64, producer_epoch=ints16, transaction_timeout_ms=ints32,
    transaction_status=st.integers(0, 7),
    transaction_partitions=st.none() | tuples(st.builds(
        r.TransactionPartitions, topic=names, partition_ids=tuples(ints32, 5))),
    transaction_last_update_timestamp_ms=ints64, transaction_start_timestamp_ms=ints64,
    client_transaction_version=ints16, extension=st.none() | st.builds(
        r.TransactionExtension, last_producer_epoch=ints16))


@given(group=names, topic=names, partition=ints32)
def test_offset_commit_keys_round_trip(group: str, topic: str, partition: int) -> None:
    key = r.OffsetCommitKey(group=group, topic=topic, partition=partition)
    assert decode_key(r.OFFSETS_KEYS, encode(key, 1)) == key


@given(group=names)
def test_group_metadata_keys_round_trip(group: str) -> None:
    key = r.GroupMetadataKey(group=group)
    assert decode_key(r.OFFSETS_KEYS, encode(key)) == key


@given(value=offset_values | expiring_values)
def test_offset_commit_values_round_trip(value: r.OffsetCommitValue) -> None:
    _, stored = offset_record("g", ("t", 0), value)
    assert stored is not None
    # v3, or v1 to keep an expiry time.
    assert stored[:2] == struct.pack(">h", 1 if value.expire_timestamp >= 0 else 3)
    assert decode(r.OffsetCommitValue, stored) == value


@settings(max_examples=200)
@given(value=group_values)
def test_group_metadata_values_round_trip(value: r.GroupMetadataValue) -> None:
    assert decode(r.GroupMetadataValue, encode(value, 4)) == value


@settings(max_examples=200)
@given(value=transaction_values, key=names)
def test_transaction_log_records_round_trip(value: r.TransactionLogValue, key: str) -> None:
    assert decode(r.TransactionLogValue, encode(value, 1)) == value
    old = replace(value, previous_producer_id=-1, next_producer_id=-1,
                  client_transaction_version=0, extension=None)
    assert decode(r.TransactionLogValue, encode(old, 0)) == old
    assert lowest_version(old) == 0
    stored = r.TransactionLogKey(transactional_id=key)
    assert decode_key(r.TRANSACTION_KEYS, encode(stored)) == stored


def _string(text: str) -> bytes:
    return struct.pack(">h", len(text)) + text.encode()


def test_kafka_offset_commit_value_v3_and_key_v0_as_kafka_writes_them() -> None:
    value = struct.pack(">hqi", 3, 42, 7) + _string("meta") + struct.pack(">q", 1000)
    assert decode(r.OffsetCommitValue, value) == r.OffsetCommitValue(
        offset=42, leader_epoch=7, metadata="meta", commit_timestamp=1000)
    key = struct.pack(">h", 0) + _string("g") + _string("t") + struct.pack(">i", 3)
    assert decode_key(r.OFFSETS_KEYS, key) == r.OffsetCommitKey(group="g", topic="t",
                                                                partition=3)
    # Value v3 is what we write for a commit without an expiry, byte for byte.
    assert offset_record("g", ("t", 3), r.OffsetCommitValue(
        offset=42, leader_epoch=7, metadata="meta", commit_timestamp=1000))[1] == value


def test_kafka_group_metadata_value_v2_without_an_extension() -> None:
    member = (_string("m-1") + _string("client") + _string("/10.0.0.1")
              + struct.pack(">ii", 300000, 45000) + struct.pack(">i", 3) + b"sub"
              + struct.pack(">i", 2) + b"as")
    value = (struct.pack(">h", 2) + _string("consumer") + struct.pack(">i", 5)
             + _string("range") + _string("m-1") + struct.pack(">q", 123)
             + struct.pack(">i", 1) + member)
    decoded = decode(r.GroupMetadataValue, value)
    assert decoded.generation == 5 and decoded.protocol == "range"
    assert decoded.extension is None
    assert decoded.members == (r.MemberMetadata(
        member_id="m-1", client_id="client", client_host="/10.0.0.1",
        rebalance_timeout=300000, session_timeout=45000, subscription=b"sub",
        assignment=b"as"),)


def test_the_extension_is_a_tagged_field_kafka_skips_and_is_v0_unless_syncs_are_pending() -> None:
    plain = r.GroupExtension(state=3, members=(r.MemberExtension(member_id="m"),))
    assert encode(plain)[:2] == struct.pack(">h", 0)
    pending = replace(plain, sync_deadline=5000, pending_sync=("m",))
    assert encode(pending)[:2] == struct.pack(">h", 1)
    assert decode(r.GroupExtension, encode(pending)) == pending
    assert decode(r.GroupExtension, encode(plain)) == plain
    # In the value: tag, size, then the extension as stored on its own.
    value = encode(r.GroupMetadataValue(extension=plain), 4)
    tag = bytes([0xE2, 0xD6, 0x01])  # EXTENSION_TAG as an unsigned varint
    assert value.endswith(b"\x01" + tag + bytes([len(encode(plain))]) + encode(plain))
    # A reader that does not know the tag (Kafka's, or ours for other tags) skips it.
    unknown = value.replace(tag, bytes([0x05]))
    assert decode(r.GroupMetadataValue, unknown) == r.GroupMetadataValue()


def test_other_record_kinds_are_ignored_and_garbage_is_an_error() -> None:
    # Key 10: a share group (KIP-932), which this coordinator does not keep.
    assert decode_key(r.OFFSETS_KEYS, struct.pack(">h", 10) + _string("g")) is None
    with pytest.raises(RecordFormatError):
        decode_key(r.OFFSETS_KEYS, b"\x00")
    with pytest.raises(RecordFormatError):
        decode(r.GroupMetadataValue, struct.pack(">h", 4) + b"\x05ab")
    with pytest.raises(RecordFormatError):
        decode(r.GroupMetadataValue, struct.pack(">h", 5))
    with pytest.raises(RecordFormatError):  # a null where Kafka's schema has none
        decode_key(r.OFFSETS_KEYS, struct.pack(">hh", 2, -1))


def test_kafka_transaction_log_values_as_kafka_writes_them() -> None:
    partitions = (r.TransactionPartitions(topic="t", partition_ids=(0, 2)),)
    v0 = (struct.pack(">hqhib", 0, 7, 3, 60000, 2) + struct.pack(">i", 1) + _string("t")
          + struct.pack(">iii", 2, 0, 2) + struct.pack(">qq", 1000, 900))
    assert decode(r.TransactionLogValue, v0) == r.TransactionLogValue(
        producer_id=7, producer_epoch=3, transaction_timeout_ms=60000, transaction_status=2,
        transaction_partitions=partitions, transaction_last_update_timestamp_ms=1000,
        transaction_start_timestamp_ms=900)
    # v1: compact forms, a struct's own (empty) tagged fields, then the value's tagged fields
    # in tag order (0 previous and 1 next producer id, 2 the client's transaction version).
    v1 = (struct.pack(">hqhib", 1, 7, 3, 60000, 2) + bytes([2, 2]) + b"t" + bytes([3])
          + struct.pack(">ii", 0, 2) + b"\x00" + struct.pack(">qq", 1000, 900)
          + bytes([3, 0, 8]) + struct.pack(">q", 6) + bytes([1, 8]) + struct.pack(">q", 8)
          + bytes([2, 2]) + struct.pack(">h", 2))
    value = r.TransactionLogValue(
        producer_id=7, previous_producer_id=6, next_producer_id=8, producer_epoch=3,
        transaction_timeout_ms=60000, transaction_status=2, transaction_partitions=partitions,
        transaction_last_update_timestamp_ms=1000, transaction_start_timestamp_ms=900,
        client_transaction_version=2)
    assert decode(r.TransactionLogValue, v1) == value
    assert encode(value, 1) == v1
    # No partitions (an empty transaction's record) is a null array.
    empty = replace(value, transaction_partitions=None, previous_producer_id=-1,
                    next_producer_id=-1, client_transaction_version=0)
    assert encode(empty, 1)[17:18] == b"\x00" and encode(empty, 1).endswith(b"\x00")
    assert encode(empty, 0)[17:21] == struct.pack(">i", -1)
    key = struct.pack(">h", 0) + _string("tx-1")
    assert decode_key(r.TRANSACTION_KEYS, key) == r.TransactionLogKey(transactional_id="tx-1")
    # The extension (the producer's previous epoch) is one more tagged field, "kb", which
    # Kafka's readers skip as unknown.
    extended = encode(replace(value, extension=r.TransactionExtension(last_producer_epoch=2)), 1)
    assert extended == v1[:-len(bytes([2, 2]) + struct.pack(">h", 2))].replace(
        bytes([3, 0, 8]), bytes([4, 0, 8]), 1) + bytes([2, 2]) + struct.pack(">h", 2) + (
        bytes([0xE2, 0xD6, 0x01, 4]) + struct.pack(">hh", 0, 2))
