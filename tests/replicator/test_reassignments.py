"""Reassignment rules: the target replicas first, then those leaving; completion once every
target replica is in sync (a leader that leaves hands over at the next epoch), the leaving
replicas pending deletion; cancel back to the original replicas; a new target counted from
the same original replicas; Kafka's errors."""

from __future__ import annotations

from services.common.errors import ErrorCode
from services.replicator.controller.partitions import alter_isr
from services.replicator.controller.reassignments import alter, complete_all, ongoing
from services.replicator.metadata import (
    LogNode,
    MetadataImage,
    NodeId,
    PartitionRegistration,
    TopicName,
    TopicRegistration,
)

N0, N1, N2, N3 = NodeId(0), NodeId(1), NodeId(2), NodeId(3)
T = ("t", 0)


def image(p: PartitionRegistration, live: tuple[NodeId, ...] = (N0, N1, N2, N3)
          ) -> MetadataImage:
    topic = TopicRegistration(name=TopicName("t"), topic_id="id", configs={}, partitions=(p,))
    return MetadataImage(cluster_id="c", version=1, topics={topic.name: topic}, log_nodes=tuple(
        LogNode(node_id=n, address=f"h:{n}", alive=n in live) for n in (N0, N1, N2, N3)))


def part(img: MetadataImage) -> PartitionRegistration:
    return img.topics[TopicName("t")].partitions[0]


def shape(p: PartitionRegistration) -> tuple:
    return p.replicas, p.adding, p.removing, p.isr, p.leader, p.leader_epoch


def test_a_move_adds_the_targets_first_and_completes_once_they_are_in_sync():
    before = image(PartitionRegistration(partition=0, leader=N0, leader_epoch=3,
                                         replicas=(N0, N1), isr=(N0, N1)))
    started, results, removed = alter(before, {T: (N2, N3)})
    assert results == {T: (0, "")} and removed == {}
    assert shape(part(started)) == ((N2, N3, N0, N1), (N2, N3), (N0, N1), (N0, N1), N0, 3)
    assert [key for key, _ in ongoing(started, None)] == [T]
    # Not all targets in sync yet: nothing to complete.
    one, _ = alter_isr(started, {T: (N0, 3, (N0, N1, N2))})
    assert complete_all(one) == (one, [])
    both, _ = alter_isr(one, {T: (N0, 3, (N0, N1, N2, N3))})
    done, completed = complete_all(both)
    # The leader was leaving: the first target replica in sync leads at the next epoch.
    assert shape(part(done)) == ((N2, N3), (), (), (N2, N3), N2, 4)
    assert [key for key, _ in completed] == [T]
    assert done.pending_deletions == {N0: frozenset({T}), N1: frozenset({T})}
    assert ongoing(done, None) == []


def test_a_pure_removal_or_reordering_completes_at_once():
    before = image(PartitionRegistration(partition=0, leader=N1, leader_epoch=3,
                                         replicas=(N0, N1, N2), isr=(N0, N1, N2)))
    after, results, removed = alter(before, {T: (N1, N0)})
    assert results == {T: (0, "")} and removed == {N2: {T}}
    assert shape(part(after)) == ((N1, N0), (), (), (N0, N1), N1, 3)
    # The same replicas again: nothing changes.
    again, results, _ = alter(after, {T: (N1, N0)})
    assert again is after and results == {T: (0, "")}


def test_cancel_goes_back_to_the_original_replicas_and_drops_the_added_ones():
    before = image(PartitionRegistration(partition=0, leader=N0, leader_epoch=3,
                                         replicas=(N0, N1), isr=(N0, N1)))
    started, _, _ = alter(before, {T: (N1, N2)})
    joined, _ = alter_isr(started, {T: (N0, 3, (N0, N1, N2))})
    cancelled, results, removed = alter(joined, {T: None})
    assert results == {T: (0, "")} and removed == {N2: {T}}
    # As Kafka's revert: the original replicas in the order the reassignment listed them.
    assert shape(part(cancelled)) == ((N1, N0), (), (), (N0, N1), N0, 3)
    _, results, _ = alter(cancelled, {T: None})
    assert results[T][0] == ErrorCode.no_reassignment_in_progress.value


def test_a_new_target_replaces_the_ongoing_one_from_the_same_original_replicas():
    before = image(PartitionRegistration(partition=0, leader=N0, leader_epoch=3,
                                         replicas=(N0, N1), isr=(N0, N1)))
    first, _, _ = alter(before, {T: (N0, N2)})
    second, _, removed = alter(first, {T: (N0, N3)})
    assert removed == {N2: {T}}
    assert shape(part(second)) == ((N0, N3, N1), (N3,), (N1,), (N0, N1), N0, 3)


def test_a_removed_replica_added_back_is_no_longer_pending_deletion():
    before = image(PartitionRegistration(partition=0, leader=N0, leader_epoch=3,
                                         replicas=(N0, N1), isr=(N0, N1)))
    shrunk, _, _ = alter(before, {T: (N0,)})
    assert shrunk.pending_deletions == {N1: frozenset({T})}
    grown, _, _ = alter(shrunk, {T: (N0, N1)})
    assert grown.pending_deletions == {}


def test_errors_are_kafkas():
    before = image(PartitionRegistration(partition=0, leader=N0, leader_epoch=3,
                                         replicas=(N0, N1), isr=(N0, N1)))
    invalid = ErrorCode.invalid_replica_assignment.value
    for target in ((), (N1, N1), (N1, NodeId(7))):
        after, results, _ = alter(before, {T: target})
        assert after is before and results[T][0] == invalid, target
    _, results, _ = alter(before, {T: (N1, N2, N3)}, allow_rf_change=False)
    assert results[T][0] == invalid
    _, results, _ = alter(before, {("t", 5): (N1,), ("u", 0): (N1,)})
    assert {code for code, _ in results.values()} == {
        ErrorCode.unknown_topic_or_partition.value}


def test_completion_waits_for_a_live_target_replica_to_lead():
    before = image(PartitionRegistration(partition=0, leader=N0, leader_epoch=3,
                                         replicas=(N2, N0), isr=(N0, N2), adding=(N2,),
                                         removing=(N0,)), live=(N0, N1))
    assert complete_all(before) == (before, [])
