import asyncio

import pytest

from kbroker.log.v1 import log_pb2
from services.common.errors import ErrorCode, KafkaError
from services.handler.collaborators import OutcomeUnknownError, UnreachableError
from services.handler.routing import call_leaders, leader_epoch_error, leader_error, locate

from .fakes import cluster, topic


def test_locate_finds_the_live_leader():
    snapshot = cluster(topic("t", 2, leaders=[0, 1]), nodes=(0, 1))
    route = locate(snapshot, snapshot.topic("t"), 1)
    assert route.leader.node_id == 1
    assert route.partition.partition == 1


@pytest.mark.parametrize(
    ("name", "partition", "code"),
    [
        ("missing", 0, ErrorCode.unknown_topic_or_partition),
        ("t", 5, ErrorCode.unknown_topic_or_partition),
        ("t", -1, ErrorCode.unknown_topic_or_partition),
        ("t", 1, ErrorCode.not_leader_or_follower),
    ],
)
def test_locate_errors(name, partition, code):
    snapshot = cluster(topic("t", 2, leaders=[0, 1]), nodes=(0,), dead=(1,))
    with pytest.raises(KafkaError) as failure:
        locate(snapshot, snapshot.topic(name), partition)
    assert failure.value.code == code


def test_the_broker_a_client_chose_answers_for_its_partitions_until_it_is_fenced():
    """Produce names the broker it reached: its partitions go to it even while it misses
    heartbeats (as a Kafka leader serves whatever the controller thinks of it), so a request
    refused there never lets the next one on the connection skip its sequence numbers."""
    snapshot = cluster(topic("t", 3, leaders=[0, 1, 2]), nodes=(0,), dead=(1,), fenced=(2,))
    route = locate(snapshot, snapshot.topic("t"), 1, broker_id=1)
    assert route.leader.node_id == 1
    for partition, broker in ((2, 2), (1, 0)):
        with pytest.raises(KafkaError) as failure:
            locate(snapshot, snapshot.topic("t"), partition, broker_id=broker)
        assert failure.value.code == ErrorCode.not_leader_or_follower
    with pytest.raises(KafkaError):  # reads still go only to live leaders
        locate(snapshot, snapshot.topic("t"), 1)


def test_a_leader_that_does_not_know_its_partition_is_not_its_leader():
    assert leader_error(3) == 6
    assert leader_error(1) == 1
    assert leader_error(0) == 0


def test_leader_epoch_checks():
    assert leader_epoch_error(-1, 5) is None
    assert leader_epoch_error(5, 5) is None
    assert leader_epoch_error(6, 5) == ErrorCode.unknown_leader_epoch
    assert leader_epoch_error(4, 5) == ErrorCode.fenced_leader_epoch
    assert ErrorCode.fenced_leader_epoch.value == 74
    assert ErrorCode.unknown_leader_epoch.value == 75


def test_calls_go_once_per_node_concurrently_and_failures_stay_per_node():
    snapshot = cluster(topic("t", 4, leaders=[0, 1, 0, 2]), nodes=(0, 1, 2))
    items = [(locate(snapshot, snapshot.topic("t"), p), p) for p in range(4)]
    calls = {}
    running = 0
    peak = 0

    async def call(node, parts):
        nonlocal running, peak
        calls[node.node_id] = parts
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        if node.node_id == 1:
            raise UnreachableError("down")
        if node.node_id == 2:
            return []  # no result for partition 3
        return [log_pb2.PartitionReadResult(topic="t", partition=p, error_code=3 if p else 0)
                for p in parts]

    answers = {item: (code, detail)
               for item, code, detail in asyncio.run(call_leaders(items, call, effect=True))}
    assert calls == {0: [0, 2], 1: [1], 2: [3]}
    assert answers[0][0] == 0 and answers[0][1].partition == 0
    assert answers[2][0] == 6  # the leader does not know its partition: not its leader
    assert answers[1][0] == 6 and isinstance(answers[1][1], UnreachableError)
    assert answers[3] == (-1, None)
    assert peak == 3


@pytest.mark.parametrize(("failure", "effect", "code"), [
    (UnreachableError("refused"), True, 6), (OutcomeUnknownError("deadline"), True, 7),
    (RuntimeError("bug"), True, -1), (OutcomeUnknownError("deadline"), False, 6),
    (RuntimeError("bug"), False, 6)])
def test_a_failed_call_is_answered_by_what_it_may_have_done(failure, effect, code):
    snapshot = cluster(topic("t"))

    async def call(node, parts):
        raise failure

    answers = asyncio.run(call_leaders([(locate(snapshot, snapshot.topic("t"), 0), "p")], call,
                                       effect=effect))
    assert answers == [("p", code, failure)]
