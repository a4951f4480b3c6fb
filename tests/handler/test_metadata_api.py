import asyncio

from kbroker.kafka.v1 import kafka_pb2 as k
from services.handler.apis.cluster import (
    AUTHORIZED_OPERATIONS_OMITTED,
    CLUSTER_OPERATIONS,
    TOPIC_OPERATIONS,
)
from services.handler.apis.metadata import MetadataApi
from services.handler.collaborators import UnreachableError
from services.handler.metadata_cache import MetadataCache

from .fakes import CONTEXT, FakeController, cluster, topic

TOPIC_ID = "5f7c0e53-7bd1-4d52-9b67-1b2a1c3e4f50"
EVERY_TOPIC = k.MetadataRequest(topics_is_null=True)


def named(*names, **fields):
    return k.MetadataRequest(topics=[{"name": n} for n in names], **fields)


def optional(message, name):
    """A field's value, None when unset (null for the frontend)."""
    return getattr(message, name) if message.HasField(name) else None


def serve(request, snapshot, *, auto_create=True, controller=None):
    controller = controller or FakeController(snapshot)
    cache = MetadataCache(controller.load_metadata)
    cache.install(snapshot)
    api = MetadataApi(cache, controller, auto_create)
    return asyncio.run(api.handle(request, CONTEXT)), controller


def names(response):
    return [(t.name, t.error_code) for t in response.topics]


def test_null_topics_lists_every_topic_and_empty_lists_none():
    snapshot = cluster(topic("b"), topic("a", 2), nodes=(0, 1))
    response, _ = serve(EVERY_TOPIC, snapshot)
    assert names(response) == [("a", 0), ("b", 0)]
    assert [(b.node_id, b.host, b.port) for b in response.brokers] == [
        (0, "kafka.example", 9092), (1, "kafka.example", 9092)]
    assert response.cluster_id == "test-cluster"
    assert response.controller_id == 0
    assert response.cluster_authorized_operations == AUTHORIZED_OPERATIONS_OMITTED
    assert response.topics[0].topic_authorized_operations == AUTHORIZED_OPERATIONS_OMITTED
    response, _ = serve(k.MetadataRequest(topics_is_null=False), snapshot)
    assert list(response.topics) == []
    assert len(response.brokers) == 2
    # Neither topics nor their null flag (a hand-made request): every topic.
    response, _ = serve(k.MetadataRequest(), snapshot)
    assert names(response) == [("a", 0), ("b", 0)]


def test_partitions_describe_leaders_replicas_and_dead_leaders():
    snapshot = cluster(topic("t", 3, leaders=[0, 1, 2], epoch=3), nodes=(0,), dead=(1,),
                       fenced=(2,))
    response, _ = serve(named("t"), snapshot)
    (t,) = response.topics
    live, silent, fenced = t.partitions
    assert (live.partition_index, live.error_code, live.leader_id, live.leader_epoch) == (
        0, 0, 0, 3)
    assert (live.replica_nodes, live.isr_nodes, live.offline_replicas) == ([0], [0], [])
    # A leader that stopped answering: no leader for clients, though still a broker.
    assert (silent.error_code, silent.leader_id, silent.leader_epoch) == (5, -1, 3)
    assert silent.offline_replicas == [1]
    assert (fenced.error_code, fenced.leader_id, fenced.leader_epoch) == (5, -1, 3)
    assert fenced.offline_replicas == [2]
    # Fenced log nodes lead nothing but stay brokers: a client that forgot one while its
    # coordinator cache names it would wait for it forever (librdkafka).
    assert [b.node_id for b in response.brokers] == [0, 1, 2]


def test_topics_are_built_once_per_snapshot_and_answered_alike(monkeypatch):
    """A snapshot's topics are described once and copied into later answers, whichever way
    they are asked for; a new snapshot is described anew, and authorized operations (the
    principal's) are never copied."""
    from services.handler.apis import metadata as metadata_api

    built = []
    describe = metadata_api.describe_topic

    def counting(topics, metadata, info, include_ops, access):
        built.append(info.name)
        describe(topics, metadata, info, include_ops, access)

    monkeypatch.setattr(metadata_api, "describe_topic", counting)
    first = cluster(topic("a", 2, leaders=[0, 1]), topic("b"), nodes=(0, 1), version=1)
    controller = FakeController(first)
    cache = MetadataCache(controller.load_metadata)
    cache.install(first)
    api = MetadataApi(cache, controller, True)

    def answer(request):
        return asyncio.run(api.handle(request, CONTEXT))

    once = answer(EVERY_TOPIC)
    assert sorted(built) == ["a", "b"]
    assert answer(EVERY_TOPIC) == once
    assert answer(named("b", "a")).topics[1] == once.topics[0]
    assert sorted(built) == ["a", "b"]
    with_ops = answer(named("a", include_topic_authorized_operations=True))
    assert with_ops.topics[0].topic_authorized_operations == TOPIC_OPERATIONS
    assert sorted(built) == ["a", "a", "b"]
    # The leader of a-1 moved: the next snapshot says so.
    cache.install(cluster(topic("a", 2, leaders=[0, 0], epoch=1), topic("b"), nodes=(0, 1),
                          version=2))
    moved = answer(EVERY_TOPIC)
    assert [(p.leader_id, p.leader_epoch) for p in moved.topics[0].partitions] == [(0, 1),
                                                                                    (0, 1)]
    assert [(p.leader_id, p.leader_epoch) for p in once.topics[0].partitions] == [(0, 0),
                                                                                   (1, 0)]


def test_missing_topics_are_auto_created_and_answered_in_full():
    snapshot = cluster(topic("old"))
    # allow_auto_topic_creation unset: true.
    response, controller = serve(named("old", "new", "bad name"), snapshot)
    assert names(response) == [("old", 0), ("new", 0), ("bad name", 17)]
    assert response.topics[1].partitions[0].leader_id == 0
    assert response.topics[1].HasField("topic_id")
    # The cluster as it is after the creation.
    assert (response.cluster_id, response.controller_id) == ("test-cluster", 0)
    ((created, validate_only),) = controller.created
    assert [(t.name, t.num_partitions, t.replication_factor) for t in created] == [
        ("new", -1, -1)]
    assert not validate_only


def test_no_auto_creation_when_the_request_or_the_config_forbids_it():
    snapshot = cluster()
    response, controller = serve(named("new", "", allow_auto_topic_creation=False), snapshot)
    assert names(response) == [("new", 3), ("", 17)]
    # An unknown topic named by name: no topic id (null), authorized operations omitted.
    assert not response.topics[0].HasField("topic_id")
    assert response.topics[0].topic_authorized_operations == AUTHORIZED_OPERATIONS_OMITTED
    assert controller.created == []
    response, controller = serve(named("new"), snapshot, auto_create=False)
    assert names(response) == [("new", 3)]
    assert controller.created == []


def test_creation_failures_are_retriable_leader_not_available():
    snapshot = cluster()
    response, _ = serve(named("new"), snapshot,
                        controller=FakeController(snapshot, failure=UnreachableError("down")))
    assert names(response) == [("new", 5)]


def test_by_topic_id_never_creates():
    snapshot = cluster(topic("a", topic_id=TOPIC_ID))
    other = "11111111-2222-3333-4444-555555555555"
    request = k.MetadataRequest(topics=[{"topic_id": TOPIC_ID.upper()}, {"topic_id": other},
                                        {"topic_id": TOPIC_ID}])
    response, controller = serve(request, snapshot)
    assert [(optional(t, "name"), t.topic_id, t.error_code) for t in response.topics] == [
        ("a", TOPIC_ID, 0), (None, other, 100)]
    assert controller.created == []


def test_authorized_operations_when_asked():
    snapshot = cluster(topic("a"))
    response, _ = serve(k.MetadataRequest(topics_is_null=True,
                                          include_cluster_authorized_operations=True,
                                          include_topic_authorized_operations=True), snapshot)
    assert response.cluster_authorized_operations == CLUSTER_OPERATIONS
    assert response.topics[0].topic_authorized_operations == TOPIC_OPERATIONS
    # READ (3), WRITE (4) and DESCRIBE (8) among them.
    assert TOPIC_OPERATIONS & (1 << 3) and TOPIC_OPERATIONS & (1 << 4)
    assert TOPIC_OPERATIONS & (1 << 8)


def test_without_any_metadata_topics_are_leader_not_available():
    async def main():
        async def down():
            raise ConnectionError("no replicator")

        api = MetadataApi(MetadataCache(down), FakeController(cluster()), True)
        return (await api.handle(named("x"), CONTEXT),
                await api.handle(EVERY_TOPIC, CONTEXT))

    response, every = asyncio.run(main())
    assert list(every.topics) == []
    assert names(response) == [("x", 5)]
    assert list(response.brokers) == []
    # Nulls stay null: no cluster id, and no topic id for a topic named by name.
    assert not response.HasField("cluster_id")
    assert not response.topics[0].HasField("topic_id")
    assert response.topics[0].topic_authorized_operations == AUTHORIZED_OPERATIONS_OMITTED
    assert response.controller_id == -1

