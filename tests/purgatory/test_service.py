"""The purgatory service over real gRPC on 127.0.0.1 port 0."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest

from kbroker.purgatory.v1 import purgatory_pb2 as pb
from kbroker.purgatory.v1 import purgatory_pb2_grpc
from services.common.channels import insecure_channel
from services.purgatory import metrics
from services.purgatory.config import PurgatoryConfig
from services.purgatory.server import PurgatoryService, start

FETCH = pb.OPERATION_KIND_FETCH
PRODUCE = pb.OPERATION_KIND_PRODUCE


@contextlib.asynccontextmanager
async def purgatory() -> AsyncIterator[tuple[PurgatoryService, purgatory_pb2_grpc.PurgatoryStub]]:
    service = await start(PurgatoryConfig(grpc_address="127.0.0.1:0"))
    channel = insecure_channel(f"127.0.0.1:{service.port}")
    try:
        yield service, purgatory_pb2_grpc.PurgatoryStub(channel)
    finally:
        await channel.close()
        await service.stop(0)


def await_request(keys: dict[str, int], timeout_ms: int, kind: int = FETCH,
                  require_all: bool = False) -> pb.AwaitRequest:
    return pb.AwaitRequest(
        kind=kind, require_all=require_all, timeout_ms=timeout_ms,
        keys=[pb.WatchedKey(key=k, threshold=t) for k, t in keys.items()],
    )


def report(*states: tuple[str, int] | tuple[str, int, int]) -> pb.CheckAndCompleteRequest:
    return pb.CheckAndCompleteRequest(
        keys=[pb.KeyState(key=s[0], position=s[1], error_code=s[2] if len(s) > 2 else 0)
              for s in states]
    )


async def wait_for(condition: Callable[[], Awaitable[bool]], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not await condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def pending_is(stub: purgatory_pb2_grpc.PurgatoryStub, kind: str, count: int,
               watched_keys: int | None = None) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        d = await stub.Describe(pb.DescribeRequest())
        return d.pending_by_kind[kind] == count and (
            watched_keys is None or d.watched_keys == watched_keys)

    return check


def test_await_expires_after_its_timeout():
    async def scenario() -> None:
        async with purgatory() as (_, stub):
            begin = time.monotonic()
            answer = await stub.Await(await_request({"t-0": 1}, 200))
            elapsed = time.monotonic() - begin
            assert answer.outcome == pb.OUTCOME_EXPIRED
            assert 0.200 <= elapsed < 0.350, elapsed
            assert [(k.key, k.position) for k in answer.keys] == [("t-0", -1)]
            d = await stub.Describe(pb.DescribeRequest())
            assert d.pending_by_kind["fetch"] == 0 and d.watched_keys == 0

    asyncio.run(scenario())


def test_check_and_complete_completes_the_waiter():
    async def scenario() -> None:
        async with purgatory() as (_, stub):
            call = asyncio.ensure_future(stub.Await(await_request({"t-0": 5}, 10_000)))
            await wait_for(pending_is(stub, "fetch", 1, watched_keys=1))
            assert (await stub.CheckAndComplete(report(("t-0", 4)))).completed == 0
            assert (await stub.CheckAndComplete(report(("other", 9)))).completed == 0
            assert not call.done()
            assert (await stub.CheckAndComplete(report(("t-0", 5)))).completed == 1
            answer = await asyncio.wait_for(call, 5)
            assert answer.outcome == pb.OUTCOME_COMPLETED
            assert [(k.key, k.position, k.error_code) for k in answer.keys] == [("t-0", 5, 0)]
            assert await pending_is(stub, "fetch", 0, watched_keys=0)()

    asyncio.run(scenario())


def test_require_all_waits_for_every_key_and_any_for_one():
    async def scenario() -> None:
        async with purgatory() as (_, stub):
            keys = {"t-0": 10, "t-1": 10}
            every = asyncio.ensure_future(
                stub.Await(await_request(keys, 10_000, PRODUCE, require_all=True)))
            some = asyncio.ensure_future(stub.Await(await_request(keys, 10_000)))
            await wait_for(pending_is(stub, "produce", 1))
            await wait_for(pending_is(stub, "fetch", 1))
            assert (await stub.CheckAndComplete(report(("t-0", 10)))).completed == 1
            assert (await asyncio.wait_for(some, 5)).outcome == pb.OUTCOME_COMPLETED
            assert not every.done()
            assert (await stub.CheckAndComplete(report(("t-1", 12)))).completed == 1
            answer = await asyncio.wait_for(every, 5)
            assert answer.outcome == pb.OUTCOME_COMPLETED
            assert [(k.key, k.position) for k in answer.keys] == [("t-0", 10), ("t-1", 12)]

    asyncio.run(scenario())


def test_a_report_that_races_ahead_of_the_await_is_not_missed():
    async def scenario() -> None:
        async with purgatory() as (_, stub):
            await stub.CheckAndComplete(report(("t-0", 7)))
            begin = time.monotonic()
            answer = await stub.Await(await_request({"t-0": 7}, 10_000))
            assert answer.outcome == pb.OUTCOME_COMPLETED and answer.keys[0].position == 7
            assert time.monotonic() - begin < 1.0

    asyncio.run(scenario())


def test_an_error_reported_after_parking_completes_the_operation():
    async def scenario() -> None:
        async with purgatory() as (_, stub):
            call = asyncio.ensure_future(stub.Await(await_request({"t-0": 100}, 10_000)))
            await wait_for(pending_is(stub, "fetch", 1))
            assert (await stub.CheckAndComplete(report(("t-0", 3, 6)))).completed == 1
            answer = await asyncio.wait_for(call, 5)
            assert answer.outcome == pb.OUTCOME_COMPLETED
            assert (answer.keys[0].error_code, answer.keys[0].position) == (6, 3)
            # The same error, still the key's last state, does not answer a later waiter.
            late = await stub.Await(await_request({"t-0": 100}, 50))
            assert late.outcome == pb.OUTCOME_EXPIRED

    asyncio.run(scenario())


def test_zero_timeout_answers_at_once():
    async def scenario() -> None:
        async with purgatory() as (_, stub):
            await stub.CheckAndComplete(report(("t-0", 3)))
            met = await stub.Await(await_request({"t-0": 3}, 0))
            unmet = await stub.Await(await_request({"t-0": 4}, 0))
            assert met.outcome == pb.OUTCOME_COMPLETED
            assert unmet.outcome == pb.OUTCOME_EXPIRED

    asyncio.run(scenario())


def test_unspecified_kind_is_rejected():
    async def scenario() -> None:
        async with purgatory() as (_, stub):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await stub.Await(await_request({"k": 1}, 100, pb.OPERATION_KIND_UNSPECIFIED))
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    asyncio.run(scenario())


def test_describe_counts_pending_per_kind_and_distinct_watched_keys():
    async def scenario() -> None:
        async with purgatory() as (_, stub):
            calls = [
                asyncio.ensure_future(stub.Await(await_request({"a": 1, "b": 1}, 10_000))),
                asyncio.ensure_future(stub.Await(await_request({"b": 1}, 10_000))),
                asyncio.ensure_future(stub.Await(await_request({"c": 1}, 10_000, PRODUCE))),
                asyncio.ensure_future(stub.Await(
                    await_request({"g": 1}, 10_000, pb.OPERATION_KIND_HEARTBEAT))),
            ]
            await wait_for(pending_is(stub, "fetch", 2, watched_keys=4))
            d = await stub.Describe(pb.DescribeRequest())
            assert dict(d.pending_by_kind) == {"fetch": 2, "produce": 1, "join": 0,
                                               "heartbeat": 1}
            await stub.CheckAndComplete(report(("a", 1), ("b", 1), ("c", 1), ("g", 1)))
            await asyncio.wait_for(asyncio.gather(*calls), 5)
            d = await stub.Describe(pb.DescribeRequest())
            assert sum(d.pending_by_kind.values()) == 0 and d.watched_keys == 0

    asyncio.run(scenario())


def test_a_cancelled_waiter_leaves_nothing_behind():
    async def scenario() -> None:
        async with purgatory() as (service, stub):
            abandoned_before = metrics.ABANDONED.labels("fetch")._value.get()
            calls = [stub.Await(await_request({"t-0": 1, f"only-{i}": 1}, 60_000,
                                              require_all=True)) for i in range(50)]
            waiting = [asyncio.ensure_future(c) for c in calls]
            await wait_for(pending_is(stub, "fetch", 50, watched_keys=51))
            for call in calls:
                call.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
            await wait_for(pending_is(stub, "fetch", 0, watched_keys=0))
            assert service.purgatories.describe().watched_keys == 0
            assert service.purgatories._timer.size == 0
            assert metrics.ABANDONED.labels("fetch")._value.get() - abandoned_before == 50
            # A report for the keys finds nobody to complete.
            assert (await stub.CheckAndComplete(report(("t-0", 5)))).completed == 0

    asyncio.run(scenario())


def test_racing_completion_and_expiry_answer_each_operation_exactly_once():
    async def scenario() -> None:
        async with purgatory() as (_, stub):
            completed_before = metrics.COMPLETED.labels("produce")._value.get()
            expired_before = metrics.EXPIRED.labels("produce")._value.get()
            # Long enough that all operations are parked before the first expires, even on a
            # loaded machine.
            n, keys, timeout = 400, 20, 2.0
            first_sent = time.monotonic()
            calls = [asyncio.ensure_future(stub.Await(
                await_request({f"k{i % keys}": 1}, int(timeout * 1000), PRODUCE)))
                for i in range(n)]
            await wait_for(pending_is(stub, "produce", n))
            all_parked = time.monotonic()
            # The timers fire between first_sent + timeout and all_parked + timeout: spread the
            # reports, one key at a time, over that window and a little around it.
            begin, end = first_sent + timeout - 0.02, all_parked + timeout + 0.02
            reported = 0
            for i in range(keys):
                await asyncio.sleep(max(0.0, begin + (end - begin) * i / keys - time.monotonic()))
                reported += (await stub.CheckAndComplete(report((f"k{i}", 1)))).completed
            answers = await asyncio.wait_for(asyncio.gather(*calls), 10)
            completed = sum(a.outcome == pb.OUTCOME_COMPLETED for a in answers)
            expired = sum(a.outcome == pb.OUTCOME_EXPIRED for a in answers)
            assert completed + expired == n
            assert completed == reported
            assert metrics.COMPLETED.labels("produce")._value.get() - completed_before == completed
            assert metrics.EXPIRED.labels("produce")._value.get() - expired_before == expired
            assert await pending_is(stub, "produce", 0, watched_keys=0)()

    asyncio.run(scenario())


def test_two_thousand_concurrent_waiters():
    async def scenario() -> None:
        async with purgatory() as (_, stub):
            n, keys, wave = 2000, 20, 500
            calls = []
            # In waves: gRPC core cancels calls beyond grpc.server.max_pending_requests (1000 by
            # default) that arrive before the server has picked them up.
            for start_at in range(0, n, wave):
                calls += [asyncio.ensure_future(stub.Await(
                    await_request({f"t-{i % keys}": 10}, 30_000)))
                    for i in range(start_at, start_at + wave)]
                await wait_for(pending_is(stub, "fetch", len(calls)), within=30)
            assert await pending_is(stub, "fetch", n, watched_keys=keys)()
            begin = time.monotonic()
            done = await stub.CheckAndComplete(report(*((f"t-{i}", 10) for i in range(keys))))
            assert done.completed == n
            answers = await asyncio.wait_for(asyncio.gather(*calls), 30)
            assert all(a.outcome == pb.OUTCOME_COMPLETED for a in answers)
            assert time.monotonic() - begin < 10
            assert await pending_is(stub, "fetch", 0, watched_keys=0)()

    asyncio.run(scenario())


def test_stopping_the_server_releases_parked_operations():
    async def scenario() -> None:
        service = await start(PurgatoryConfig(grpc_address="127.0.0.1:0"))
        channel = insecure_channel(f"127.0.0.1:{service.port}")
        try:
            stub = purgatory_pb2_grpc.PurgatoryStub(channel)
            call = asyncio.ensure_future(stub.Await(await_request({"t-0": 1}, 60_000)))
            await wait_for(pending_is(stub, "fetch", 1))
        finally:
            await service.stop(0)
        with pytest.raises(grpc.aio.AioRpcError):
            await asyncio.wait_for(call, 5)
        await channel.close()
        assert service.purgatories.describe().pending_by_kind["fetch"] == 0
        assert service.purgatories._timer.size == 0

    asyncio.run(scenario())


def test_watch_keys_publishes_the_keys_fetches_and_produces_park_on():
    async def scenario() -> None:
        service = await start(PurgatoryConfig(grpc_address="127.0.0.1:0", watch_linger_ms=200))
        channel = insecure_channel(f"127.0.0.1:{service.port}")
        stub = purgatory_pb2_grpc.PurgatoryStub(channel)
        try:
            stream = stub.WatchKeys(pb.WatchKeysRequest())
            first = await asyncio.wait_for(stream.read(), 5)
            assert first.reset and not first.added
            fetch = asyncio.ensure_future(stub.Await(await_request({"t-0": 5}, 5000)))
            added = await asyncio.wait_for(stream.read(), 5)
            assert list(added.added) == ["t-0"] and not added.reset
            # Join operations are reported by handlers, not by log nodes: not published.
            join = asyncio.ensure_future(stub.Await(
                await_request({"g": 1}, 5000, kind=pb.OPERATION_KIND_JOIN)))
            produce = asyncio.ensure_future(stub.Await(
                await_request({"t-1@3": 7}, 5000, kind=PRODUCE, require_all=True)))
            assert list((await asyncio.wait_for(stream.read(), 5)).added) == ["t-1@3"]
            await stub.CheckAndComplete(report(("t-0", 5), ("t-1@3", 7), ("g", 1)))
            for answer in await asyncio.gather(fetch, join, produce):
                assert answer.outcome == pb.OUTCOME_COMPLETED
            # Nothing parked on them any more: withdrawn after the linger (in one message or
            # two, as the linger of each runs out).
            removed: list[str] = []
            while len(removed) < 2:
                message = await asyncio.wait_for(stream.read(), 5)
                assert not message.added and not message.reset
                removed += message.removed
            assert sorted(removed) == ["t-0", "t-1@3"]
            # A late subscriber's reset is the current set.
            parked = asyncio.ensure_future(stub.Await(await_request({"u-2": 1}, 5000)))
            await wait_for(pending_is(stub, "fetch", 1))
            late = stub.WatchKeys(pb.WatchKeysRequest())
            reset = await asyncio.wait_for(late.read(), 5)
            assert reset.reset and list(reset.added) == ["u-2"]
            parked.cancel()
            stream.cancel()
            late.cancel()
        finally:
            await channel.close()
            await service.stop(0)

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_await_stream_answers_each_call_when_it_completes_and_ends_with_the_stream():
    async def scenario() -> None:
        async with purgatory() as (_, stub):
            stream = stub.AwaitStream()

            def call(call_id: int, request: pb.AwaitRequest) -> pb.AwaitStreamRequest:
                return pb.AwaitStreamRequest(call_id=call_id, request=request)

            await stream.write(call(1, await_request({"t-0": 5}, 10_000, PRODUCE, True)))
            await stream.write(call(2, await_request({"t-1": 3}, 10_000, PRODUCE, True)))
            await wait_for(pending_is(stub, "produce", 2, watched_keys=2))
            await stub.CheckAndComplete(report(("t-1", 3)))
            answer = await asyncio.wait_for(stream.read(), 5)  # the second call, first
            assert (answer.call_id, answer.status_code) == (2, 0)
            assert answer.response.outcome == pb.OUTCOME_COMPLETED
            assert [(k.key, k.position) for k in answer.response.keys] == [("t-1", 3)]
            await stream.write(call(3, await_request({"k": 1}, 100,
                                                     pb.OPERATION_KIND_UNSPECIFIED)))
            refused = await asyncio.wait_for(stream.read(), 5)
            assert refused.call_id == 3
            assert refused.status_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
            assert not refused.HasField("response")
            # Call 1 is still parked; the stream's end takes it off.
            assert await pending_is(stub, "produce", 1)()
            await stream.done_writing()
            await wait_for(pending_is(stub, "produce", 0, watched_keys=0))

    asyncio.run(scenario())
