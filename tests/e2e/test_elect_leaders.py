"""ElectLeaders with a real admin client (confluent-kafka's elect_leaders) against a cluster of
three log nodes: after a failover, a preferred election gives the partition back to its first
replica; what needs no election, or names no partition, is answered as Kafka answers it."""

from __future__ import annotations

from confluent_kafka import ElectionType, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from services.local_cluster import LocalCluster

from .test_recovery import cluster, create_topic, in_sync, partition_of, wait_until

__all__ = ["cluster"]  # the module's cluster fixture

TIMEOUT = 30


def elect(cluster: LocalCluster, kind: ElectionType, partitions: list[TopicPartition] | None
          ) -> dict[tuple[str, int], int]:
    """Each partition's error code (0: elected). A new admin client each time: one that knew
    the killed node as the controller would send it there and fail locally."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    results = admin.elect_leaders(kind, partitions).result(TIMEOUT)
    return {(tp.topic, tp.partition): 0 if error is None else _code(error)
            for tp, error in results.items()}


def _code(error: object) -> int:
    # A KafkaError, or a KafkaException carrying one.
    return error.code() if isinstance(error, KafkaError) else error.args[0].code()  # type: ignore[attr-defined]


def test_a_preferred_election_gives_leadership_back_to_the_first_replica(
        cluster: LocalCluster):
    topic = "elections"
    create_topic(cluster, topic)
    wait_until(cluster, lambda: in_sync(cluster, topic), 20, "all replicas in sync")
    before = partition_of(cluster, topic)
    assert before is not None
    preferred = before.replicas[0]
    tp = TopicPartition(topic, 0)
    if before.leader != preferred:  # not expected after creation, but not this test's point
        assert elect(cluster, ElectionType.PREFERRED, [tp]) == {(topic, 0): 0}
    victim = f"log-{preferred}"
    cluster.kill(victim)
    try:
        wait_until(cluster, lambda: (p := partition_of(cluster, topic)) is not None
                   and p.leader not in (-1, preferred), 10, "a new leader")
        # The preferred replica is down: not available; the leader is live: no unclean
        # election needed.
        assert elect(cluster, ElectionType.PREFERRED, [tp]) == {
            (topic, 0): KafkaError.PREFERRED_LEADER_NOT_AVAILABLE}
        assert elect(cluster, ElectionType.UNCLEAN, [tp]) == {
            (topic, 0): KafkaError.ELECTION_NOT_NEEDED}
    finally:
        cluster.start_service(victim)
    wait_until(cluster, lambda: in_sync(cluster, topic), 30, f"{victim} back in the ISR")
    moved = partition_of(cluster, topic)
    assert moved is not None and moved.leader != preferred

    assert elect(cluster, ElectionType.PREFERRED, [tp]) == {(topic, 0): 0}
    after = partition_of(cluster, topic)
    assert after is not None
    assert (after.leader, after.leader_epoch) == (preferred, moved.leader_epoch + 1)
    assert elect(cluster, ElectionType.PREFERRED, [tp]) == {
        (topic, 0): KafkaError.ELECTION_NOT_NEEDED}
    assert elect(cluster, ElectionType.PREFERRED, [TopicPartition(topic, 7)]) == {
        (topic, 7): KafkaError.UNKNOWN_TOPIC_OR_PART}
    # Every partition: those that needed no election are not answered.
    assert (topic, 0) not in elect(cluster, ElectionType.PREFERRED, None)
