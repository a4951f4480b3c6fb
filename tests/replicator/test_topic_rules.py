"""Topic validation rules and their Kafka error codes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.errors import ErrorCode, KafkaError
from services.replicator.topic_rules import (
    collision_key,
    resolve_num_partitions,
    resolve_replication_factor,
    validate_assignment,
    validate_configs,
    validate_topic_name,
)


def code_of(call, *args, **kwargs) -> ErrorCode:
    with pytest.raises(KafkaError) as raised:
        call(*args, **kwargs)
    return raised.value.code


@pytest.mark.parametrize("name", ["t", "a.b_c-D9", "x" * 249, "__consumer_offsets", "..."])
def test_legal_topic_names(name):
    validate_topic_name(name)


@pytest.mark.parametrize("name", ["", ".", "..", "x" * 250, "with space", "slash/", "é", "a:b"])
def test_illegal_topic_names(name):
    assert code_of(validate_topic_name, name) == ErrorCode.invalid_topic_exception


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300))
def test_name_rule_matches_kafkas_definition(name):
    legal = (
        0 < len(name) <= 249
        and name not in (".", "..")
        and all(c.isascii() and (c.isalnum() or c in "._-") for c in name)
    )
    if legal:
        validate_topic_name(name)
    else:
        assert code_of(validate_topic_name, name) == ErrorCode.invalid_topic_exception


def test_dots_and_underscores_collide():
    assert collision_key("a.b") == collision_key("a_b") != collision_key("a-b")


def test_partition_count():
    assert resolve_num_partitions(-1, 3) == 3
    assert resolve_num_partitions(5, 3) == 5
    for bad in (0, -2, -100):
        assert code_of(resolve_num_partitions, bad, 3) == ErrorCode.invalid_partitions


def test_replication_factor():
    assert resolve_replication_factor(-1, 2, 3) == 2
    assert resolve_replication_factor(3, 1, 3) == 3
    for bad in (0, -2):
        code = code_of(resolve_replication_factor, bad, 1, 3)
        assert code == ErrorCode.invalid_replication_factor
    with pytest.raises(KafkaError) as raised:
        resolve_replication_factor(4, 1, 3)
    assert raised.value.code == ErrorCode.invalid_replication_factor
    assert "4" in str(raised.value.message) and "only 3" in str(raised.value.message)
    # The default must fit the live nodes too.
    assert code_of(resolve_replication_factor, -1, 3, 2) == ErrorCode.invalid_replication_factor


def assignment(assignments, num_partitions=-1, replication_factor=-1, known=(0, 1, 2),
               live=(0, 1, 2)):
    return validate_assignment(assignments, num_partitions=num_partitions,
                               replication_factor=replication_factor, known_nodes=known,
                               live_nodes=live)


def test_valid_manual_assignment():
    assert assignment({1: [2, 0], 0: [0, 1]}) == [(0, 1), (2, 0)]
    assert assignment({0: [2, 1]}, live=(1,)) == [(2, 1)]


@pytest.mark.parametrize(
    ("assignments", "kwargs", "code"),
    [
        ({0: [0]}, {"num_partitions": 1}, ErrorCode.invalid_request),
        ({0: [0]}, {"replication_factor": 1}, ErrorCode.invalid_request),
        ({1: [0]}, {}, ErrorCode.invalid_replica_assignment),
        ({0: [0], 2: [1]}, {}, ErrorCode.invalid_replica_assignment),
        ({0: []}, {}, ErrorCode.invalid_replica_assignment),
        ({0: [0, 0]}, {}, ErrorCode.invalid_replica_assignment),
        ({0: [0, 7]}, {}, ErrorCode.invalid_replica_assignment),
        ({0: [0, 1], 1: [2]}, {}, ErrorCode.invalid_replica_assignment),
        ({0: [2]}, {"live": (0, 1)}, ErrorCode.invalid_replica_assignment),
    ],
)
def test_invalid_manual_assignments(assignments, kwargs, code):
    assert code_of(assignment, assignments, **kwargs) == code


@pytest.mark.parametrize(
    "configs",
    [
        {},
        {"cleanup.policy": "compact,delete"},
        {"cleanup.policy": "delete"},
        {"compression.type": "zstd", "compression.zstd.level": "3"},
        {"retention.ms": "-1", "retention.bytes": "-1", "segment.bytes": "1048576"},
        {"message.timestamp.type": "LogAppendTime", "min.insync.replicas": "2"},
        {"unclean.leader.election.enable": "TRUE", "preallocate": "false"},
        {"min.cleanable.dirty.ratio": "0.5", "max.message.bytes": " 1000012 "},
        {"leader.replication.throttled.replicas": "0:1, 1:2",
         "follower.replication.throttled.replicas": "*"},
        {"local.retention.ms": "-2", "remote.storage.enable": "false",
         "message.downconversion.enable": "true", "flush.messages": "1", "flush.ms": "0",
         "delete.retention.ms": "0", "file.delete.delay.ms": "60000",
         "index.interval.bytes": "4096", "message.timestamp.difference.max.ms": "1",
         "message.timestamp.before.max.ms": "0", "message.timestamp.after.max.ms": "0",
         "min.compaction.lag.ms": "0", "max.compaction.lag.ms": "1", "segment.ms": "1",
         "segment.index.bytes": "4", "segment.jitter.ms": "0", "local.retention.bytes": "-2"},
    ],
)
def test_valid_configs(configs):
    assert validate_configs(configs) == configs


@pytest.mark.parametrize(
    "configs",
    [
        {"no.such.config": "1"},
        {"cleanup.policy": "compact,forever"},
        {"compression.type": "brotli"},
        {"retention.ms": "-2"},
        {"retention.ms": "1.5"},
        {"retention.ms": "9223372036854775808"},
        {"segment.bytes": "13"},
        {"segment.bytes": "2147483648"},
        {"min.insync.replicas": "0"},
        {"message.timestamp.type": "createtime"},
        {"min.cleanable.dirty.ratio": "1.5"},
        {"min.cleanable.dirty.ratio": "nan"},
        {"preallocate": "yes"},
        {"flush.messages": "0"},
        {"leader.replication.throttled.replicas": "0-1"},
        {"remote.storage.enable": "true"},
        {"max.message.bytes": ""},
    ],
)
def test_invalid_configs(configs):
    with pytest.raises(KafkaError) as raised:
        validate_configs(configs)
    assert raised.value.code == ErrorCode.invalid_config
    assert next(iter(configs)) in str(raised.value.message)
