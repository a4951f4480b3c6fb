"""Session timers (DelayedHeartbeat): arming, re-arming, disarming and the expiry stream, on a
manual clock and over real gRPC."""

from __future__ import annotations

import asyncio
import time

from kbroker.purgatory.v1 import purgatory_pb2 as pb
from services.purgatory import metrics
from services.purgatory.purgatories import Purgatories

from .fakes import ManualTimer
from .test_service import purgatory


def _drain(subscription) -> list[str]:
    keys = []
    while not subscription.queue.empty():
        keys.append(subscription.queue.get_nowait())
    return keys


def test_a_timer_expires_once_unless_rearmed_and_rearming_pushes_the_deadline() -> None:
    async def main() -> None:
        timer = ManualTimer()
        purgatories = Purgatories(timer)
        heartbeats = purgatories.heartbeats
        subscription = heartbeats.subscribe()
        assert heartbeats.schedule({"member:a": 100, "member:b": 100}) == 0
        assert purgatories.describe().pending_by_kind["heartbeat"] == 2
        timer.advance(60)
        assert heartbeats.schedule({"member:a": 100}) == 1  # a heartbeat of a
        timer.advance(60)
        assert _drain(subscription) == ["member:b"]
        timer.advance(30)
        assert _drain(subscription) == []
        timer.advance(20)
        assert _drain(subscription) == ["member:a"]
        timer.advance(1000)
        assert _drain(subscription) == []
        assert len(heartbeats) == 0
        assert purgatories.describe().pending_by_kind["heartbeat"] == 0

    asyncio.run(main())


def test_a_disarmed_timer_never_expires_and_every_subscriber_sees_each_expiry() -> None:
    async def main() -> None:
        timer = ManualTimer()
        heartbeats = Purgatories(timer).heartbeats
        first, second = heartbeats.subscribe(), heartbeats.subscribe()
        heartbeats.schedule({"gone": 50, "kept": 50})
        assert heartbeats.unschedule(["gone", "never-armed"]) == 1
        timer.advance(100)
        assert _drain(first) == ["kept"]
        assert _drain(second) == ["kept"]
        heartbeats.unsubscribe(second)
        heartbeats.schedule({"later": 10})
        timer.advance(20)
        assert _drain(first) == ["later"]
        assert _drain(second) == []

    asyncio.run(main())


def test_armed_names_the_keys_with_a_timer_running() -> None:
    async def main() -> None:
        timer = ManualTimer()
        heartbeats = Purgatories(timer).heartbeats
        heartbeats.schedule({"a": 10, "b": 100})
        timer.advance(20)  # a ran out
        assert heartbeats.armed(["a", "b", "c"]) == ["b"]
        heartbeats.schedule({"a": 10})  # a sign of life after the expiry
        assert heartbeats.armed(["a", "b"]) == ["a", "b"]

    asyncio.run(main())


def test_expirations_are_counted_as_the_heartbeat_kind() -> None:
    async def main() -> None:
        timer = ManualTimer()
        heartbeats = Purgatories(timer).heartbeats
        expired = metrics.EXPIRED.labels("heartbeat")._value.get()
        completed = metrics.COMPLETED.labels("heartbeat")._value.get()
        heartbeats.schedule({"x": 10})
        heartbeats.schedule({"x": 10})
        timer.advance(20)
        assert metrics.EXPIRED.labels("heartbeat")._value.get() == expired + 1
        assert metrics.COMPLETED.labels("heartbeat")._value.get() == completed + 1

    asyncio.run(main())


def test_a_slow_subscriber_loses_expirations_not_memory() -> None:
    async def main() -> None:
        timer = ManualTimer()
        heartbeats = Purgatories(timer).heartbeats
        subscription = heartbeats.subscribe()
        subscription.queue = asyncio.Queue(maxsize=3)
        heartbeats.schedule({f"k{i}": 5 for i in range(5)})
        timer.advance(10)
        assert subscription.queue.qsize() == 3
        assert subscription.dropped == 2

    asyncio.run(main())


def test_schedule_and_watch_expirations_over_grpc() -> None:
    async def main() -> None:
        async with purgatory() as (service, stub):
            stream = stub.WatchExpirations(pb.WatchExpirationsRequest())
            first = await asyncio.wait_for(stream.read(), 5)
            assert list(first.keys) == []  # subscribed
            started = time.monotonic()
            await stub.Schedule(pb.ScheduleRequest(deadlines=[
                pb.Deadline(key="member:g:1", timeout_ms=200),
                pb.Deadline(key="member:g:2", timeout_ms=200)]))
            await asyncio.sleep(0.1)
            answer = await stub.Schedule(pb.ScheduleRequest(deadlines=[
                pb.Deadline(key="member:g:1", timeout_ms=300)]))
            assert answer.rearmed == 1
            removed = await stub.Unschedule(pb.UnscheduleRequest(keys=["nothing"]))
            assert removed.removed == 0
            armed = await stub.Armed(pb.ArmedRequest(keys=["member:g:2", "nothing"]))
            assert list(armed.keys) == ["member:g:2"]
            seen: list[tuple[str, float]] = []
            while len(seen) < 2:
                message = await asyncio.wait_for(stream.read(), 5)
                seen += [(key, time.monotonic() - started) for key in message.keys]
            assert [key for key, _ in seen] == ["member:g:2", "member:g:1"]
            assert 0.18 <= seen[0][1] < 0.35
            assert seen[1][1] >= 0.38
            description = await stub.Describe(pb.DescribeRequest())
            assert description.pending_by_kind["heartbeat"] == 0
            stream.cancel()

    asyncio.run(asyncio.wait_for(main(), 30))
