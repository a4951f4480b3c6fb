"""Incremental follower fetch sessions (KIP-227 on a ReplicaFetch stream): the session kept per
stream (pure), a leader serving it (only what is new for the follower is answered, quiet
partitions still count as fetched, errors of partitions not named still come back, forgotten
partitions are not read), and a follower fetching through it from a real leader (after its first
request it names only what changed, and still copies every partition)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from services.common.errors import ErrorCode
from services.common.records.record_batch import iter_batches
from services.log.replica_fetch_session import ReplicaFetchSession
from services.log.server import LogService

from ..record_batches import build_batch, values
from .test_replica_fetcher import TIMEOUT, create, eventually, everything, states, two_nodes
from .test_replica_fetcher import append as append_at
from .test_replica_service import LEADER, PEER, become, create_with, next_isr_change, state
from .test_service import append, run_node

EPOCH = 0


def fetch_of(topic: str, offset: int, epoch: int = EPOCH) -> log_pb2.ReplicaFetchPartition:
    return log_pb2.ReplicaFetchPartition(topic=topic, partition=0, leader_epoch=epoch,
                                         fetch_offset=offset, max_bytes=1 << 20)


def request(*fetches: log_pb2.ReplicaFetchPartition, incremental: bool = True,
            forgotten: tuple[str, ...] = (), max_wait_ms: int = 0
            ) -> log_pb2.ReplicaFetchRequest:
    return log_pb2.ReplicaFetchRequest(
        replica_id=PEER, max_wait_ms=max_wait_ms, incremental=incremental, partitions=fetches,
        forgotten=[log_pb2.TopicPartition(topic=t, partition=0) for t in forgotten])


def topics_of(response: log_pb2.ReplicaFetchResponse) -> list[str]:
    return [r.topic for r in response.results]


# -- the session ---------------------------------------------------------------------------


def test_a_full_request_replaces_the_session_and_an_incremental_one_changes_it() -> None:
    session = ReplicaFetchSession()
    fetches = session.update(request(fetch_of("a", 0), fetch_of("b", 0), incremental=False))
    assert [c.fetch.topic for c in fetches] == ["a", "b"]
    session.answered([log_pb2.ReplicaFetchResult(topic="a", partition=0, high_watermark=4,
                                                 log_start_offset=1)])
    fetches = session.update(request(fetch_of("a", 7), fetch_of("c", 0), forgotten=("b",)))
    assert [(c.fetch.topic, c.fetch.fetch_offset) for c in fetches] == [("a", 7), ("c", 0)]
    a, c = fetches
    # What a was last answered stays; c was never answered.
    assert (a.answered, a.high_watermark, a.log_start_offset) == (True, 4, 1)
    assert not c.answered
    # An incremental request naming nothing fetches the session as it is.
    assert session.update(request()) == [a, c]
    fetches = session.update(request(fetch_of("b", 0), incremental=False))
    assert [c.fetch.topic for c in fetches] == ["b"] and not fetches[0].answered


def test_a_partition_has_news_when_it_has_batches_an_error_or_other_offsets() -> None:
    session = ReplicaFetchSession()
    [cached] = session.update(request(fetch_of("a", 0), incremental=False))

    def result(**fields: int) -> log_pb2.ReplicaFetchResult:
        values = {"high_watermark": 5, "log_start_offset": 0, **fields}
        return log_pb2.ReplicaFetchResult(topic="a", partition=0, **values)

    assert cached.has_news(result(), b"")  # never answered
    session.answered([result()])
    assert not cached.has_news(result(), b"")
    # After an error, or at another leader epoch, the partition is answered afresh.
    session.answered([result(error_code=ErrorCode.not_leader_or_follower.value)])
    assert cached.has_news(result(), b"")
    session.answered([result()])
    session.update(request(fetch_of("a", 0, EPOCH + 1)))
    assert cached.has_news(result(), b"")
    session.answered([result()])
    session.update(request(fetch_of("a", 3, EPOCH + 1)))
    assert not cached.has_news(result(), b"")
    assert not cached.has_news(result(log_end_offset=9), b"")
    assert cached.has_news(result(), b"batches")
    assert cached.has_news(result(high_watermark=6), b"")
    assert cached.has_news(result(log_start_offset=2), b"")
    assert cached.has_news(result(error_code=ErrorCode.fenced_leader_epoch.value), b"")
    named = result()
    named.file_records.size = 10
    assert cached.has_news(named, b"")


# -- a leader serving a session --------------------------------------------------------------


def test_a_leader_answers_an_incremental_fetch_with_what_is_new_only(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        for topic in "abc":
            await create_with(stub, topic, state(topic, LEADER, EPOCH))
        await append(stub, "a", build_batch(values(2)))
        session = stub.ReplicaFetch()
        try:
            async def exchange(message: log_pb2.ReplicaFetchRequest
                               ) -> log_pb2.ReplicaFetchResponse:
                await session.write(message)
                return await asyncio.wait_for(session.read(), 10)

            full = await exchange(request(fetch_of("a", 0), fetch_of("b", 0), fetch_of("c", 0),
                                          incremental=False))
            assert topics_of(full) == ["a", "b", "c"]
            assert [b.header.base_offset for b in iter_batches(full.results[0].records)] == [0]
            # The follower has a's batch: a's high watermark moves, nothing else is news.
            moved = await exchange(request(fetch_of("a", 2)))
            assert topics_of(moved) == ["a"] and moved.results[0].high_watermark == 2
            assert topics_of(await exchange(request())) == []
            # An append to a partition not named is answered, from the offset last named.
            await append(stub, "b", build_batch(values(1)))
            appended = await exchange(request())
            assert topics_of(appended) == ["b"]
            assert [b.header.base_offset for b in iter_batches(
                appended.results[0].records)] == [0]
            # A forgotten partition is not read, whatever it gets.
            await append(stub, "c", build_batch(values(1)))
            assert topics_of(await exchange(request(fetch_of("b", 1), forgotten=("c",)))) == \
                ["b"]
            assert topics_of(await exchange(request())) == []
            # A partition that is not named still gets its error.
            assert await become(stub, state("a", LEADER, EPOCH + 1)) == [0]
            fenced = await exchange(request())
            assert [(r.topic, r.error_code) for r in fenced.results] == [
                ("a", ErrorCode.fenced_leader_epoch.value)]
            # A long poll with nothing new waits, and answers an append to a quiet partition.
            waiting = asyncio.ensure_future(exchange(request(fetch_of("a", 2, EPOCH + 1),
                                                             max_wait_ms=5000)))
            answered_a = await asyncio.wait_for(waiting, 10)
            assert topics_of(answered_a) == ["a"]  # after its error: answered afresh
            assert answered_a.results[0].error_code == 0
            waiting = asyncio.ensure_future(exchange(request(max_wait_ms=5000)))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            await append(stub, "b", build_batch(values(3)))
            woken = await asyncio.wait_for(waiting, 3)
            assert topics_of(woken) == ["b"]
            assert [b.header.base_offset for b in iter_batches(woken.results[0].records)] == [1]
        finally:
            session.cancel()

    run_node(tmp_path, body)


def test_a_quiet_partition_is_told_the_high_watermark_another_follower_moved(
        tmp_path: Path) -> None:
    """Follower 1 holds the log's end and names nothing; follower 2's fetch then commits the
    records: follower 1's next answer carries the new high watermark."""
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        three = log_pb2.ReplicaState(topic="a", partition=0, role=LEADER, leader_epoch=EPOCH,
                                     leader=0, replicas=[0, PEER, 2], isr=[0, PEER, 2],
                                     partition_epoch=1)
        await create_with(stub, "a", three)
        await append(stub, "a", build_batch(values(2)))
        one = stub.ReplicaFetch()
        try:
            await one.write(request(fetch_of("a", 2), incremental=False))
            first = await asyncio.wait_for(one.read(), 10)
            assert first.results[0].high_watermark == 0  # follower 2 has not fetched yet
            for _ in range(3):  # quiet now
                await one.write(request())
                assert topics_of(await asyncio.wait_for(one.read(), 10)) == []
            other = await stub.ReplicaFetchOnce(log_pb2.ReplicaFetchRequest(
                replica_id=2, partitions=[fetch_of("a", 2)]))
            assert other.results[0].high_watermark == 2
            await one.write(request())
            told = await asyncio.wait_for(one.read(), 10)
            assert [(r.topic, r.high_watermark) for r in told.results] == [("a", 2)]
        finally:
            one.cancel()

    run_node(tmp_path, body)


def test_a_new_stream_is_a_new_session(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create_with(stub, "a", state("a", LEADER, EPOCH))
        for _ in range(2):
            session = stub.ReplicaFetch()
            await session.write(request(fetch_of("a", 0), incremental=False))
            assert topics_of(await asyncio.wait_for(session.read(), 10)) == ["a"]
            await session.write(request())
            assert topics_of(await asyncio.wait_for(session.read(), 10)) == []
            session.cancel()

    run_node(tmp_path, body)


def test_a_follower_fetching_only_quietly_stays_in_the_isr(tmp_path: Path) -> None:
    """Every round of a session counts as a fetch of all its partitions: a follower that is
    caught up and names nothing for longer than replica.lag.time.max.ms is not removed; once
    its fetches stop, it is."""
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await stub.UpdateReplicationSettings(log_pb2.ReplicationSettings(
            configs={"replica.lag.time.max.ms": "200"}))
        changes = stub.AlterPartitions()
        await create_with(stub, "q", state("q", LEADER, EPOCH, partition_epoch=3))
        await append(stub, "q", build_batch(values(3)))
        session = stub.ReplicaFetch()
        await session.write(request(fetch_of("q", 3), incremental=False))
        assert (await asyncio.wait_for(session.read(), 10)).results[0].high_watermark == 3
        changing = asyncio.ensure_future(next_isr_change(changes))
        for _ in range(12):  # 0.6 s: three lag times
            await session.write(request(max_wait_ms=50))
            assert topics_of(await asyncio.wait_for(session.read(), 10)) == []
        assert not changing.done()
        session.cancel()
        change = await asyncio.wait_for(changing, 10)
        assert (list(change.current_isr), list(change.new_isr)) == ([0, 1], [0])
        changes.cancel()

    run_node(tmp_path, body)


# -- a follower fetching through a session ----------------------------------------------------


def test_a_follower_names_only_what_changed_and_copies_every_partition(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        async with two_nodes(tmp_path) as (leader, follower):
            seen: list[log_pb2.ReplicaFetchRequest] = []
            serve = leader.service.replicas.fetch

            async def recording(message: log_pb2.ReplicaFetchRequest,
                                session: ReplicaFetchSession | None = None):
                seen.append(log_pb2.ReplicaFetchRequest.FromString(
                    message.SerializeToString()))
                return await serve(message, session)

            monkeypatch.setattr(leader.service.replicas, "fetch", recording)
            topics = ["p0", "p1", "p2", "p3"]
            for topic in topics:
                await create((leader, follower), topic)
            for topic in topics:
                await append_at(leader, topic, build_batch(values(2)))
            await eventually(lambda: all(follower.log(t).high_watermark == 2 for t in topics))
            rounds = len(seen)
            for n in range(5):
                await append_at(leader, "p1", build_batch(values(n + 1)))
            await eventually(lambda: follower.log("p1").high_watermark == 17)
            later = seen[rounds:]
            assert later and all(r.incremental for r in later)
            assert {p.topic for r in later for p in r.partitions} == {"p1"}
            assert not any(r.forgotten for r in later)
            for topic in topics:
                assert everything(follower, topic) == everything(leader, topic)
            assert not seen[0].incremental
            # The leader ends the stream after its next answer (as a stopping node does): the
            # follower starts a new session with a full request, and goes on copying.
            broken_at = len(seen)
            leader.service.replicas.stopping = True
            await append_at(leader, "p2", build_batch(values(1)))
            await eventually(lambda: any(not r.incremental for r in seen[broken_at:]))
            leader.service.replicas.stopping = False
            full = next(r for r in seen[broken_at:] if not r.incremental)
            assert {p.topic for p in full.partitions} == set(topics)
            await append_at(leader, "p3", build_batch(values(1)))
            await eventually(lambda: follower.log("p2").high_watermark == 3
                             and follower.log("p3").high_watermark == 3)
            for topic in topics:
                assert everything(follower, topic) == everything(leader, topic)

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))


def test_a_partition_failing_on_the_leader_leaves_a_steady_session_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its error backs it off: the next request forgets it, and the follower does not go on
    asking for it (an error is answered at once, so asking again would spin)."""
    async def main() -> None:
        async with two_nodes(tmp_path) as (leader, follower):
            seen: list[tuple[float, log_pb2.ReplicaFetchRequest]] = []
            serve = leader.service.replicas.fetch

            async def recording(message: log_pb2.ReplicaFetchRequest,
                                session: ReplicaFetchSession | None = None):
                seen.append((asyncio.get_running_loop().time(),
                             log_pb2.ReplicaFetchRequest.FromString(
                                 message.SerializeToString())))
                return await serve(message, session)

            monkeypatch.setattr(leader.service.replicas, "fetch", recording)
            topics = ["s0", "s1", "s2"]
            for topic in topics:
                await create((leader, follower), topic)
                await append_at(leader, topic, build_batch(values(2)))
            await eventually(lambda: all(follower.log(t).high_watermark == 2 for t in topics))
            await asyncio.sleep(0.5)  # steady: every partition fetched, nothing named
            failing_from = len(seen)
            # The leader moves to a new epoch of s1 the follower does not know yet.
            [leader_state, _] = states("s1", 1)
            response = await leader.stub.UpdateReplicaStates(
                log_pb2.UpdateReplicaStatesRequest(states=[leader_state]))
            assert [r.error_code for r in response.results] == [0]
            await eventually(lambda: any(
                any(f.topic == "s1" for f in r.forgotten) for _, r in seen[failing_from:]))
            started = asyncio.get_running_loop().time()
            await asyncio.sleep(1.0)
            asked = [r for t, r in seen if t >= started]
            assert len(asked) < 60, f"{len(asked)} requests in a second"
            # The others still replicate.
            await append_at(leader, "s2", build_batch(values(1)))
            await eventually(lambda: follower.log("s2").high_watermark == 3)

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))
