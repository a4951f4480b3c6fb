"""Fencing log nodes: new leaders from the ISR at the next epoch, fenced followers out of the
ISR, offline partitions when no in-sync replica is left, unclean elections only when allowed.
Controlled shutdown: the stopping node out of every ISR, its leaderships moved the same way,
and no election or ISR expansion picking it meanwhile. ISR changes leaders ask for, applied
only to the ISR they were computed from."""

from __future__ import annotations

from services.replicator.controller.cluster import with_controlled_shutdown, with_liveness
from services.replicator.controller.partitions import (
    PREFERRED_ELECTION,
    UNCLEAN_ELECTION,
    alter_isr,
    controlled_shutdown,
    fence,
    preferred,
    requested,
)
from services.replicator.metadata import (
    LogNode,
    MetadataImage,
    NodeId,
    PartitionRegistration,
    TopicName,
    TopicRegistration,
)

N0, N1, N2 = NodeId(0), NodeId(1), NodeId(2)


def image(*partitions: PartitionRegistration, configs: dict[str, str] | None = None,
          live: tuple[NodeId, ...] = (N1, N2)) -> MetadataImage:
    topic = TopicRegistration(name=TopicName("t"), topic_id="id", configs=configs or {},
                              partitions=partitions)
    return MetadataImage(cluster_id="c", version=1, topics={topic.name: topic}, log_nodes=tuple(
        LogNode(node_id=n, address=f"h:{n}", alive=n in live) for n in (N0, N1, N2)))


def partition(index: int, leader: NodeId, isr: tuple[NodeId, ...], epoch: int = 4,
              replicas: tuple[NodeId, ...] = (N0, N1, N2)) -> PartitionRegistration:
    return PartitionRegistration(partition=index, leader=leader, leader_epoch=epoch,
                                 replicas=replicas, isr=isr)


def test_a_fenced_leader_is_replaced_by_the_first_live_isr_replica():
    before = image(partition(0, N0, (N0, N2, N1), replicas=(N0, N2, N1)))
    [topic], [election] = fence(before, {N0}, {N1, N2})
    p = topic.partitions[0]
    assert (p.leader, p.leader_epoch, p.isr) == (N2, 5, (N2, N1))
    assert (election.old_leader, election.new_leader, election.leader_epoch, election.clean) == (
        N0, N2, 5, True)


def test_a_fenced_follower_only_leaves_the_isr():
    before = image(partition(0, N1, (N0, N1, N2)), partition(1, N2, (N2,)))
    [topic], elections = fence(before, {N0}, {N1, N2})
    assert elections == []
    assert [(p.leader, p.leader_epoch, p.isr) for p in topic.partitions] == [
        (N1, 4, (N1, N2)), (N2, 4, (N2,))]


def test_without_an_in_sync_replica_the_partition_stays_offline():
    before = image(partition(0, N0, (N0,)))
    assert fence(before, {N0}, {N1, N2}) == ([], [])
    # A replica of the ISR that is itself down cannot lead either.
    before = image(partition(0, N0, (N0, N1)), live=(N2,))
    assert fence(before, {N0}, {N2}) == ([], [])


def test_unclean_elections_take_a_live_replica_outside_the_isr_when_allowed():
    before = image(partition(0, N0, (N0,)), configs={"unclean.leader.election.enable": "true"})
    [topic], [election] = fence(before, {N0}, {N1, N2})
    assert (topic.partitions[0].leader, topic.partitions[0].isr) == (N1, (N1,))
    assert not election.clean
    # The broker default applies to topics without the config; the topic's wins.
    assert fence(image(partition(0, N0, (N0,))), {N0}, {N1, N2},
                 unclean_default=True)[1][0].new_leader == N1
    denied = image(partition(0, N0, (N0,)), configs={"unclean.leader.election.enable": "false"})
    assert fence(denied, {N0}, {N1, N2}, unclean_default=True) == ([], [])


def test_a_returning_isr_replica_ends_an_offline_partition():
    # Both ISR members were down; node 1 is back, node 0 (the leader) is not.
    before = image(partition(0, N0, (N0, N1)), live=(N1, N2))
    [topic], [election] = fence(before, {N0}, {N1, N2})
    assert (topic.partitions[0].leader, topic.partitions[0].isr, election.clean) == (
        N1, (N1,), True)


def test_partitions_without_fenced_nodes_are_untouched():
    assert fence(image(partition(0, N1, (N1, N2))), {N0}, {N1, N2}) == ([], [])


def test_partitions_go_back_to_a_live_in_sync_preferred_replica():
    before = image(partition(0, N1, (N1, N0)), partition(1, N1, (N1, N2)),
                   partition(2, N2, (N2, N1), replicas=(N2, N1, N0)), live=(N0, N1, N2))
    [topic], [election] = preferred(before, {N0, N1, N2})
    # Partition 1's preferred replica (0) is not in sync; partition 2 is led by its own.
    assert [(p.leader, p.leader_epoch) for p in topic.partitions] == [(N0, 5), (N1, 4), (N2, 4)]
    assert (election.old_leader, election.new_leader, election.clean) == (N1, N0, True)
    assert preferred(before, {N1, N2}) == ([], [])  # not while it is down


def test_requested_preferred_elections_answer_each_partition_as_kafka_does():
    before = image(
        partition(0, N1, (N0, N1, N2)),             # preferred N0 live and in sync: elected
        partition(1, N0, (N0, N1)),                 # already led by its preferred replica
        partition(2, N1, (N1, N2)),                 # preferred N0 out of the ISR
        live=(N0, N1, N2))
    wanted = [("t", 0), ("t", 1), ("t", 2), ("t", 9), ("gone", 0)]
    ([topic], [election]), results = requested(before, PREFERRED_ELECTION, wanted,
                                               {N0, N1, N2})
    assert (election.partition, election.new_leader, election.leader_epoch) == (0, N0, 5)
    assert topic.partitions[0].isr == (N0, N1, N2)
    assert {key: code for key, (code, _) in results.items()} == {
        ("t", 0): 0, ("t", 1): 84, ("t", 2): 80, ("t", 9): 3, ("gone", 0): 3}
    # Every partition: those that needed nothing are left out.
    _, every = requested(before, PREFERRED_ELECTION, None, {N0, N1, N2})
    assert {key: code for key, (code, _) in every.items()} == {("t", 0): 0, ("t", 2): 80}


def test_requested_unclean_elections_only_replace_a_dead_leader():
    before = image(
        partition(0, N0, (N0, N2)),   # dead leader, an in-sync replica is live: clean pick
        partition(1, N0, (N0,)),      # dead leader alone in its ISR: a live replica outside
        partition(2, N1, (N1,)),      # live leader
        partition(3, N0, (N0,), replicas=(N0,)),  # no live replica at all
        live=(N1, N2))
    wanted = [("t", i) for i in range(4)]
    (_, elections), results = requested(before, UNCLEAN_ELECTION, wanted, {N1, N2})
    assert [(e.partition, e.new_leader, e.clean) for e in elections] == [
        (0, N2, True), (1, N1, False)]
    assert {key: code for key, (code, _) in results.items()} == {
        ("t", 0): 0, ("t", 1): 0, ("t", 2): 84, ("t", 3): 83}


def test_an_isr_change_applies_only_to_the_isr_and_epoch_it_was_computed_from():
    key = ("t", 0)
    before = image(partition(0, N1, (N1,)), live=(N0, N1, N2))
    grown, applied = alter_isr(before, {key: (N1, 4, (N1, N2))}, {key: (N1,)})
    assert applied == {key: (N1, N2)}
    assert grown.topics[TopicName("t")].partitions[0].isr == (N1, N2)
    # Asked again (say its answer was lost): computed from an ISR that is gone, refused.
    assert alter_isr(grown, {key: (N1, 4, (N1, N2))}, {key: (N1,)})[1] == {}
    # Another leader epoch, or a leader the partition no longer has.
    assert alter_isr(grown, {key: (N1, 3, (N1,))}, {key: (N1, N2)})[1] == {}
    assert alter_isr(grown, {key: (N2, 4, (N2,))}, {key: (N1, N2)})[1] == {}
    assert alter_isr(grown, {key: (N1, 4, (N1,))}, {key: (N1, N2)})[1] == {key: (N1,)}


def test_a_node_that_is_not_live_never_joins_an_isr():
    key = ("t", 0)
    before = image(partition(0, N1, (N1,)), live=(N1, N2))
    assert alter_isr(before, {key: (N1, 4, (N0, N1))}, {key: (N1,)})[1] == {}
    # Leaving it is always allowed.
    fenced = image(partition(0, N1, (N0, N1)), live=(N1, N2))
    assert alter_isr(fenced, {key: (N1, 4, (N1,))}, {key: (N0, N1)})[1] == {key: (N1,)}


def test_a_node_in_controlled_shutdown_leaves_every_isr_and_hands_its_leaderships_over():
    before = with_controlled_shutdown(image(
        partition(0, N0, (N0, N2, N1), replicas=(N0, N2, N1)),  # led: to the first in sync
        partition(1, N1, (N1, N0, N2)),                          # followed: out of the ISR
        partition(2, N1, (N1, N2)),                              # not a member: untouched
        partition(3, N0, (N0,)),                                 # alone in sync: kept
        live=(N0, N1, N2)), N0)
    assert before.active_node_ids == (N1, N2)
    [topic], [election] = controlled_shutdown(before, N0, before.active_node_ids)
    assert [(p.leader, p.leader_epoch, p.isr) for p in topic.partitions] == [
        (N2, 5, (N2, N1)), (N1, 4, (N1, N2)), (N1, 4, (N1, N2)), (N0, 4, (N0,))]
    assert (election.partition, election.old_leader, election.new_leader, election.clean) == (
        0, N0, N2, True)


def test_a_controlled_shutdown_hands_over_only_to_active_nodes():
    # Node 2 is in controlled shutdown too: node 0's partition goes to node 1, or stays.
    both = with_controlled_shutdown(with_controlled_shutdown(image(
        partition(0, N0, (N0, N2, N1), replicas=(N0, N2, N1)),
        partition(1, N0, (N0, N2)), live=(N0, N1, N2)), N2), N0)
    [topic], [election] = controlled_shutdown(both, N0, both.active_node_ids)
    assert [(p.leader, p.isr) for p in topic.partitions] == [(N1, (N2, N1)), (N0, (N0, N2))]
    assert election.new_leader == N1
    # With unclean elections the one that cannot move goes outside its ISR, as Kafka does.
    [topic], elections = controlled_shutdown(both, N0, both.active_node_ids,
                                             unclean_default=True)
    assert [(p.leader, p.isr) for p in topic.partitions] == [(N1, (N2, N1)), (N1, (N1,))]
    assert [e.clean for e in elections] == [True, False]


def test_no_election_or_isr_expansion_picks_a_node_in_controlled_shutdown():
    stopping = with_controlled_shutdown(image(
        partition(0, N1, (N1, N2)), partition(1, N2, (N2, N0)), live=(N0, N1, N2)), N0)
    active = stopping.active_node_ids
    assert preferred(stopping, active) == ([], [])
    (_, elections), results = requested(stopping, PREFERRED_ELECTION, [("t", 0)], active)
    assert elections == [] and results[("t", 0)][0] == 80  # PREFERRED_LEADER_NOT_AVAILABLE
    # Node 2 is fenced: partition 1 cannot go to node 0, whatever its ISR says.
    [topic], elections = fence(stopping, {N2}, active)
    assert elections == [] and topic.partitions[1].leader == N2
    unchanged, applied = alter_isr(stopping, {("t", 0): (N1, 4, (N0, N1, N2))})
    assert unchanged is stopping and applied == {}
    joined, applied = alter_isr(stopping, {("t", 1): (N2, 4, (N2,))})
    assert applied == {("t", 1): (N2,)}


def test_a_controlled_shutdown_ends_when_the_node_is_not_alive_or_is_released():
    stopping = with_controlled_shutdown(image(partition(0, N1, (N1,)), live=(N0, N1, N2)), N0)
    assert with_controlled_shutdown(stopping, N0) is stopping
    down, changed = with_liveness(stopping, {N0: False})
    assert [(n.node_id, n.alive, n.in_controlled_shutdown) for n in changed] == [
        (N0, False, False)]
    released, changed = with_liveness(stopping, {N0: True}, ended={N0})
    assert [(n.node_id, n.alive, n.in_controlled_shutdown) for n in changed] == [
        (N0, True, False)]
    assert released.active_node_ids == (N0, N1, N2)
