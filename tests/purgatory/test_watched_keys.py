"""WatchedKeys: which keys progress reporters are told to report, and the changes each
subscriber sees (pure logic, a fake clock)."""

from __future__ import annotations

import asyncio

from kbroker.purgatory.v1 import purgatory_pb2 as pb
from services.purgatory.watched_keys import WatchedKeys


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_subscriber_starts_with_a_reset_of_every_published_key() -> None:
    keys = WatchedKeys(linger=10, clock=Clock())
    keys.watch("a-0")
    keys.watch("b-1")
    subscription = keys.subscribe()
    assert subscription.take() == pb.WatchedKeys(reset=True, added=("a-0", "b-1"))
    assert subscription.take() is None


def test_a_key_is_added_once_however_many_operations_park_on_it() -> None:
    keys = WatchedKeys(linger=10, clock=Clock())
    subscription = keys.subscribe()
    assert subscription.take() == pb.WatchedKeys(reset=True)
    keys.watch("t-0")
    keys.watch("t-0")
    keys.watch("t-1")
    assert subscription.take() == pb.WatchedKeys(added=("t-0", "t-1"))
    keys.watch("t-0")
    assert subscription.take() is None


def test_idle_keys_are_withdrawn_after_the_linger_and_busy_ones_stay() -> None:
    clock = Clock()
    keys = WatchedKeys(linger=10, clock=clock)
    subscription = keys.subscribe()
    subscription.take()
    keys.watch("idle-0")
    keys.watch("busy-0")
    subscription.take()
    clock.now += 9.9
    assert keys.sweep(lambda key: False) == 0
    clock.now += 0.2
    assert keys.sweep(lambda key: key == "busy-0") == 1
    assert subscription.take() == pb.WatchedKeys(removed=("idle-0",))
    assert "busy-0" in keys and "idle-0" not in keys
    # Still watched at the sweep: its linger starts again from then.
    clock.now += 9.9
    assert keys.sweep(lambda key: False) == 0
    clock.now += 0.2
    assert keys.sweep(lambda key: False) == 1
    assert subscription.take() == pb.WatchedKeys(removed=("busy-0",))


def test_changes_merge_until_taken_and_a_re_added_key_is_reported_again() -> None:
    clock = Clock()
    keys = WatchedKeys(linger=1, clock=clock)
    subscription = keys.subscribe()
    subscription.take()
    keys.watch("t-0")
    assert subscription.take() == pb.WatchedKeys(added=("t-0",))
    clock.now += 2
    keys.sweep(lambda key: False)
    keys.watch("t-0")
    # Withdrawn and added again before the subscriber looked: it hears of the add (and so
    # reports the key's position again), not of the removal.
    assert subscription.take() == pb.WatchedKeys(added=("t-0",))
    clock.now += 2
    keys.sweep(lambda key: False)
    assert subscription.take() == pb.WatchedKeys(removed=("t-0",))


def test_a_pending_reset_absorbs_later_changes() -> None:
    clock = Clock()
    keys = WatchedKeys(linger=1, clock=clock)
    keys.watch("old-0")
    subscription = keys.subscribe()
    keys.watch("new-0")
    clock.now += 2
    keys.watch("new-0")
    keys.sweep(lambda key: False)
    assert subscription.take() == pb.WatchedKeys(reset=True, added=("new-0",))


def test_next_changes_waits_for_a_change() -> None:
    async def scenario() -> None:
        keys = WatchedKeys(linger=10, clock=Clock())
        subscription = keys.subscribe()
        assert await subscription.next_changes() == pb.WatchedKeys(reset=True)
        waiter = asyncio.ensure_future(subscription.next_changes())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        keys.watch("t-0")
        assert await asyncio.wait_for(waiter, 1) == pb.WatchedKeys(added=("t-0",))
        keys.unsubscribe(subscription)
        keys.watch("t-1")
        assert subscription.take() is None

    asyncio.run(scenario())
