"""The ``__consumer_offsets`` codec: round trips of every key and value (Hypothesis) and Kafka's
own older value versions."""

from __future__ import annotations

import struct
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.handler.groups import records as r

names = st.text(max_size=30)
ints32 = st.integers(-(2**31), 2**31 - 1)
ints64 = st.integers(-(2**63), 2**63 - 1)
blobs = st.binary(max_size=64)

offset_values = st.builds(
    r.OffsetCommitValue, offset=ints64, leader_epoch=ints32, metadata=names,
    commit_timestamp=ints64, expire_timestamp=st.just(-1))
expiring_values = st.builds(
    r.OffsetCommitValue, offset=ints64, leader_epoch=st.just(-1), metadata=names,
    commit_timestamp=ints64, expire_timestamp=st.integers(0, 2**63 - 1))
extensions = st.builds(
    r.GroupExtension, state=st.integers(0, 4), join_deadline=ints64,
    initial_delay_remaining=ints64, new_member_added=st.booleans(),
    pending=st.lists(st.tuples(names, ints64), max_size=3).map(tuple),
    members=st.lists(st.builds(
        r.MemberExtension, member_id=names, joined=st.booleans(), protocol_type=names,
        protocols=st.lists(st.tuples(names, blobs), max_size=3).map(tuple)),
        max_size=3).map(tuple),
    sync_deadline=st.just(-1) | ints64, pending_sync=st.lists(names, max_size=3).map(tuple))
members = st.builds(
    r.MemberMetadata, member_id=names, group_instance_id=st.none() | names, client_id=names,
    client_host=names, rebalance_timeout=ints32, session_timeout=ints32, subscription=blobs,
    assignment=blobs)
group_values = st.builds(
    r.GroupMetadataValue, protocol_type=names, generation=ints32,
    protocol=st.none() | names, leader=st.none() | names, current_state_timestamp=ints64,
    members=st.lists(members, max_size=4).map(tuple), extension=st.none() | extensions)


@given(group=names, topic=names, partition=ints32)
def test_offset_commit_keys_round_trip(group: str, topic: str, partition: int) -> None:
    key = r.OffsetCommitKey(group, topic, partition)
    assert r.decode_key(key.encode()) == key


@given(group=names)
def test_group_metadata_keys_round_trip(group: str) -> None:
    key = r.GroupMetadataKey(group)
    assert r.decode_key(key.encode()) == key


@given(value=offset_values | expiring_values)
def test_offset_commit_values_round_trip(value: r.OffsetCommitValue) -> None:
    assert r.decode_offset_commit_value(value.encode()) == value


@settings(max_examples=200)
@given(value=group_values)
def test_group_metadata_values_round_trip(value: r.GroupMetadataValue) -> None:
    assert r.decode_group_metadata_value(value.encode()) == value


def _string(text: str) -> bytes:
    return struct.pack(">h", len(text)) + text.encode()


def test_kafka_offset_commit_value_v3_and_key_v0_as_kafka_writes_them() -> None:
    value = struct.pack(">hqi", 3, 42, 7) + _string("meta") + struct.pack(">q", 1000)
    assert r.decode_offset_commit_value(value) == r.OffsetCommitValue(
        offset=42, leader_epoch=7, metadata="meta", commit_timestamp=1000)
    key = struct.pack(">h", 0) + _string("g") + _string("t") + struct.pack(">i", 3)
    assert r.decode_key(key) == r.OffsetCommitKey("g", "t", 3)
    # Value v3 is what we write for a commit without an expiry, byte for byte.
    assert r.OffsetCommitValue(offset=42, leader_epoch=7, metadata="meta",
                               commit_timestamp=1000).encode() == value


def test_kafka_group_metadata_value_v2_without_an_extension() -> None:
    member = (_string("m-1") + _string("client") + _string("/10.0.0.1")
              + struct.pack(">ii", 300000, 45000) + struct.pack(">i", 3) + b"sub"
              + struct.pack(">i", 2) + b"as")
    value = (struct.pack(">h", 2) + _string("consumer") + struct.pack(">i", 5)
             + _string("range") + _string("m-1") + struct.pack(">q", 123)
             + struct.pack(">i", 1) + member)
    decoded = r.decode_group_metadata_value(value)
    assert decoded.generation == 5 and decoded.protocol == "range"
    assert decoded.extension is None
    assert decoded.members == (r.MemberMetadata(
        member_id="m-1", client_id="client", client_host="/10.0.0.1",
        rebalance_timeout=300000, session_timeout=45000, subscription=b"sub",
        assignment=b"as"),)


def test_the_extension_is_written_at_v0_unless_syncs_are_pending() -> None:
    plain = r.GroupExtension(state=3, members=(r.MemberExtension(member_id="m"),))
    assert plain.encode()[:2] == struct.pack(">h", 0)
    pending = replace(plain, sync_deadline=5000, pending_sync=("m",))
    assert pending.encode()[:2] == struct.pack(">h", 1)
    assert r.decode_group_extension(pending.encode()) == pending
    assert r.decode_group_extension(plain.encode()) == plain


def test_other_record_kinds_are_ignored_and_garbage_is_an_error() -> None:
    assert r.decode_key(struct.pack(">h", 3) + _string("g")) is None
    with pytest.raises(r.RecordFormatError):
        r.decode_key(b"\x00")
    with pytest.raises(r.RecordFormatError):
        r.decode_group_metadata_value(struct.pack(">h", 4) + b"\x05ab")
