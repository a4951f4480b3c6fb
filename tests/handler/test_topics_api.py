import asyncio

from kbroker.kafka.v1 import kafka_pb2 as k
from services.handler.apis.topics import (
    DEFAULT_CONFIG,
    TOPIC_CONFIG,
    CreateTopicsApi,
    DeleteTopicsApi,
)
from services.handler.collaborators import OutcomeUnknownError
from services.handler.metadata_cache import MetadataCache
from services.handler.request_context import RequestContext

from .fakes import FakeController, cluster, topic

TOPIC_ID = "5f7c0e53-7bd1-4d52-9b67-1b2a1c3e4f50"
CONTEXT = RequestContext(advertised_host="localhost", advertised_port=9092)


def CreatableTopic(name, num_partitions=None, replication_factor=None, assignments=(),
                   configs=()):
    """A CreateTopics topic; counts left out are unset, as a hand-made request leaves them."""
    return k.CreateTopicsRequest.CreatableTopic(
        name=name, num_partitions=num_partitions, replication_factor=replication_factor,
        assignments=[{"partition_index": i, "broker_ids": b} for i, b in assignments],
        configs=[{"name": n, "value": v} for n, v in configs])


CreateTopicsRequest = k.CreateTopicsRequest
DeleteTopicsRequest = k.DeleteTopicsRequest
TopicToDelete = k.DeleteTopicsRequest.DeleteTopicState


def nullable(message, field):
    return getattr(message, field) if message.HasField(field) else None


def setup(snapshot, **options):
    controller = FakeController(snapshot, **options)
    cache = MetadataCache(controller.load_metadata)
    cache.install(snapshot)
    return cache, controller


def create(request, snapshot, **options):
    cache, controller = setup(snapshot, **options)
    response = asyncio.run(CreateTopicsApi(cache, controller).handle(request, CONTEXT))
    return response, controller, cache


def codes(response):
    return [(t.name, t.error_code) for t in response.topics]


def test_created_topics_come_back_with_counts_configs_and_ids():
    request = CreateTopicsRequest(topics=[
        CreatableTopic(name="a", num_partitions=3, replication_factor=1,
                       configs=[("retention.ms", "1000")]),
        CreatableTopic(name="old"),
    ])
    response, controller, cache = create(request, cluster(topic("old")))
    assert codes(response) == [("a", 0), ("old", 36)]
    a, old = response.topics
    assert (a.num_partitions, a.replication_factor) == (3, 1)
    assert a.HasField("topic_id") and len(a.topic_id) == 36
    assert {c.name: (c.value, c.config_source) for c in a.configs} == {
        "cleanup.policy": ("delete", DEFAULT_CONFIG),
        "retention.ms": ("1000", TOPIC_CONFIG),
    }
    assert not any(c.read_only or c.is_sensitive for c in a.configs)
    assert (old.error_message, old.num_partitions, list(old.configs)) == (
        "Topic 'old' already exists.", -1, [])
    # The cache was reloaded, so this handler's next answer shows the topic.
    assert cache.snapshot.topic("a") is not None
    assert controller.loads == 1


def test_validate_only_creates_nothing_and_keeps_the_cache():
    request = CreateTopicsRequest(topics=[CreatableTopic(name="a")], validate_only=True)
    response, controller, _cache = create(request, cluster())
    assert codes(response) == [("a", 0)]
    assert controller.created[0][1] is True
    assert controller.loads == 0


def test_request_level_checks():
    request = CreateTopicsRequest(topics=[
        CreatableTopic(name="dup"), CreatableTopic(name="dup"),
        CreatableTopic(name="bad/name"),
        CreatableTopic(name="m1", num_partitions=1, assignments=[(0, (0,))]),
        CreatableTopic(name="m2", replication_factor=1, assignments=[(0, (0,))]),
        CreatableTopic(name="m3", assignments=[(0, (0,)), (0, (1,))]),
        CreatableTopic(name="c", configs=[("retention.ms", None)]),
        CreatableTopic(name="ok", assignments=[(0, (0,)), (1, (0,))]),
    ])
    response, controller, _ = create(request, cluster())
    assert codes(response) == [("dup", 42), ("bad/name", 17), ("m1", 42), ("m2", 42),
                               ("m3", 39), ("c", 40), ("ok", 0)]
    assert response.topics[0].error_message == "Duplicate topic name."
    ((sent, _),) = controller.created
    assert [(t.name, {i: tuple(r.node_ids) for i, r in t.assignments.items()}) for t in sent
            ] == [("ok", {0: (0,), 1: (0,)})]


def test_controller_trouble_times_the_topics_out():
    request = CreateTopicsRequest(topics=[CreatableTopic(name="a")])
    response, _, _ = create(request, cluster(), failure=OutcomeUnknownError("deadline"))
    assert codes(response) == [("a", 7)]


def test_delete_by_name_and_by_id():
    snapshot = cluster(topic("a"), topic("b", topic_id=TOPIC_ID))
    cache, controller = setup(snapshot)
    other = "11111111-2222-3333-4444-555555555555"
    request = DeleteTopicsRequest(topics=[
        TopicToDelete(name="a"), TopicToDelete(topic_id=TOPIC_ID.upper()),
        TopicToDelete(name="nope"), TopicToDelete(topic_id=other),
        TopicToDelete(name="x", topic_id=other), TopicToDelete(),
        TopicToDelete(name="d"), TopicToDelete(name="d"),
    ])
    response = asyncio.run(DeleteTopicsApi(cache, controller).handle(request, CONTEXT))
    assert [(nullable(t, "name"), nullable(t, "topic_id"), t.error_code)
            for t in response.responses] == [
        ("a", None, 0), ("b", TOPIC_ID, 0), ("nope", None, 3), (None, other, 100),
        ("x", other, 42), (None, None, 42), ("d", None, 42), ("d", None, 42)]
    assert controller.deleted == [(["a", "nope"], [TOPIC_ID, other])]
    assert cache.snapshot.topic("a") is None and cache.snapshot.topic("b") is None
