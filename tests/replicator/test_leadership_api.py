"""LeaseElector with the real kubernetes client against a real HTTP server implementing the
Lease API (tests/replicator/fake_lease_api.py; no API server can be installed offline):
one of two candidates leads, the other takes over within the lease duration when the leader
stops renewing, and a leader that cannot renew stops before anyone else may take over."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from services.replicator.leadership import ElectionSettings, KubernetesLeases, LeaseElector

from .fake_lease_api import FakeLeaseApi

NS, NAME = "kbroker", "kb-replicator"
# Short timing for tests: lease 2 s, renew deadline 1.5 s, retry 0.2 s.
LEASE, RENEW, RETRY = 2.0, 1.5, 0.2


@pytest.fixture
def api() -> Iterator[FakeLeaseApi]:
    server = FakeLeaseApi().start()
    yield server
    server.stop()


def api_client(api: FakeLeaseApi, token: str) -> Any:
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = api.url
    configuration.api_key = {"authorization": token}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    return client.ApiClient(configuration)


def elector(api: FakeLeaseApi, identity: str) -> tuple[LeaseElector, Any]:
    settings = ElectionSettings(NAME, NS, identity, lease_duration=LEASE,
                                renew_deadline=RENEW, retry_period=RETRY)
    client = api_client(api, identity)
    return LeaseElector(KubernetesLeases(client, NAME, NS, settings.request_timeout),
                        settings), client


async def campaign(e: LeaseElector) -> float:
    """Acquire; the monotonic time it happened."""
    await e.acquire()
    return time.monotonic()


def test_the_lease_is_created_with_a_valid_record(api: FakeLeaseApi):
    async def scenario() -> None:
        a, client = elector(api, "a")
        try:
            await asyncio.wait_for(a.acquire(), 5)
            lease = api.lease(NS, NAME)
            assert lease is not None
            spec = lease["spec"]
            assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 2
            assert spec["leaseTransitions"] == 0 and spec["acquireTime"] == spec["renewTime"]
            first = lease["metadata"]["resourceVersion"]
            assert await a.try_acquire_or_renew()
            renewed = api.lease(NS, NAME)
            assert renewed is not None
            assert renewed["metadata"]["resourceVersion"] != first
            assert renewed["spec"]["acquireTime"] == spec["acquireTime"]
            assert renewed["spec"]["renewTime"] > spec["renewTime"]
            # Every write carried a time the API server accepts (else it answers 400).
            assert all(status in (200, 201, 404) for *_, status in api.requests)
        finally:
            client.close()
    asyncio.run(scenario())


def test_two_candidates_one_leads_and_the_other_takes_over_when_it_stops_renewing(
        api: FakeLeaseApi):
    async def scenario() -> None:
        (a, ca), (b, cb) = elector(api, "a"), elector(api, "b")
        tasks = {asyncio.create_task(campaign(a)), asyncio.create_task(campaign(b))}
        try:
            done, pending = await asyncio.wait(tasks, timeout=5,
                                               return_when=asyncio.FIRST_COMPLETED)
            assert len(done) == 1
            leader, standby = (a, b) if a.is_leader else (b, a)
            assert not standby.is_leader
            holding = asyncio.create_task(leader.hold())
            # The standby keeps waiting while the leader renews: several lease durations.
            await asyncio.sleep(LEASE * 2)
            assert not holding.done()
            assert not any(t.done() for t in pending)
            assert api.holder(NS, NAME) == leader.settings.identity
            # The leader freezes (its renewals stop, nothing is released).
            holding.cancel()
            stopped = time.monotonic()
            (waiting,) = pending
            took_over = await asyncio.wait_for(waiting, LEASE + 2)
            assert standby.is_leader
            assert api.holder(NS, NAME) == standby.settings.identity
            elapsed = took_over - stopped
            # Not before the lease ran out since the last renewal the standby saw, and within
            # the lease duration plus a retry (and slack for a loaded machine).
            assert LEASE - RETRY - 0.1 <= elapsed <= LEASE + 2 * RETRY + 1.0, elapsed
            lease = api.lease(NS, NAME)
            assert lease is not None and lease["spec"]["leaseTransitions"] == 1
            # The old leader, were it to come back, sees the new holder and does not lead.
            assert not await leader.try_acquire_or_renew()
        finally:
            for t in tasks:
                t.cancel()
            ca.close()
            cb.close()
    asyncio.run(scenario())


@pytest.mark.parametrize("fault", ["failing", "hanging"])
def test_a_leader_that_cannot_renew_stops_before_the_standby_takes_over(
        api: FakeLeaseApi, fault: str):
    """The leader's requests fail (503) or hang (longer than every timeout): it gives up
    within the renew deadline, and the standby only acquires after that."""
    async def scenario() -> None:
        (a, ca), (b, cb) = elector(api, "a"), elector(api, "b")
        try:
            await asyncio.wait_for(a.acquire(), 5)
            holding = asyncio.create_task(a.hold())
            await asyncio.sleep(RETRY * 3)
            standby = asyncio.create_task(campaign(b))
            await asyncio.sleep(RETRY * 3)
            assert not standby.done() and not holding.done()
            getattr(api, fault).add("a")
            cut = time.monotonic()
            await asyncio.wait_for(holding, RENEW + 2)
            lost = time.monotonic()
            assert not a.is_leader
            # Within the renew deadline of the last renewal, which was before the cut.
            assert lost - cut <= RENEW + 0.5, lost - cut
            took_over = await asyncio.wait_for(standby, LEASE + 2)
            assert took_over > lost, "the standby led while the old leader still did"
            assert api.holder(NS, NAME) == "b"
        finally:
            api.failing.clear()
            api.hanging.clear()
            ca.close()
            cb.close()
    asyncio.run(scenario())


def test_a_released_lease_is_taken_at_the_next_try(api: FakeLeaseApi):
    async def scenario() -> None:
        (a, ca), (b, cb) = elector(api, "a"), elector(api, "b")
        try:
            await asyncio.wait_for(a.acquire(), 5)
            standby = asyncio.create_task(campaign(b))
            await asyncio.sleep(RETRY * 2)
            assert not standby.done()
            released = time.monotonic()
            assert await a.release()
            lease = api.lease(NS, NAME)
            assert lease is not None and lease["spec"]["holderIdentity"] == ""
            took_over = await asyncio.wait_for(standby, LEASE)
            assert took_over - released < RETRY * 1.2 + 0.5
        finally:
            ca.close()
            cb.close()
    asyncio.run(scenario())


def test_the_api_refuses_stale_writes_and_duplicate_creates(api: FakeLeaseApi):
    """The fake's optimistic concurrency, checked through the real client, so the tests above
    cannot pass on a server that accepts everything."""
    from kubernetes.client import CoordinationV1Api, V1Lease, V1LeaseSpec, V1ObjectMeta
    from kubernetes.client.exceptions import ApiException

    client = api_client(api, "t")
    try:
        leases = CoordinationV1Api(client)
        body = V1Lease(metadata=V1ObjectMeta(name=NAME), spec=V1LeaseSpec(holder_identity="x"))
        created = leases.create_namespaced_lease(NS, body)
        with pytest.raises(ApiException) as exists:
            leases.create_namespaced_lease(NS, body)
        assert exists.value.status == 409 and "AlreadyExists" in str(exists.value.body)
        created.spec.holder_identity = "y"
        leases.replace_namespaced_lease(NAME, NS, created)
        created.spec.holder_identity = "z"
        with pytest.raises(ApiException) as stale:
            leases.replace_namespaced_lease(NAME, NS, created)
        assert stale.value.status == 409
        assert leases.read_namespaced_lease(NAME, NS).spec.holder_identity == "y"
    finally:
        client.close()
