"""The group coordinator in real handlers, with real log nodes, purgatory and replicator on
port 0: FindCoordinator and the offsets topic, a whole rebalance, session expiry through the
purgatory, committed offsets, the admin APIs, two handlers racing on one group, and a handler
that starts from nothing but the log."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from kbroker.handler.v1 import kafka_handler_pb2_grpc
from kbroker.kafka.v1 import kafka_pb2 as k
from services.common.channels import insecure_channel
from services.common.errors import ErrorCode
from services.handler import server as handler_server
from services.handler.config import HandlerConfig
from services.handler.coordinator.placement import partition_for
from services.handler.groups.coordinator import OFFSETS_TOPIC
from services.handler.metrics import GROUP_REBALANCES, GROUP_SESSION_EXPIRIES

from ..harness import CALL_TIMEOUT, Cluster, running_cluster
from .client import GroupClient, committed, context

E = ErrorCode
# Members that join within the initial delay of each other all make the first generation,
# even on a loaded machine.
GROUP_OPTIONS: dict[str, Any] = {
    "group_initial_rebalance_delay_ms": 1500,
    "offsets_topic_num_partitions": 4,
    "transaction_state_log_num_partitions": 3,
}
TIMEOUT = 120


def run(coroutine: Any) -> None:
    asyncio.run(asyncio.wait_for(coroutine, TIMEOUT))


@contextlib.asynccontextmanager
async def second_handler(cluster: Cluster, **options: Any
                         ) -> AsyncIterator[kafka_handler_pb2_grpc.KafkaHandlerStub]:
    """Another handler of the same cluster (its own caches, nothing shared but the services),
    with the group options ``options`` (GROUP_OPTIONS when none)."""
    purgatory = f"127.0.0.1:{cluster.purgatory.port}" if cluster.purgatory else "127.0.0.1:1"
    handler = await handler_server.start(HandlerConfig(
        grpc_address="127.0.0.1:0", replicator_address=f"127.0.0.1:{cluster.replicator.port}",
        purgatory_address=purgatory, advertised="default.test:9999", instance="handler-1",
        **(options or GROUP_OPTIONS)))
    channel = insecure_channel(f"127.0.0.1:{handler.port}")
    try:
        yield kafka_handler_pb2_grpc.KafkaHandlerStub(channel)
    finally:
        await channel.close()
        await handler.stop(0)


async def find(stub: kafka_handler_pb2_grpc.KafkaHandlerStub, *keys: str, version: int = 4,
               key_type: int = 0) -> k.FindCoordinatorResponse:
    request = k.FindCoordinatorRequest(key_type=key_type)
    if version >= 4:
        request.coordinator_keys.extend(keys)
    else:
        request.key = keys[0]
    return await stub.FindCoordinator(request, metadata=context(version), timeout=CALL_TIMEOUT)


def test_find_coordinator_creates_the_offsets_topic_and_names_its_leaders(tmp_path: Path):
    async def main() -> None:
        async with running_cluster(tmp_path, nodes=2, **GROUP_OPTIONS) as cluster:
            answer = await find(cluster.stub, "orders", "billing", "")
            metadata = await cluster.metadata(OFFSETS_TOPIC)
            topic = metadata.topics[0]
            assert topic.error_code == 0 and topic.is_internal
            assert len(topic.partitions) == 4
            assert [len(p.replica_nodes) for p in topic.partitions] == [2] * 4
            leaders = {p.partition_index: p.leader_id for p in topic.partitions}
            for coordinator in answer.coordinators:
                assert coordinator.error_code == 0
                node = leaders[partition_for(coordinator.key, 4)]
                assert (coordinator.node_id, coordinator.host, coordinator.port) == (
                    node, "kafka.test", 9092)
            single = await find(cluster.stub, "orders", version=2)
            assert (single.error_code, single.node_id) == (0, leaders[partition_for("orders", 4)])
            # Transactional ids have theirs too (their own topic, created on first need).
            transactional = (await find(cluster.stub, "tx", key_type=1)).coordinators[0]
            state = (await cluster.metadata("__transaction_state")).topics[0]
            assert state.error_code == 0 and len(state.partitions) == 3
            assert (transactional.error_code, transactional.node_id) == (0, {
                p.partition_index: p.leader_id for p in state.partitions}[partition_for("tx", 3)])
            bad = await find(cluster.stub, "x", key_type=7)
            assert bad.coordinators[0].error_code == E.invalid_request.value

    run(main())


def test_a_rebalance_from_join_to_stable_then_a_leave(tmp_path: Path):
    async def main() -> None:
        async with running_cluster(tmp_path, **GROUP_OPTIONS) as cluster:
            await find(cluster.stub, "g")
            await cluster.create_topic("t", partitions=2)
            rebalances = GROUP_REBALANCES._value.get()
            a = GroupClient(cluster.stub, "g", "a")
            b = GroupClient(cluster.stub, "g", "b", protocols=[("roundrobin", b"rb"),
                                                               ("range", b"b")])
            first = await a.join_once()
            assert first.error_code == E.member_id_required.value and first.member_id
            assert (await b.join_once()).error_code == E.member_id_required.value
            started = time.monotonic()
            joined_a, joined_b = await asyncio.gather(a.join(), b.join())
            # The initial delay (1.5 s) ends the first rebalance.
            assert time.monotonic() - started >= 1.5
            assert joined_a.error_code == joined_b.error_code == 0
            assert joined_a.generation_id == joined_b.generation_id == 1
            assert joined_a.protocol_name == "range" and joined_a.leader == a.member_id
            assert {(m.member_id, bytes(m.metadata)) for m in joined_a.members} == {
                (a.member_id, b"meta"), (b.member_id, b"b")}
            assert list(joined_b.members) == []
            follower = asyncio.ensure_future(b.sync())
            await asyncio.sleep(0.2)
            assert not follower.done()  # waits for the leader's assignment
            leader = await a.sync({a.member_id: b"for-a", b.member_id: b"for-b"})
            assert (leader.error_code, leader.assignment) == (0, b"for-a")
            assert (await follower).assignment == b"for-b"
            assert await a.heartbeat() == await b.heartbeat() == 0

            assert await a.commit({("t", 0): 5, ("t", 1): 7}) == {("t", 0): 0, ("t", 1): 0}
            assert await b.commit({("t", 0): 6}, generation=0) == {
                ("t", 0): E.unknown_member_id.value}
            assert await committed(cluster.stub, "g", [("t", 0), ("t", 1), ("t", 9)]) == {
                ("t", 0): 5, ("t", 1): 7, ("t", 9): -1}

            left = await b.leave()
            assert [m.error_code for m in left.members] == [0]
            assert await a.heartbeat() == E.rebalance_in_progress.value
            again = await a.join()
            assert (again.error_code, again.generation_id) == (0, 2)
            assert [m.member_id for m in again.members] == [a.member_id]
            assert await b.heartbeat() == E.unknown_member_id.value
            assert GROUP_REBALANCES._value.get() == rebalances + 2

    run(main())


def test_a_member_that_stops_heartbeating_is_removed_by_its_session_timeout(tmp_path: Path):
    async def main() -> None:
        async with running_cluster(tmp_path, **GROUP_OPTIONS,
                                   group_min_session_timeout_ms=500) as cluster:
            await find(cluster.stub, "s")
            removed = GROUP_SESSION_EXPIRIES.labels("removed")._value.get()
            a = GroupClient(cluster.stub, "s", "a", session_timeout_ms=1500)
            b = GroupClient(cluster.stub, "s", "b", session_timeout_ms=1500)
            await asyncio.gather(a.join(), b.join())
            await asyncio.gather(a.sync({}), b.sync())
            # a keeps heartbeating; b goes silent.
            deadline = time.monotonic() + 10
            code = 0
            while code == 0:
                assert time.monotonic() < deadline, "b was never removed"
                await asyncio.sleep(0.3)
                code = await a.heartbeat()
            assert code == E.rebalance_in_progress.value
            rejoined = await a.join()
            assert [m.member_id for m in rejoined.members] == [a.member_id]
            assert await b.heartbeat() == E.unknown_member_id.value
            assert GROUP_SESSION_EXPIRIES.labels("removed")._value.get() == removed + 1

    run(main())


def test_join_group_error_codes(tmp_path: Path):
    async def main() -> None:
        async with running_cluster(tmp_path, **GROUP_OPTIONS) as cluster:
            before_topic = await GroupClient(cluster.stub, "early").join_once()
            assert before_topic.error_code == E.coordinator_not_available.value
            await find(cluster.stub, "e")
            assert (await GroupClient(cluster.stub, "").join()).error_code == \
                E.invalid_group_id.value
            short = GroupClient(cluster.stub, "e", session_timeout_ms=10)
            assert (await short.join()).error_code == E.invalid_session_timeout.value
            stranger = GroupClient(cluster.stub, "e")
            stranger.member_id = "nobody"
            assert (await stranger.join()).error_code == E.unknown_member_id.value
            # JoinGroup before v4 joins at once, without a member id round trip.
            old = GroupClient(cluster.stub, "old")
            joined = await old.join_once(version=3)
            assert joined.error_code == 0 and joined.member_id
            other = GroupClient(cluster.stub, "old", protocols=[("sticky", b"")])
            assert (await other.join_once(version=3)).error_code == \
                E.inconsistent_group_protocol.value

    run(main())


def test_offsets_outside_group_management_and_the_admin_apis(tmp_path: Path):
    async def main() -> None:
        async with running_cluster(tmp_path, **GROUP_OPTIONS) as cluster:
            await find(cluster.stub, "admin")
            await cluster.create_topic("t", partitions=3)
            simple = GroupClient(cluster.stub, "simple")
            assert await simple.commit({("t", 0): 1, ("t", 2): 3, ("missing", 0): 1},
                                       generation=-1) == {
                ("t", 0): 0, ("t", 2): 0, ("missing", 0): E.unknown_topic_or_partition.value}
            # A generation names a member, and an Empty group has none.
            assert await simple.commit({("t", 1): 1}, generation=4) == {
                ("t", 1): E.unknown_member_id.value}
            assert await simple.commit({("t", 1): 1}, generation=-1) == {("t", 1): 0}
            fresh = GroupClient(cluster.stub, "never-seen")
            assert await fresh.commit({("t", 0): 1}, generation=3) == {
                ("t", 0): E.illegal_generation.value}
            everything = await committed(cluster.stub, "simple")
            assert everything == {("t", 0): 1, ("t", 1): 1, ("t", 2): 3}

            live = GroupClient(cluster.stub, "live")
            await live.join()
            await live.sync({live.member_id: b""})
            listed = await cluster.stub.ListGroups(k.ListGroupsRequest(),
                                                   metadata=context(4), timeout=CALL_TIMEOUT)
            states = {g.group_id: (g.group_state, g.protocol_type) for g in listed.groups}
            assert states["simple"] == ("Empty", "")
            assert states["live"] == ("Stable", "consumer")
            stable_only = await cluster.stub.ListGroups(
                k.ListGroupsRequest(states_filter=["stable"]), metadata=context(4),
                timeout=CALL_TIMEOUT)
            assert [g.group_id for g in stable_only.groups] == ["live"]

            described = await cluster.stub.DescribeGroups(
                k.DescribeGroupsRequest(groups=["live", "simple", "ghost"]),
                metadata=context(5), timeout=CALL_TIMEOUT)
            by_id = {g.group_id: g for g in described.groups}
            assert by_id["live"].group_state == "Stable"
            assert [m.member_id for m in by_id["live"].members] == [live.member_id]
            assert by_id["simple"].group_state == "Empty"
            assert (by_id["ghost"].error_code, by_id["ghost"].group_state) == (0, "Dead")

            deleted = await cluster.stub.DeleteGroups(
                k.DeleteGroupsRequest(groups_names=["simple", "live", "ghost"]),
                metadata=context(2), timeout=CALL_TIMEOUT)
            assert {r.group_id: r.error_code for r in deleted.results} == {
                "simple": 0, "live": E.non_empty_group.value,
                "ghost": E.group_id_not_found.value}
            assert await committed(cluster.stub, "simple") == {}

            await live.commit({("t", 0): 9, ("t", 1): 9})
            removed = await cluster.stub.OffsetDelete(k.OffsetDeleteRequest(
                group_id="live", topics=[k.OffsetDeleteRequest.OffsetDeleteRequestTopic(
                    name="t", partitions=[
                        k.OffsetDeleteRequest.OffsetDeleteRequestPartition(partition_index=0)])]),
                metadata=context(0), timeout=CALL_TIMEOUT)
            assert removed.error_code == 0
            # "meta" is not a consumer subscription naming t, so the offset may go.
            assert [p.error_code for p in removed.topics[0].partitions] == [0]
            assert await committed(cluster.stub, "live") == {("t", 1): 9}

            # LeaveGroup before v3 names one member and answers its error at the top level.
            for expected in (0, E.unknown_member_id.value):
                left = await cluster.stub.LeaveGroup(
                    k.LeaveGroupRequest(group_id="live", member_id=live.member_id),
                    metadata=context(2), timeout=CALL_TIMEOUT)
                assert (left.error_code, list(left.members)) == (expected, [])

    run(main())


def test_two_handlers_racing_on_one_group_never_corrupt_it(tmp_path: Path):
    async def main() -> None:
        async with running_cluster(tmp_path, **GROUP_OPTIONS) as cluster, \
                second_handler(cluster, **GROUP_OPTIONS) as other:
            await find(cluster.stub, "race")
            await cluster.create_topic("t", partitions=20)
            stubs = [cluster.stub, other]
            members = [GroupClient(stubs[i % 2], "race", f"c{i}") for i in range(10)]
            joined = await asyncio.gather(*(m.join() for m in members))
            assert {j.error_code for j in joined} == {0}
            assert {j.generation_id for j in joined} == {1}
            leaders = {j.leader for j in joined}
            assert len(leaders) == 1
            leader = next(m for m in members if m.member_id in leaders)
            lead = next(j for j in joined if j.member_id == leader.member_id)
            assert sorted(m.member_id for m in lead.members) == sorted(
                m.member_id for m in members)
            assignments = {m.member_id: m.member_id.encode() for m in members}
            synced = await asyncio.gather(*(
                m.sync(assignments if m is leader else None) for m in members))
            assert [s.assignment for s in synced] == [m.member_id.encode() for m in members]
            # Every member commits its two partitions many times, through both handlers.
            for round_ in range(5):
                results = await asyncio.gather(*(
                    m.commit({("t", 2 * i): round_, ("t", 2 * i + 1): round_ + 100})
                    for i, m in enumerate(members)))
                assert all(code == 0 for r in results for code in r.values())
            for stub in stubs:
                offsets = await committed(stub, "race")
                assert offsets == {("t", p): 4 + (100 if p % 2 else 0) for p in range(20)}

    run(main())


def test_a_new_handler_rebuilds_groups_and_offsets_from_the_log(tmp_path: Path):
    async def main() -> None:
        async with running_cluster(tmp_path, **GROUP_OPTIONS) as cluster:
            await find(cluster.stub, "durable")
            await cluster.create_topic("t", partitions=2)
            member = GroupClient(cluster.stub, "durable")
            await member.join()
            await member.sync({member.member_id: b"mine"})
            await member.commit({("t", 0): 42, ("t", 1): 43})
            async with second_handler(cluster) as fresh:
                assert await committed(fresh, "durable") == {("t", 0): 42, ("t", 1): 43}
                member.stub = fresh
                assert await member.heartbeat() == 0
                again = await member.sync()
                assert again.assignment == b"mine"

    run(main())


def test_requests_at_a_broker_that_is_not_the_coordinator_get_not_coordinator(tmp_path: Path):
    async def main() -> None:
        async with running_cluster(tmp_path, nodes=2, **GROUP_OPTIONS) as cluster:
            found = await find(cluster.stub, "where")
            coordinator = found.coordinators[0].node_id
            other = 1 - coordinator

            def at(broker: int, version: int) -> tuple[tuple[str, str], ...]:
                return (*context(version), ("kafka-broker-id", str(broker)))

            join = k.JoinGroupRequest(
                group_id="where", session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
                protocol_type="consumer", protocols=[
                    k.JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")])
            wrong = await cluster.stub.JoinGroup(join, metadata=at(other, 9),
                                                 timeout=CALL_TIMEOUT)
            assert wrong.error_code == E.not_coordinator.value
            right = await cluster.stub.JoinGroup(join, metadata=at(coordinator, 9),
                                                 timeout=CALL_TIMEOUT)
            assert right.error_code == E.member_id_required.value
            fetched = await cluster.stub.OffsetFetch(
                k.OffsetFetchRequest(group_id="where", topics_is_null=True),
                metadata=at(other, 7), timeout=CALL_TIMEOUT)
            assert fetched.error_code == E.not_coordinator.value
            heartbeat = await cluster.stub.Heartbeat(
                k.HeartbeatRequest(group_id="where", generation_id=0, member_id="x"),
                metadata=at(other, 4), timeout=CALL_TIMEOUT)
            assert heartbeat.error_code == E.not_coordinator.value
            # Each broker lists the groups it coordinates.
            simple = GroupClient(cluster.stub, "where")
            await cluster.create_topic("t")
            assert await simple.commit({("t", 0): 1}, generation=-1) == {("t", 0): 0}
            listed = {}
            for broker in (0, 1):
                answer = await cluster.stub.ListGroups(
                    k.ListGroupsRequest(), metadata=at(broker, 4), timeout=CALL_TIMEOUT)
                listed[broker] = [g.group_id for g in answer.groups]
            assert listed[coordinator] == ["where"] and listed[other] == []
            # At the port of a broker that is not alive (none has id 7) the group is served:
            # a client whose connection there stays up would otherwise never get further.
            dead = await cluster.stub.Heartbeat(
                k.HeartbeatRequest(group_id="where", generation_id=0, member_id="x"),
                metadata=at(7, 4), timeout=CALL_TIMEOUT)
            assert dead.error_code == E.unknown_member_id.value
            fetched = await cluster.stub.OffsetFetch(
                k.OffsetFetchRequest(group_id="where", topics_is_null=True),
                metadata=at(7, 7), timeout=CALL_TIMEOUT)
            assert fetched.error_code == 0
            assert [(t.name, p.committed_offset) for t in fetched.topics
                    for p in t.partitions] == [("t", 1)]

    run(main())


def test_without_a_purgatory_joins_and_syncs_still_complete(tmp_path: Path):
    async def main() -> None:
        async with running_cluster(tmp_path, purgatory=False, **GROUP_OPTIONS) as cluster:
            await find(cluster.stub, "lonely")
            a = GroupClient(cluster.stub, "lonely", "a")
            b = GroupClient(cluster.stub, "lonely", "b")
            joined = await asyncio.gather(a.join(), b.join())
            assert [j.error_code for j in joined] == [0, 0]
            leader, follower = (a, b) if joined[0].leader == a.member_id else (b, a)
            waiting = asyncio.ensure_future(follower.sync())
            await leader.sync({follower.member_id: b"f", leader.member_id: b"l"})
            assert (await waiting).assignment == b"f"

    run(main())


def test_a_static_member_restarting_keeps_its_assignment_without_a_rebalance(tmp_path: Path):
    async def main() -> None:
        async with running_cluster(tmp_path, **GROUP_OPTIONS) as cluster:
            await find(cluster.stub, "static")
            a = GroupClient(cluster.stub, "static", "a", instance_id="instance-a")
            b = GroupClient(cluster.stub, "static", "b", instance_id="instance-b")
            joined = await asyncio.gather(a.join(), b.join())
            leader, follower = (a, b) if joined[0].leader == a.member_id else (b, a)
            waiting = asyncio.ensure_future(follower.sync())
            await leader.sync({a.member_id: b"A", b.member_id: b"B"})
            await waiting
            # b restarts: a new client, the same instance id, no member id yet.
            old_id = b.member_id
            restarted = GroupClient(cluster.stub, "static", "b", instance_id="instance-b")
            again = await restarted.join()
            assert again.error_code == 0 and restarted.member_id != old_id
            assert again.generation_id == 1  # no rebalance
            assert (await restarted.sync()).assignment == b"B"
            assert await a.heartbeat() == 0
            assert await b.heartbeat() == E.fenced_instance_id.value
            # Leaving by instance id alone rebalances the group.
            left = await cluster.stub.LeaveGroup(k.LeaveGroupRequest(
                group_id="static", members=[k.LeaveGroupRequest.MemberIdentity(
                    member_id="", group_instance_id="instance-b")]),
                metadata=context(5), timeout=CALL_TIMEOUT)
            assert [m.error_code for m in left.members] == [0]
            assert await a.heartbeat() == E.rebalance_in_progress.value

    run(main())


def test_a_rebalance_ends_at_its_timeout_without_the_members_that_did_not_rejoin(tmp_path: Path):
    async def main() -> None:
        async with running_cluster(tmp_path, **GROUP_OPTIONS) as cluster:
            await find(cluster.stub, "slow")
            a = GroupClient(cluster.stub, "slow", "a", rebalance_timeout_ms=1500)
            b = GroupClient(cluster.stub, "slow", "b", rebalance_timeout_ms=1500,
                            session_timeout_ms=30_000)
            joined = await asyncio.gather(a.join(), b.join())
            leader, follower = (a, b) if joined[0].leader == a.member_id else (b, a)
            waiting = asyncio.ensure_future(follower.sync())
            await leader.sync({})
            await waiting
            # The leader rejoins (a rebalance); the follower neither rejoins nor heartbeats.
            started = time.monotonic()
            again = await leader.join()
            waited = time.monotonic() - started
            assert again.error_code == 0 and again.generation_id == 2
            assert [m.member_id for m in again.members] == [leader.member_id]
            assert 1.4 <= waited < 10, waited
            assert await follower.heartbeat() == E.unknown_member_id.value

    run(main())


def test_sessions_still_expire_after_the_purgatory_restarts(tmp_path: Path):
    from services.purgatory import server as purgatory_server
    from services.purgatory.config import PurgatoryConfig

    async def main() -> None:
        async with running_cluster(tmp_path, **GROUP_OPTIONS,
                                   group_min_session_timeout_ms=500) as cluster:
            await find(cluster.stub, "r")
            a = GroupClient(cluster.stub, "r", "a", session_timeout_ms=1500)
            b = GroupClient(cluster.stub, "r", "b", session_timeout_ms=1500)
            await asyncio.gather(a.join(), b.join())
            await asyncio.gather(a.sync({}), b.sync())
            port = cluster.purgatory.port
            await cluster.purgatory.stop(0)  # every session timer is lost
            restarted = await purgatory_server.start(
                PurgatoryConfig(grpc_address=f"127.0.0.1:{port}"))
            try:
                # b is silent from now on; the handlers arm its timer again on reconnecting.
                deadline = time.monotonic() + 15
                code = 0
                while code == 0:
                    assert time.monotonic() < deadline, "b was never removed"
                    await asyncio.sleep(0.3)
                    code = await a.heartbeat()
                assert code == E.rebalance_in_progress.value
            finally:
                await restarted.stop(0)

    run(main())


async def describe(stub: kafka_handler_pb2_grpc.KafkaHandlerStub,
                   group_id: str) -> k.DescribeGroupsResponse.DescribedGroup:
    answer = await stub.DescribeGroups(k.DescribeGroupsRequest(groups=[group_id]),
                                       metadata=context(5), timeout=CALL_TIMEOUT)
    return answer.groups[0]


def test_a_member_that_never_syncs_is_removed_at_the_rebalance_timeout(tmp_path: Path):
    async def main() -> None:
        async with running_cluster(tmp_path, **GROUP_OPTIONS) as cluster:
            await find(cluster.stub, "nosync")
            # Sessions (30 s) outlast the test: only the rebalance timeout can remove b.
            a = GroupClient(cluster.stub, "nosync", "a", rebalance_timeout_ms=1500,
                            session_timeout_ms=30_000)
            b = GroupClient(cluster.stub, "nosync", "b", rebalance_timeout_ms=1500,
                            session_timeout_ms=30_000)
            joined = await asyncio.gather(a.join(), b.join())
            answered = time.monotonic()
            leader, follower = (a, b) if joined[0].leader == a.member_id else (b, a)
            assert (await leader.sync({leader.member_id: b"x"})).error_code == 0
            # The follower got its JoinGroup answer but never sends SyncGroup, though it
            # heartbeats; the leader heartbeats until it is told to rebalance.
            deadline = time.monotonic() + 15
            code = 0
            while code == 0:
                assert time.monotonic() < deadline, "the pending sync never expired"
                await asyncio.sleep(0.2)
                assert await follower.heartbeat() in (0, E.unknown_member_id.value)
                code = await leader.heartbeat()
            assert code == E.rebalance_in_progress.value
            assert time.monotonic() - answered >= 1.4
            assert await follower.heartbeat() == E.unknown_member_id.value
            again = await leader.join()
            assert (again.error_code, again.generation_id) == (0, 2)
            assert [m.member_id for m in again.members] == [leader.member_id]

    run(main())


def test_a_group_nobody_waits_on_moves_on_at_its_deadlines(tmp_path: Path):
    async def main() -> None:
        async with running_cluster(tmp_path, **GROUP_OPTIONS) as cluster:
            await find(cluster.stub, "idle")
            a = GroupClient(cluster.stub, "idle", "a", rebalance_timeout_ms=1500,
                            session_timeout_ms=30_000)
            b = GroupClient(cluster.stub, "idle", "b", rebalance_timeout_ms=1500,
                            session_timeout_ms=30_000)
            joined = await asyncio.gather(a.join(), b.join())
            leader = a if joined[0].leader == a.member_id else b
            assert (await leader.sync({})).error_code == 0
            # From now on nobody sends anything: the purgatory's timers alone remove the
            # member that did not sync (1.5 s), then end the join phase the leader never
            # rejoined (1.5 s more), leaving the group Empty long before any session ends.
            seen = []
            deadline = time.monotonic() + 15
            while True:
                group = await describe(cluster.stub, "idle")
                if not seen or seen[-1] != (group.group_state, len(group.members)):
                    seen.append((group.group_state, len(group.members)))
                if group.group_state == "Empty":
                    break
                assert time.monotonic() < deadline, seen
                await asyncio.sleep(0.1)
            assert seen[0] == ("Stable", 2)
            assert ("PreparingRebalance", 1) in seen, seen
            assert seen[-1] == ("Empty", 0)
            assert await leader.heartbeat() == E.unknown_member_id.value

    run(main())


def test_describe_groups_v6_offset_commit_and_fetch_v9(tmp_path: Path):
    async def main() -> None:
        async with running_cluster(tmp_path, **GROUP_OPTIONS) as cluster:
            await find(cluster.stub, "v9")
            await cluster.create_topic("t9", partitions=1)
            member = GroupClient(cluster.stub, "v9", "a")
            await member.join()
            await member.sync({member.member_id: b"x"})

            async def described(version: int) -> dict[str, Any]:
                answer = await cluster.stub.DescribeGroups(
                    k.DescribeGroupsRequest(groups=["v9", "nobody"]),
                    metadata=context(version), timeout=CALL_TIMEOUT)
                return {g.group_id: g for g in answer.groups}

            # KIP-1043: from v6 a group that does not exist is an error, with a message.
            v6 = await described(6)
            assert (v6["v9"].error_code, v6["v9"].group_state) == (0, "Stable")
            assert not v6["v9"].HasField("error_message")
            assert (v6["nobody"].error_code, v6["nobody"].error_message) == (
                E.group_id_not_found.value, "Group nobody not found.")
            v5 = await described(5)
            assert (v5["nobody"].error_code, v5["nobody"].group_state) == (0, "Dead")

            # v9 commits of a classic group carry its generation, as v8 did.
            commit = k.OffsetCommitRequest(
                group_id="v9", generation_id_or_member_epoch=member.generation,
                member_id=member.member_id, topics=[
                    {"name": "t9", "partitions": [{"partition_index": 0,
                                                   "committed_offset": 42}]}])
            answer = await cluster.stub.OffsetCommit(commit, metadata=context(9),
                                                     timeout=CALL_TIMEOUT)
            assert answer.topics[0].partitions[0].error_code == 0
            stale = k.OffsetCommitRequest()
            stale.CopyFrom(commit)
            stale.generation_id_or_member_epoch = member.generation + 5
            answer = await cluster.stub.OffsetCommit(stale, metadata=context(9),
                                                     timeout=CALL_TIMEOUT)
            assert answer.topics[0].partitions[0].error_code == E.illegal_generation.value
            # v9 fetches name a member and epoch, which a classic group does not check.
            fetched = await cluster.stub.OffsetFetch(k.OffsetFetchRequest(groups=[
                {"group_id": "v9", "member_id": "someone", "member_epoch": 7,
                 "topics": [{"name": "t9", "partition_indexes": [0]}]}]),
                metadata=context(9), timeout=CALL_TIMEOUT)
            [group] = fetched.groups
            assert group.error_code == 0
            assert group.topics[0].partitions[0].committed_offset == 42

    run(main())
