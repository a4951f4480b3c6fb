"""Leader election decisions, without an API: who may create, take, renew or must wait, by the
candidate's own clock; what each write puts in the record; and the elector's rounds against
an in-memory Lease with optimistic concurrency."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from typing import Any

import pytest

from services.replicator.leadership import (
    Action,
    ElectionSettings,
    LeaseConflictError,
    LeaseElector,
    LeaseRecord,
    Observation,
    decide,
    next_record,
    observe,
    released_record,
    wall_now,
)

T0 = datetime.datetime(2025, 1, 1, 12, 0, 0, 1, tzinfo=datetime.UTC)


def record(holder: str, duration: int = 15, renew: datetime.datetime = T0,
           transitions: int = 0) -> LeaseRecord:
    return LeaseRecord(holder, duration, T0, renew, transitions)


def test_no_lease_is_created():
    assert decide("a", None, now=100.0, default_duration=15) is Action.CREATE


def test_a_lease_held_by_another_is_waited_on_for_its_duration_from_when_it_was_seen():
    seen = Observation(record("b"), seen_at=100.0)
    assert decide("a", seen, now=100.0, default_duration=15) is Action.WAIT
    assert decide("a", seen, now=114.9, default_duration=15) is Action.WAIT
    assert decide("a", seen, now=115.0, default_duration=15) is Action.ACQUIRE


def test_a_lease_held_by_us_is_renewed_even_when_it_looks_expired():
    seen = Observation(record("a"), seen_at=0.0)
    assert decide("a", seen, now=1000.0, default_duration=15) is Action.RENEW


def test_a_released_lease_is_taken_at_once():
    seen = Observation(record("", duration=1), seen_at=100.0)
    assert decide("a", seen, now=100.0, default_duration=15) is Action.ACQUIRE


def test_a_lease_without_duration_lasts_the_default():
    seen = Observation(record("b", duration=0), seen_at=100.0)
    assert decide("a", seen, now=109.0, default_duration=10) is Action.WAIT
    assert decide("a", seen, now=110.0, default_duration=10) is Action.ACQUIRE


def test_a_renewal_restarts_the_lease_for_the_observer():
    first = observe(None, record("b"), now=100.0)
    # Read again unchanged: the lease keeps running from the first sighting.
    assert observe(first, record("b"), now=110.0) == first
    assert decide("a", observe(first, record("b"), now=116.0), 116.0, 15) is Action.ACQUIRE
    # The holder renewed in between: a new record, seen at 110.
    renewed = observe(first, record("b", renew=T0 + datetime.timedelta(seconds=10)), now=110.0)
    assert renewed.seen_at == 110.0
    assert decide("a", renewed, now=116.0, default_duration=15) is Action.WAIT
    assert decide("a", renewed, now=125.0, default_duration=15) is Action.ACQUIRE


@pytest.mark.parametrize("skew", [datetime.timedelta(hours=-3), datetime.timedelta(hours=3)])
def test_clock_skew_of_the_holder_never_shortens_or_stretches_its_lease(skew):
    """The holder's clock is hours off ours: its renewTime is long past (or far ahead), yet
    only our own clock since we saw the record counts."""
    far = wall_now() + skew
    seen = observe(None, record("b", renew=far), now=500.0)
    assert decide("a", seen, now=514.0, default_duration=15) is Action.WAIT
    assert decide("a", seen, now=515.0, default_duration=15) is Action.ACQUIRE


def test_records_written_for_each_action():
    t1 = T0 + datetime.timedelta(seconds=5)
    created = next_record(Action.CREATE, "a", None, 15, T0)
    assert created == LeaseRecord("a", 15, T0, T0, 0)
    renewed = next_record(Action.RENEW, "a", created, 15, t1)
    assert renewed == LeaseRecord("a", 15, T0, t1, 0)  # acquire time and transitions kept
    taken = next_record(Action.ACQUIRE, "b", renewed, 20, t1)
    assert taken == LeaseRecord("b", 20, t1, t1, 1)
    released = released_record(taken, t1)
    assert released == LeaseRecord("", 1, t1, t1, 1)
    assert next_record(Action.ACQUIRE, "a", released, 15, t1).transitions == 2
    with pytest.raises(ValueError):
        next_record(Action.WAIT, "a", taken, 15, t1)


def test_wall_times_always_carry_microseconds():
    assert wall_now().microsecond != 0
    assert wall_now().tzinfo is not None


@pytest.mark.parametrize(("lease", "renew", "retry"), [
    (10, 10, 2),  # renew deadline must be shorter than the lease
    (15, 2.4, 2),  # renew deadline must exceed 1.2 x the retry period
    (15, 10, 0),
])
def test_inconsistent_timing_is_refused(lease, renew, retry):
    with pytest.raises(ValueError):
        ElectionSettings("l", "ns", "a", lease_duration=lease, renew_deadline=renew,
                         retry_period=retry)


def test_defaults_are_client_gos():
    s = ElectionSettings("l", "ns", "a")
    assert (s.lease_duration, s.renew_deadline, s.retry_period) == (15, 10, 2)
    assert s.lease_duration_seconds == 15


class MemoryLeases:
    """One Lease in memory with resourceVersion concurrency; ``fail`` makes calls raise."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.version = 0
        self.writes: list[tuple[str, LeaseRecord]] = []

    async def read(self) -> tuple[LeaseRecord, Any] | None:
        return None if self.record is None else (self.record, self.version)

    async def create(self, record: LeaseRecord) -> Any:
        if self.record is not None:
            raise LeaseConflictError("AlreadyExists")
        return self._write(record)

    async def replace(self, record: LeaseRecord, version: Any) -> Any:
        if version != self.version:
            raise LeaseConflictError("Conflict")
        return self._write(record)

    def _write(self, record: LeaseRecord) -> int:
        self.record = record
        self.version += 1
        self.writes.append((record.holder, record))
        return self.version


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def electors(leases: MemoryLeases, clock: Clock) -> tuple[LeaseElector, LeaseElector]:
    def elector(identity: str) -> LeaseElector:
        return LeaseElector(leases, ElectionSettings("l", "ns", identity), clock=clock)
    return elector("a"), elector("b")


def test_rounds_create_wait_take_over_and_renew():
    async def scenario() -> None:
        leases, clock = MemoryLeases(), Clock()
        a, b = electors(leases, clock)
        assert await a.try_acquire_or_renew()  # creates
        assert not await b.try_acquire_or_renew()  # held by a
        clock.now += 10
        assert await a.try_acquire_or_renew()  # a renews: b sees a new record
        clock.now += 10
        assert not await b.try_acquire_or_renew()
        clock.now += 14.9
        assert not await b.try_acquire_or_renew()
        clock.now += 0.1  # 15 s without a change since b saw it
        assert await b.try_acquire_or_renew()
        assert leases.record is not None
        assert (leases.record.holder, leases.record.transitions) == ("b", 1)
        # a comes back: it sees b's fresh record and waits.
        assert not await a.try_acquire_or_renew()
        assert a.holder == "b"
    asyncio.run(scenario())


def test_a_stale_write_loses_the_race():
    async def scenario() -> None:
        leases, clock = MemoryLeases(), Clock()
        a, b = electors(leases, clock)
        assert await a.try_acquire_or_renew()
        assert await a.release()
        # b read the released Lease; a takes it again before b writes.
        real_read = leases.read

        async def read_then_a_writes() -> Any:
            seen = await real_read()
            leases.read = real_read  # type: ignore[method-assign]
            assert await a.try_acquire_or_renew()
            return seen

        leases.read = read_then_a_writes  # type: ignore[method-assign]
        assert not await b.try_acquire_or_renew()  # 409 on its replace
        assert leases.record is not None and leases.record.holder == "a"
    asyncio.run(scenario())


def test_two_creators_one_wins():
    async def scenario() -> None:
        leases, clock = MemoryLeases(), Clock()
        a, b = electors(leases, clock)
        real_read = leases.read

        async def absent_for_both() -> Any:
            return None

        leases.read = absent_for_both  # type: ignore[method-assign]
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()  # AlreadyExists
        leases.read = real_read  # type: ignore[method-assign]
        assert [holder for holder, _ in leases.writes] == ["a"]
    asyncio.run(scenario())


def test_a_renewal_cut_off_after_its_write_landed_does_not_keep_the_lease_from_release():
    # The renewal's write reached the API server, its answer never reached the elector
    # (cancelled as the replicator stepped down): the version it last saw is stale.
    async def scenario() -> None:
        leases, clock = MemoryLeases(), Clock()
        a, b = electors(leases, clock)
        assert await a.try_acquire_or_renew()
        record, _ = await leases.read()
        leases._write(record)  # the renewal that landed unseen
        assert await a.release()
        assert leases.record is not None and leases.record.holder == ""
        # Released by someone else's hand meanwhile: nothing to give up, nothing written.
        assert await b.try_acquire_or_renew()
        writes = len(leases.writes)
        b.is_leader, leases.record = True, dataclasses.replace(leases.record, holder="c")
        assert not await b.release()
        assert len(leases.writes) == writes
    asyncio.run(scenario())
