"""Incremental fetch sessions (KIP-227; Kafka's ``FetchManager`` and ``FetchSessionCache``),
kept by the frontend so that handlers stay stateless: any handler serves any fetch.

A consumer fetching many partitions sends them all once (a full fetch, session epoch 0); the
frontend opens a session and answers with its id. From then on the consumer sends only what
changed (partitions added or whose fetch position moved, partitions to forget) with the next
epoch, and the frontend:

- checks the session and epoch (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH,
  FETCH_SESSION_TOPIC_ID_ERROR when the request's version switches between topic names and
  topic ids);
- hands the handler a full, sessionless fetch of every partition in the session, in session
  order (a partition that returned data moves to the end, so that with ``max_bytes`` the
  partitions take turns);
- answers only the partitions the consumer needs to hear about: new records, a high watermark
  or log start offset that moved, an error, a diverging epoch, a preferred read replica.

A full fetch naming a session closes it; with epoch -1 (final) no new session is opened.

The cache holds ``max.incremental.fetch.session.cache.slots`` sessions. When it is full, a new
session takes the place of one unused for two minutes, else of the smallest session older than
two minutes if the new one is larger; otherwise the consumer gets session id 0 and keeps
sending full fetches. A throttled fetch changes nothing in the session (the consumer did not
get the answer). Sessions live in one frontend process: a consumer that reconnects to another
frontend gets FETCH_SESSION_ID_NOT_FOUND once and starts a new session, as after a Kafka broker
evicted it. Not thread-safe (one event loop).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable

from kbroker.kafka.v1 import kafka_pb2 as k
from services.common.errors import ErrorCode

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
# First version that names topics by id; a session keeps to one side of it.
TOPIC_ID_VERSION = 13
# max.incremental.fetch.session.cache.slots
DEFAULT_FETCH_SESSION_SLOTS = 1000
# How long a session must go unused, or have existed, before another may take its slot.
EVICTION_MS = 120_000

# A partition in a session: (topic id, partition) from v13, else (topic name, partition).
PartitionKey = tuple[str, int]


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch`` (Kafka's FetchMetadata.nextEpoch)."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == 2**31 - 1 else epoch + 1


@dataclasses.dataclass
class CachedPartition:
    """What a session remembers of one partition: the consumer's last fetch parameters, and
    what it was last told (high watermark, log start offset)."""

    topic: str
    topic_id: str
    fetch: k.FetchRequest.FetchPartition
    high_watermark: int = -1
    log_start_offset: int = -1

    def must_respond(self, data: k.FetchResponse.PartitionData) -> bool:
        """Whether the consumer needs to hear about ``data`` (Kafka's
        maybeUpdateResponseData)."""
        return bool(data.records) or data.error_code != 0 \
            or data.high_watermark != self.high_watermark \
            or data.log_start_offset != self.log_start_offset \
            or data.preferred_read_replica >= 0 \
            or (data.HasField("diverging_epoch") and data.diverging_epoch.epoch >= 0)

    def remember(self, data: k.FetchResponse.PartitionData) -> None:
        # After an error the high watermark is forgotten, so the partition is sent again once
        # the error is gone.
        self.high_watermark = -1 if data.error_code else data.high_watermark
        self.log_start_offset = data.log_start_offset


@dataclasses.dataclass
class FetchSession:
    id: int
    uses_topic_ids: bool
    created: float
    last_used: float
    epoch: int
    # In fetch order (dicts keep insertion order; a partition is moved by re-inserting it).
    partitions: dict[PartitionKey, CachedPartition]


def _key(uses_topic_ids: bool, topic: str, topic_id: str, partition: int) -> PartitionKey:
    return (topic_id, partition) if uses_topic_ids else (topic, partition)


def _response_key(uses_topic_ids: bool, topic: k.FetchResponse.FetchableTopicResponse,
                  partition: k.FetchResponse.PartitionData) -> PartitionKey:
    return _key(uses_topic_ids, topic.topic, topic.topic_id, partition.partition_index)


class FetchContext:
    """One fetch request in the light of the session cache: the request to send the handler
    (``request``, None when the answer is already known: ``answer``) and, once the handler
    answered, :meth:`respond` gives the answer for the consumer and what committing it to the
    session does."""

    request: k.FetchRequest | None
    answer: k.FetchResponse | None = None
    # Whether :meth:`respond` answers with the handler's response itself (changing only its
    # fields outside the records), so its record batches may travel beside it.
    keeps_answer: bool = True

    def respond(self, response: k.FetchResponse
                ) -> tuple[k.FetchResponse, Callable[[k.FetchResponse], None]]:
        """(the answer for the consumer, ``commit``): call ``commit(answer)`` once the answer
        is certain to go out as is (not throttled); it updates the session and sets the
        answer's session id."""
        raise NotImplementedError


def _no_commit(response: k.FetchResponse) -> None:
    pass


class _SessionError(FetchContext):
    keeps_answer = False

    def __init__(self, code: ErrorCode, session_id: int = INVALID_SESSION_ID) -> None:
        self.request = None
        self.answer = k.FetchResponse(error_code=int(code), session_id=session_id)

    def respond(self, response: k.FetchResponse
                ) -> tuple[k.FetchResponse, Callable[[k.FetchResponse], None]]:
        assert self.answer is not None
        return self.answer, _no_commit


class _Sessionless(FetchContext):
    def __init__(self, request: k.FetchRequest) -> None:
        self.request = request

    def respond(self, response: k.FetchResponse
                ) -> tuple[k.FetchResponse, Callable[[k.FetchResponse], None]]:
        response.session_id = INVALID_SESSION_ID
        return response, _no_commit


class _Full(FetchContext):
    """A full fetch that opens a session once its answer goes out (if the cache has room)."""

    def __init__(self, cache: FetchSessions, request: k.FetchRequest,
                 uses_topic_ids: bool) -> None:
        self.request = request
        self._cache = cache
        self._uses_topic_ids = uses_topic_ids

    def respond(self, response: k.FetchResponse
                ) -> tuple[k.FetchResponse, Callable[[k.FetchResponse], None]]:
        response.session_id = INVALID_SESSION_ID

        def commit(answer: k.FetchResponse) -> None:
            answer.session_id = self._cache.create(self._partitions(answer),
                                                   self._uses_topic_ids)

        return response, commit

    def _partitions(self, response: k.FetchResponse) -> dict[PartitionKey, CachedPartition]:
        uses_ids = self._uses_topic_ids
        assert self.request is not None
        partitions: dict[PartitionKey, CachedPartition] = {}
        for topic in self.request.topics:
            for fetch in topic.partitions:
                key = _key(uses_ids, topic.topic, topic.topic_id, fetch.partition)
                partitions[key] = CachedPartition(topic.topic, topic.topic_id, fetch)
        for topic in response.responses:
            for data in topic.partitions:
                cached = partitions.get(_response_key(uses_ids, topic, data))
                if cached is not None:
                    cached.remember(data)
        return partitions


class _Incremental(FetchContext):
    keeps_answer = False  # answers with the partitions that have news, records included

    def __init__(self, cache: FetchSessions, session: FetchSession,
                 request: k.FetchRequest) -> None:
        self._cache = cache
        self._session = session
        self._expected_epoch = session.epoch
        self.request = self._full_request(request)

    def _full_request(self, request: k.FetchRequest) -> k.FetchRequest:
        """``request`` with every partition of the session, in session order."""
        full = k.FetchRequest()
        full.CopyFrom(request)
        full.ClearField("topics")
        full.ClearField("forgotten_topics_data")
        full.session_id, full.session_epoch = INVALID_SESSION_ID, FINAL_EPOCH
        topic: k.FetchRequest.FetchTopic | None = None
        for (name_or_id, _), cached in self._session.partitions.items():
            if topic is None or (topic.topic_id if self._session.uses_topic_ids
                                 else topic.topic) != name_or_id:
                topic = full.topics.add(topic=cached.topic, topic_id=cached.topic_id)
            topic.partitions.append(cached.fetch)
        return full

    def respond(self, response: k.FetchResponse
                ) -> tuple[k.FetchResponse, Callable[[k.FetchResponse], None]]:
        session = self._session
        if session.epoch != self._expected_epoch or self._cache.get(session.id) is not session:
            # Another request of the same session came in meanwhile (a duplicate).
            return k.FetchResponse(error_code=int(ErrorCode.invalid_fetch_session_epoch),
                                   session_id=session.id), _no_commit
        answer = k.FetchResponse()
        answer.CopyFrom(response)
        answer.ClearField("responses")
        answer.session_id = session.id
        uses_ids = session.uses_topic_ids
        for topic in response.responses:
            kept = [data for data in topic.partitions
                    if (cached := session.partitions.get(_response_key(uses_ids, topic, data)))
                    is None or cached.must_respond(data)]
            if kept:
                answer.responses.add(topic=topic.topic, topic_id=topic.topic_id,
                                     partitions=kept)

        def commit(sent: k.FetchResponse) -> None:
            if session.epoch != self._expected_epoch:
                return
            for topic in sent.responses:
                for data in topic.partitions:
                    key = _response_key(uses_ids, topic, data)
                    cached = session.partitions.get(key)
                    if cached is None:
                        continue
                    cached.remember(data)
                    if data.records:  # to the back of the line
                        del session.partitions[key]
                        session.partitions[key] = cached

        return answer, commit


class FetchSessions:
    """The frontend's fetch session cache."""

    def __init__(self, slots: int, eviction_ms: int = EVICTION_MS,
                 clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        self.slots = slots
        self._eviction_s = eviction_ms / 1000
        self._clock = clock
        self._rng = rng or random.Random()
        self._sessions: dict[int, FetchSession] = {}
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def partitions_cached(self) -> int:
        return sum(len(s.partitions) for s in self._sessions.values())

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def open(self, version: int, request: k.FetchRequest) -> FetchContext:
        """The context of ``request`` (a FetchRequest of ``version``): the session it opens,
        uses or closes, or its error."""
        session_id, epoch = request.session_id, request.session_epoch
        uses_ids = version >= TOPIC_ID_VERSION
        if version < 7:  # no sessions before v7: every fetch is full and sessionless
            return _Sessionless(request)
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != INVALID_SESSION_ID:
                self._sessions.pop(session_id, None)
            if epoch == FINAL_EPOCH or self.slots <= 0:
                return _Sessionless(request)
            return _Full(self, request, uses_ids)
        session = self._sessions.get(session_id)
        if session is None:
            return _SessionError(ErrorCode.fetch_session_id_not_found)
        if session.epoch != epoch:
            return _SessionError(ErrorCode.invalid_fetch_session_epoch)
        if session.uses_topic_ids != uses_ids:
            return _SessionError(ErrorCode.fetch_session_topic_id_error)
        self._update(session, request)
        if not session.partitions:
            del self._sessions[session.id]
            return _Sessionless(request)
        session.last_used = self._clock()
        session.epoch = next_epoch(session.epoch)
        return _Incremental(self, session, request)

    def _update(self, session: FetchSession, request: k.FetchRequest) -> None:
        uses_ids = session.uses_topic_ids
        for topic in request.topics:
            for fetch in topic.partitions:
                key = _key(uses_ids, topic.topic, topic.topic_id, fetch.partition)
                cached = session.partitions.get(key)
                if cached is None:
                    session.partitions[key] = CachedPartition(topic.topic, topic.topic_id, fetch)
                else:
                    cached.fetch = fetch
        for forgotten in request.forgotten_topics_data:
            for partition in forgotten.partitions:
                session.partitions.pop(
                    _key(uses_ids, forgotten.topic, forgotten.topic_id, partition), None)

    def create(self, partitions: dict[PartitionKey, CachedPartition],
               uses_topic_ids: bool) -> int:
        """A new session of ``partitions`` (its epoch is 1), or INVALID_SESSION_ID when the
        cache is full of sessions it may not evict."""
        now = self._clock()
        if len(self._sessions) >= self.slots and not self._evict_for(len(partitions), now):
            return INVALID_SESSION_ID
        session_id = INVALID_SESSION_ID
        while session_id == INVALID_SESSION_ID or session_id in self._sessions:
            session_id = self._rng.randint(1, 2**31 - 1)
        self._sessions[session_id] = FetchSession(session_id, uses_topic_ids, now, now,
                                                  next_epoch(INITIAL_EPOCH), partitions)
        return session_id

    def _evict_for(self, size: int, now: float) -> bool:
        sessions = self._sessions.values()
        stale = min(sessions, key=lambda s: (s.last_used, s.id))
        if now - stale.last_used > self._eviction_s:
            victim: FetchSession | None = stale
        else:
            # Only sessions that have had their chance (older than the eviction time) give
            # way, and only to a larger one: the smallest first.
            old = [s for s in sessions if now - s.created > self._eviction_s]
            victim = min(old, key=lambda s: (len(s.partitions), s.id), default=None)
            if victim is not None and size <= len(victim.partitions):
                victim = None
        if victim is None:
            return False
        del self._sessions[victim.id]
        self.evictions += 1
        return True

