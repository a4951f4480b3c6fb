"""Replication throttles on a log node: only the replicas a topic names for this node are
throttled, at the node's rate, one second of burst."""

from __future__ import annotations

from services.log.replication_quota import (
    FOLLOWER,
    LEADER,
    UNLIMITED,
    ReplicationQuota,
    throttled_replicas,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_throttled_replicas_of_a_topic():
    assert throttled_replicas("*") is None
    assert throttled_replicas("0:1, 2:3") == {(0, 1), (2, 3)}
    assert throttled_replicas("") == frozenset()


def test_only_the_replicas_named_for_this_node_are_throttled_and_only_with_a_rate():
    quota = ReplicationQuota(LEADER, node_id=1)
    configs = {"leader.replication.throttled.replicas": "0:1,2:0",
               "follower.replication.throttled.replicas": "*"}
    assert not quota.is_throttled(configs, 0)  # no rate set: nothing is throttled
    quota.set_rate(1000)
    assert quota.is_throttled(configs, 0) and not quota.is_throttled(configs, 2)
    assert not quota.is_throttled({}, 0)
    follower = ReplicationQuota(FOLLOWER, node_id=1)
    follower.set_rate(1000)
    assert follower.is_throttled(configs, 5)
    follower.set_rate(UNLIMITED)
    assert not follower.is_throttled(configs, 5) and not follower.exceeded()


def test_a_bucket_holds_a_second_of_its_rate():
    clock = Clock()
    quota = ReplicationQuota(LEADER, node_id=0, clock=clock)
    quota.set_rate(1000)
    assert not quota.exceeded() and quota.delay() == 0
    quota.record(3000)  # a second's worth and two more
    assert quota.exceeded()
    assert 1.9 < quota.delay() < 2.1
    clock.now += 2.05
    assert not quota.exceeded()
    clock.now += 60  # a long pause fills the bucket to one second, no more
    quota.record(1000)
    assert quota.exceeded()
