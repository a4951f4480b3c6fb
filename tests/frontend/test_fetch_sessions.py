"""Fetch sessions (KIP-227) as the frontend keeps them: what a full fetch opens, what the
handler is asked for and what the consumer is answered on an incremental one, the session
errors Kafka answers, partitions taking turns, throttled answers leaving the session as it was,
and which session gives way when the cache is full."""

from __future__ import annotations

from kbroker.kafka.v1 import kafka_pb2 as k
from services.common.errors import ErrorCode
from services.frontend.fetch_sessions import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    FetchContext,
    FetchSessions,
)

V12, V13 = 12, 13


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fetch(session_id: int, epoch: int, partitions: dict[str, list[tuple[int, int]]],
          forgotten: dict[str, list[int]] | None = None, *, ids: bool = False
          ) -> k.FetchRequest:
    """A FetchRequest of {topic: [(partition, fetch offset)]} (topics by id with ``ids``)."""
    def topic(name: str) -> dict[str, str]:
        return {"topic_id": f"id-{name}"} if ids else {"topic": name}

    return k.FetchRequest(
        session_id=session_id, session_epoch=epoch, max_wait_ms=500, min_bytes=1,
        max_bytes=1 << 20,
        topics=[k.FetchRequest.FetchTopic(**topic(name), partitions=[
            k.FetchRequest.FetchPartition(partition=p, fetch_offset=offset,
                                          partition_max_bytes=1 << 20)
            for p, offset in parts]) for name, parts in partitions.items()],
        forgotten_topics_data=[k.FetchRequest.ForgottenTopic(**topic(name), partitions=parts)
                               for name, parts in (forgotten or {}).items()])


def answer(request: k.FetchRequest, changes: dict[tuple[str, int], dict[str, object]] | None
           = None, *, ids: bool = False) -> k.FetchResponse:
    """What a handler answers ``request``: every partition, high watermark 10 and log start 0
    unless ``changes`` says otherwise for (topic, partition)."""
    response = k.FetchResponse(error_code=0, session_id=0)
    for topic in request.topics:
        name = topic.topic_id.removeprefix("id-") if ids else topic.topic
        out = response.responses.add(topic=topic.topic, topic_id=topic.topic_id)
        for p in topic.partitions:
            fields: dict[str, object] = {"high_watermark": 10, "log_start_offset": 0,
                                         "last_stable_offset": 10}
            fields.update((changes or {}).get((name, p.partition), {}))
            out.partitions.add(partition_index=p.partition, **fields)  # type: ignore[arg-type]
    return response


def asked(request: k.FetchRequest | None) -> list[tuple[str, int, int]]:
    assert request is not None
    return [(t.topic or t.topic_id, p.partition, p.fetch_offset)
            for t in request.topics for p in t.partitions]


def answered(response: k.FetchResponse) -> list[tuple[str, int]]:
    return [(t.topic or t.topic_id, p.partition_index)
            for t in response.responses for p in t.partitions]


def serve(context: FetchContext, changes: dict[tuple[str, int], dict[str, object]] | None
          = None, *, ids: bool = False) -> k.FetchResponse:
    assert context.request is not None
    response, commit = context.respond(answer(context.request, changes, ids=ids))
    commit(response)
    return response


def open_session(cache: FetchSessions, partitions: dict[str, list[tuple[int, int]]], *,
                 ids: bool = False) -> int:
    first = serve(cache.open(V13 if ids else V12, fetch(0, INITIAL_EPOCH, partitions, ids=ids)),
                  ids=ids)
    assert first.session_id > 0 and len(answered(first)) == sum(map(len, partitions.values()))
    return first.session_id


def test_a_full_fetch_opens_a_session_and_the_next_ones_say_only_what_changed() -> None:
    cache = FetchSessions(10)
    session = open_session(cache, {"a": [(0, 0), (1, 0)], "b": [(0, 5)]})
    assert cache.partitions_cached == 3

    # Nothing moved and nothing new: the handler is still asked for all three, at the
    # positions the session remembers; the consumer hears of nothing.
    context = cache.open(V12, fetch(session, 1, {}))
    assert asked(context.request) == [("a", 0, 0), ("a", 1, 0), ("b", 0, 5)]
    assert context.request.session_epoch == FINAL_EPOCH and context.request.session_id == 0
    nothing = serve(context)
    assert nothing.session_id == session and answered(nothing) == []

    # a-1 got records, b-0's high watermark moved: those two are answered.
    context = cache.open(V12, fetch(session, 2, {}))
    moved = serve(context, {("a", 1): {"records": b"batch"}, ("b", 0): {"high_watermark": 11}})
    assert answered(moved) == [("a", 1), ("b", 0)]

    # The consumer moves a-1 on and adds c-0; a-1 now comes last (it returned data).
    context = cache.open(V12, fetch(session, 3, {"a": [(1, 3)], "c": [(0, 0)]}))
    assert asked(context.request) == [("a", 0, 0), ("b", 0, 5), ("a", 1, 3), ("c", 0, 0)]
    # c-0 is new (everything about it is news); b-0 stays at 11, nothing to say.
    assert answered(serve(context, {("b", 0): {"high_watermark": 11}})) == [("c", 0)]


def test_errors_log_start_moves_and_diverging_epochs_are_always_answered() -> None:
    cache = FetchSessions(10)
    session = open_session(cache, {"a": [(0, 0), (1, 0), (2, 0)]})
    diverging = {"diverging_epoch": k.FetchResponse.EpochEndOffset(epoch=3, end_offset=7)}
    got = serve(cache.open(V12, fetch(session, 1, {})), {
        ("a", 0): {"error_code": int(ErrorCode.not_leader_or_follower)},
        ("a", 1): {"log_start_offset": 4}, ("a", 2): diverging})
    assert answered(got) == [("a", 0), ("a", 1), ("a", 2)]
    # Once the error is gone, the partition is answered again (its high watermark was
    # forgotten with the error), the others not.
    assert answered(serve(cache.open(V12, fetch(session, 2, {})), {
        ("a", 1): {"log_start_offset": 4}})) == [("a", 0)]


def test_forgotten_partitions_leave_the_session_and_the_last_one_closes_it() -> None:
    cache = FetchSessions(10)
    session = open_session(cache, {"a": [(0, 0), (1, 0)]})
    context = cache.open(V12, fetch(session, 1, {}, {"a": [0]}))
    assert asked(context.request) == [("a", 1, 0)]
    serve(context)
    last = cache.open(V12, fetch(session, 2, {}, {"a": [1]}))
    assert serve(last).session_id == 0 and len(cache) == 0


def test_session_errors_are_kafkas() -> None:
    cache = FetchSessions(10)
    unknown = cache.open(V12, fetch(12345, 1, {}))
    assert unknown.request is None and unknown.answer is not None
    assert unknown.answer.error_code == ErrorCode.fetch_session_id_not_found.value
    session = open_session(cache, {"a": [(0, 0)]})
    stale = cache.open(V12, fetch(session, 5, {}))
    assert stale.answer is not None
    assert stale.answer.error_code == ErrorCode.invalid_fetch_session_epoch.value
    switched = cache.open(V13, fetch(session, 1, {}))
    assert switched.answer is not None
    assert switched.answer.error_code == ErrorCode.fetch_session_topic_id_error.value
    # The session survived those, and the right epoch still works.
    assert serve(cache.open(V12, fetch(session, 1, {}))).session_id == session


def test_a_duplicate_of_a_request_in_flight_is_an_epoch_error_at_answer_time() -> None:
    cache = FetchSessions(10)
    session = open_session(cache, {"a": [(0, 0)]})
    first = cache.open(V12, fetch(session, 1, {}))
    second = cache.open(V12, fetch(session, 2, {}))  # the consumer went on meanwhile
    assert first.request is not None
    late, _ = first.respond(answer(first.request))
    assert late.error_code == ErrorCode.invalid_fetch_session_epoch.value
    assert serve(second).error_code == 0


def test_full_fetches_close_sessions_and_the_final_epoch_opens_none() -> None:
    cache = FetchSessions(10)
    session = open_session(cache, {"a": [(0, 0)]})
    reopened = serve(cache.open(V12, fetch(session, INITIAL_EPOCH, {"a": [(0, 3)]})))
    assert reopened.session_id not in (0, session) and len(cache) == 1
    closed = serve(cache.open(V12, fetch(reopened.session_id, FINAL_EPOCH, {"a": [(0, 3)]})))
    assert closed.session_id == 0 and len(cache) == 0
    # Before v7 there are no sessions at all.
    assert serve(cache.open(6, fetch(0, INITIAL_EPOCH, {"a": [(0, 3)]}))).session_id == 0


def test_topic_ids_key_sessions_from_v13() -> None:
    cache = FetchSessions(10)
    session = open_session(cache, {"a": [(0, 0)], "b": [(0, 0)]}, ids=True)
    context = cache.open(V13, fetch(session, 1, {"a": [(0, 4)]}, {"b": [0]}, ids=True))
    assert asked(context.request) == [("id-a", 0, 4)]
    got = serve(context, {("a", 0): {"records": b"x"}}, ids=True)
    assert answered(got) == [("id-a", 0)]


def test_a_throttled_answer_leaves_the_session_as_it_was() -> None:
    cache = FetchSessions(10)
    session = open_session(cache, {"a": [(0, 0)]})
    context = cache.open(V12, fetch(session, 1, {}))
    assert context.request is not None
    response, _commit = context.respond(answer(context.request, {("a", 0): {"high_watermark": 12}}))
    assert answered(response) == [("a", 0)]  # sent empty instead: commit is not called
    again = serve(cache.open(V12, fetch(session, 2, {})), {("a", 0): {"high_watermark": 12}})
    assert answered(again) == [("a", 0)]  # the move is still news
    # A throttled full fetch opens no session.
    full = cache.open(V12, fetch(0, INITIAL_EPOCH, {"b": [(0, 0)]}))
    assert full.request is not None
    unsent, _ = full.respond(answer(full.request))
    assert unsent.session_id == 0 and len(cache) == 1


def test_a_full_cache_gives_a_slot_to_a_larger_session_after_two_minutes_or_a_stale_one() -> None:
    clock = Clock()
    cache = FetchSessions(2, clock=clock)
    small = open_session(cache, {"a": [(0, 0)]})
    clock.now += 1
    large = open_session(cache, {"b": [(i, 0) for i in range(5)]})
    # Full, and both sessions are young: no room.
    refused = serve(cache.open(V12, fetch(0, INITIAL_EPOCH, {"c": [(i, 0) for i in range(9)]})))
    assert refused.session_id == 0 and len(cache) == 2
    # Past two minutes from their creation, and both still in use: the smallest gives way to
    # a larger session, not to a smaller one.
    clock.now += 100
    serve(cache.open(V12, fetch(small, 1, {})))
    serve(cache.open(V12, fetch(large, 1, {})))
    clock.now += 30
    tiny = serve(cache.open(V12, fetch(0, INITIAL_EPOCH, {})))
    assert tiny.session_id == 0
    bigger = serve(cache.open(V12, fetch(0, INITIAL_EPOCH, {"c": [(0, 0), (1, 0)]})))
    assert bigger.session_id > 0 and cache.get(small) is None and cache.evictions == 1
    # Unused for over two minutes: any new session takes its place.
    clock.now += 60
    serve(cache.open(V12, fetch(bigger.session_id, 1, {})))
    clock.now += 65
    newest = serve(cache.open(V12, fetch(0, INITIAL_EPOCH, {"d": [(0, 0)]})))
    assert newest.session_id > 0 and cache.get(large) is None
    assert cache.get(bigger.session_id) is not None
