"""The classic group state machine: joins (new, pending, static), the initial delay, protocol
selection, sync, heartbeats, leaving, session expiry and offset commit checks, with the error
codes Kafka's coordinator gives."""

from __future__ import annotations

import itertools

from services.common.errors import ErrorCode
from services.handler.coordinator.schema import decode
from services.handler.coordinator_records import GroupMetadataValue
from services.handler.groups.group import (
    Expiry,
    Group,
    GroupConfig,
    GroupState,
    JoinRequest,
    JoinResult,
    JoinWait,
    SyncResult,
    SyncWait,
)
from services.handler.groups.state import group_record

CONFIG = GroupConfig(initial_rebalance_delay_ms=3000)
E = ErrorCode
_ids = itertools.count()


def ids(client_id: str) -> str:
    return f"{client_id}-{next(_ids)}"


def request(member_id: str = "", *, client: str = "c", instance: str | None = None,
            protocols: tuple[tuple[str, bytes], ...] = (("range", b"r"),),
            rebalance_ms: int = 10_000, session_ms: int = 6000,
            require_id: bool = False, protocol_type: str = "consumer") -> JoinRequest:
    return JoinRequest(member_id=member_id, group_instance_id=instance, client_id=client,
                       client_host="/127.0.0.1", session_timeout_ms=session_ms,
                       rebalance_timeout_ms=rebalance_ms, protocol_type=protocol_type,
                       protocols=protocols, require_known_member_id=require_id)


def join(group: Group, req: JoinRequest, now: int) -> JoinResult | JoinWait:
    return group.join(req, now, CONFIG, ids)


def finish_join(group: Group, now: int = 100_000) -> None:
    """Let the join phase in progress run out (an initial delay may restart a few times)."""
    for _ in range(10):
        if group.state is not GroupState.PREPARING_REBALANCE:
            return
        group.maybe_complete_join(now, CONFIG)
        now += 100_000
    raise AssertionError("the join phase never ended")


def stable_group(*clients: str, now: int = 0) -> tuple[Group, list[str]]:
    """A Stable group of generation 1 with one member per client (the first leads)."""
    group = Group(group_id="g")
    members = []
    for client in clients:
        outcome = join(group, request(client=client), now)
        assert isinstance(outcome, JoinWait)
        members.append(outcome.member_id)
    finish_join(group, now + 3000)
    assert group.state is GroupState.COMPLETING_REBALANCE
    result = group.sync(members[0], None, group.generation, "consumer", "range",
                        {m: m.encode() for m in members}, now + 3000)
    assert isinstance(result, SyncResult) and result.error_code == 0
    assert group.state is GroupState.STABLE
    return group, members


def test_a_new_member_of_v4_first_gets_its_id_then_joins_with_it() -> None:
    group = Group(group_id="g")
    first = join(group, request(require_id=True), 0)
    assert isinstance(first, JoinResult)
    assert first.error_code == E.member_id_required.value and first.member_id.startswith("c-")
    assert group.state is GroupState.EMPTY and first.member_id in group.pending_members
    # A pending member holds up the end of a join phase until it joins or lapses.
    outcome = join(group, request(first.member_id), 10)
    assert outcome == JoinWait(member_id=first.member_id, generation=0)
    assert group.state is GroupState.PREPARING_REBALANCE
    assert not group.pending_members


def test_the_initial_delay_waits_for_more_members_within_the_rebalance_timeout() -> None:
    group = Group(group_id="g")
    a = join(group, request(client="a", rebalance_ms=10_000), 0)
    assert isinstance(a, JoinWait)
    assert (group.join_deadline_ms, group.initial_delay_remaining_ms) == (3000, 7000)
    assert not group.maybe_complete_join(2999, CONFIG)
    b = join(group, request(client="b", rebalance_ms=10_000), 1000)
    assert isinstance(b, JoinWait) and group.new_member_added
    # Everyone joined, but an initial delay ends only by time: new members restart it.
    assert not group.maybe_complete_join(3000, CONFIG)
    assert (group.join_deadline_ms, group.initial_delay_remaining_ms) == (6000, 4000)
    assert not group.maybe_complete_join(5999, CONFIG)
    assert group.maybe_complete_join(6000, CONFIG)
    assert group.state is GroupState.COMPLETING_REBALANCE
    assert group.generation == 1 and group.leader_id == a.member_id
    leader = group.join_answer(a.member_id)
    assert [m.member_id for m in leader.members] == [a.member_id, b.member_id]
    assert list(group.join_answer(b.member_id).members) == []
    assert leader.protocol_name == "range" and leader.leader == a.member_id


def test_the_most_voted_common_protocol_is_selected() -> None:
    group = Group(group_id="g")
    join(group, request(client="a", protocols=(("sticky", b"0"), ("range", b"1"),
                                                ("roundrobin", b"2"))), 0)
    join(group, request(client="b", protocols=(("roundrobin", b"3"), ("range", b"4"))), 0)
    join(group, request(client="c", protocols=(("range", b"5"), ("roundrobin", b"6"))), 0)
    assert group.maybe_complete_join(3000, CONFIG) is False  # the delay restarts once
    assert group.maybe_complete_join(6000, CONFIG)
    # sticky is not common; a and c prefer range, b roundrobin.
    assert group.protocol_name == "range"
    assert [m.metadata for m in group.join_answer(group.leader_id).members] == [
        b"1", b"4", b"5"]


def test_a_member_without_a_common_protocol_or_of_another_type_is_refused() -> None:
    group, _ = stable_group("a")
    outcome = join(group, request(client="b", protocols=(("sticky", b""),)), 0)
    assert isinstance(outcome, JoinResult)
    assert outcome.error_code == E.inconsistent_group_protocol.value
    outcome = join(group, request(client="b", protocol_type="connect"), 0)
    assert isinstance(outcome, JoinResult)
    assert outcome.error_code == E.inconsistent_group_protocol.value
    empty = Group(group_id="e")
    outcome = join(empty, request(protocols=()), 0)
    assert isinstance(outcome, JoinResult)
    assert outcome.error_code == E.inconsistent_group_protocol.value


def test_sync_delivers_every_assignment_and_an_empty_one_to_members_left_out() -> None:
    group = Group(group_id="g")
    a = join(group, request(client="a"), 0)
    b = join(group, request(client="b"), 0)
    c = join(group, request(client="c"), 0)
    finish_join(group)
    follower = group.sync(b.member_id, None, 1, None, None, {}, 3001)
    assert follower == SyncWait(generation=1)
    assert group.sync(b.member_id, None, 0, None, None, {}, 3001) == SyncResult(
        error_code=E.illegal_generation.value)
    result = group.sync(a.member_id, None, 1, "consumer", "range",
                        {a.member_id: b"A", b.member_id: b"B", "stranger": b"X"}, 3002)
    assert isinstance(result, SyncResult) and result.assignment == b"A"
    assert group.state is GroupState.STABLE
    assert group.sync_answer(b.member_id).assignment == b"B"
    assert group.sync_answer(c.member_id).assignment == b""
    assert group.sync(c.member_id, None, 1, None, None, {}, 3003) == SyncResult(
        error_code=0, assignment=b"", protocol_type="consumer", protocol_name="range")
    assert group.sync(c.member_id, None, 1, "consumer", "roundrobin", {}, 3003).error_code == \
        E.inconsistent_group_protocol.value


def test_heartbeat_errors() -> None:
    group, (a, b) = stable_group("a", "b")
    assert group.heartbeat(a, None, 1) == 0
    assert group.heartbeat(a, None, 0) == E.illegal_generation.value
    assert group.heartbeat("nobody", None, 1) == E.unknown_member_id.value
    assert Group(group_id="x").heartbeat(a, None, 0) == E.unknown_member_id.value
    join(group, request(client="c"), 10)
    assert group.state is GroupState.PREPARING_REBALANCE
    assert group.heartbeat(b, None, 1) == E.rebalance_in_progress.value


def test_a_rebalance_ends_when_all_rejoined_or_at_its_deadline_dropping_the_rest() -> None:
    group, (a, b, c) = stable_group("a", "b", "c")
    outcome = join(group, request(a, client="a", rebalance_ms=20_000), 100)
    assert outcome == JoinWait(member_id=a, generation=1)
    assert group.join_deadline_ms == 100 + 20_000 and group.initial_delay_remaining_ms == -1
    join(group, request(b, client="b"), 200)
    assert not group.maybe_complete_join(20_099, CONFIG)
    assert group.maybe_complete_join(20_100, CONFIG)
    assert list(group.members) == [a, b] and group.generation == 2
    # With every member back, the phase ends on the last join.
    join(group, request(b, client="b", protocols=(("range", b"new"),)), 30_000)
    assert group.state is GroupState.PREPARING_REBALANCE
    done = join(group, request(a, client="a"), 30_001)
    assert done == JoinWait(member_id=a, generation=2)
    assert group.state is GroupState.COMPLETING_REBALANCE and group.generation == 3


def test_followers_with_nothing_new_get_the_current_generation_and_the_leader_rebalances() -> None:
    group, (a, b) = stable_group("a", "b")
    same = join(group, request(b, client="b"), 10)
    assert isinstance(same, JoinResult) and same.generation_id == 1 and not same.members
    assert group.state is GroupState.STABLE
    leader = join(group, request(a, client="a"), 20)
    assert isinstance(leader, JoinWait)
    assert group.state is GroupState.PREPARING_REBALANCE


def test_leaving_rebalances_and_the_last_member_leaving_empties_the_group() -> None:
    group, (a, b) = stable_group("a", "b")
    assert group.leave([(b, None), ("nobody", None)], 50, CONFIG) == [
        0, E.unknown_member_id.value]
    assert group.state is GroupState.PREPARING_REBALANCE
    # a has not rejoined yet.
    assert not group.maybe_complete_join(60, CONFIG)
    assert group.leave([(a, None)], 70, CONFIG) == [0]
    assert group.state is GroupState.EMPTY and group.generation == 2
    assert group.leader_id is None and group.protocol_name is None


def test_session_expiry_removes_a_member_but_keeps_one_waiting_for_a_join_phase() -> None:
    group, (a, b) = stable_group("a", "b")
    assert group.expire("nobody", 0, CONFIG) is Expiry.GONE
    # Stable since 3000 (the sync): alive until a session timeout (6 s) from then.
    assert group.keep_alive_ms(group.members[b], 5000) == 4000
    assert group.expire(b, 5000, CONFIG) is Expiry.KEEP_ALIVE
    join(group, request(a, client="a"), 10_000)
    assert group.expire(a, 20_000, CONFIG) is Expiry.KEEP_ALIVE  # waiting for the join phase
    assert group.expire(b, 20_000, CONFIG) is Expiry.REMOVED
    assert group.state is GroupState.COMPLETING_REBALANCE and list(group.members) == [a]
    # Just answered: alive for a session timeout from the end of the join phase.
    assert group.expire(a, 25_000, CONFIG) is Expiry.KEEP_ALIVE
    assert group.expire(a, 26_000, CONFIG) is Expiry.REMOVED
    assert group.state is GroupState.EMPTY
    pending = Group(group_id="p")
    first = join(pending, request(require_id=True), 0)
    assert pending.expire(first.member_id, 10, CONFIG) is Expiry.REMOVED
    assert not pending.pending_members


def test_static_members_come_back_without_a_rebalance_and_fence_their_old_id() -> None:
    group = Group(group_id="g")
    a = join(group, request(client="a", instance="i-a"), 0)
    b = join(group, request(client="b", instance="i-b"), 0)
    finish_join(group)
    group.sync(a.member_id, None, 1, None, None, {a.member_id: b"A", b.member_id: b"B"}, 3001)
    again = join(group, request(client="b", instance="i-b"), 5000)
    assert isinstance(again, JoinResult) and again.error_code == 0
    assert again.member_id != b.member_id and again.generation_id == 1
    assert group.state is GroupState.STABLE
    assert group.sync_answer(again.member_id).assignment == b"B"
    assert group.heartbeat(b.member_id, "i-b", 1) == E.fenced_instance_id.value
    stale = join(group, request(b.member_id, client="b", instance="i-b"), 5001)
    assert isinstance(stale, JoinResult) and stale.error_code == E.fenced_instance_id.value
    # A static member may leave by instance id alone; a wrong member id is fenced.
    assert group.leave([("wrong", "i-a")], 6000, CONFIG) == [E.fenced_instance_id.value]
    assert group.leave([("", "i-a")], 6000, CONFIG) == [0]
    assert group.state is GroupState.PREPARING_REBALANCE


def test_static_members_that_did_not_rejoin_stay_in_the_next_generation() -> None:
    group = Group(group_id="g")
    a = join(group, request(client="a", instance="i-a", rebalance_ms=5000), 0)
    b = join(group, request(client="b"), 0)
    finish_join(group)
    group.sync(a.member_id, None, 1, None, None, {}, 300_000)
    join(group, request(b.member_id, client="b", protocols=(("range", b"x"),)), 400_000)
    assert not group.maybe_complete_join(409_999, CONFIG)  # the longest rebalance timeout
    assert group.maybe_complete_join(410_000, CONFIG)
    assert set(group.members) == {a.member_id, b.member_id}
    assert group.leader_id == b.member_id  # the leader must have rejoined


def test_offset_commit_checks() -> None:
    group, (a, _b) = stable_group("a", "b")
    assert group.validate_offset_commit(a, None, 1) == 0
    assert group.validate_offset_commit(a, None, 0) == E.illegal_generation.value
    assert group.validate_offset_commit("x", None, 1) == E.unknown_member_id.value
    assert group.validate_offset_commit("", None, -1) == E.unknown_member_id.value
    empty = Group(group_id="simple")
    assert empty.validate_offset_commit("", None, -1) == 0
    join(group, request(a, client="a"), 10)
    assert group.validate_offset_commit(a, None, 1) == 0  # still allowed while preparing
    group.maybe_complete_join(100_000, CONFIG)
    assert group.validate_offset_commit(a, None, 2) == E.rebalance_in_progress.value


def test_the_group_record_round_trips_every_field() -> None:
    group = Group(group_id="g")
    join(group, request(client="a", instance="i", protocols=(("range", b"1"), ("rr", b"2"))), 5)
    first = join(group, request(require_id=True), 6)
    restored = Group.from_record("g", decode(GroupMetadataValue, group_record("g", group)[1]))
    assert restored == group
    assert first.member_id in restored.pending_members
    stable, _ = stable_group("x", "y")
    again = Group.from_record("g", decode(GroupMetadataValue, group_record("g", stable)[1]))
    assert again == stable
    assert again.pending_sync == {stable_group_follower(stable)}


def stable_group_follower(group: Group) -> str:
    """The one member of a two-member group from :func:`stable_group` that has not synced."""
    [follower] = [m for m in group.members if m != group.leader_id]
    return follower


def test_members_that_do_not_sync_within_the_rebalance_timeout_are_removed() -> None:
    group = Group(group_id="g")
    a, b, c = (join(group, request(client=x), 0).member_id for x in "abc")
    finish_join(group)
    assert group.state is GroupState.COMPLETING_REBALANCE
    ended = group.state_timestamp_ms
    # Every member of the new generation owes a SyncGroup, for the rebalance timeout.
    assert group.pending_sync == {a, b, c}
    assert group.deadline_ms() == group.sync_deadline_ms == ended + 10_000
    assert isinstance(group.sync(b, None, 1, None, None, {}, ended + 10), SyncWait)
    assert group.pending_sync == {a, c}
    group.sync(a, None, 1, None, None, {a: b"1", b: b"2", c: b"3"}, ended + 20)
    assert group.state is GroupState.STABLE and group.pending_sync == {c}
    # Nothing happens before the deadline.
    assert group.on_deadline(ended + 9_999, CONFIG) == []
    assert group.state is GroupState.STABLE and c in group.members
    # At it, c (still heartbeating or not) is removed and the rest rebalance.
    assert group.heartbeat(c, None, 1) == 0
    assert group.on_deadline(ended + 10_000, CONFIG) == [c]
    assert group.state is GroupState.PREPARING_REBALANCE and list(group.members) == [a, b]
    assert not group.pending_sync and group.sync_deadline_ms == -1
    assert group.deadline_ms() == group.join_deadline_ms == ended + 10_000 + 10_000
    # Once every member has synced, the deadline goes with the last one.
    for member in (a, b):
        join(group, request(member, client="x"), ended + 10_001)
    assert group.state is GroupState.COMPLETING_REBALANCE and group.pending_sync == {a, b}
    for member in (a, b):
        group.sync(member, None, group.generation, None, None, {}, ended + 30_001)
    assert group.state is GroupState.STABLE and group.deadline_ms() == -1


def test_a_leader_that_never_syncs_is_removed_and_a_follower_leads() -> None:
    group = Group(group_id="g")
    a, b = (join(group, request(client=x, rebalance_ms=4000), 0).member_id for x in "ab")
    finish_join(group)
    assert group.leader_id == a
    deadline = group.sync_deadline_ms
    assert isinstance(group.sync(b, None, 1, None, None, {}, deadline - 1), SyncWait)
    assert group.on_deadline(deadline, CONFIG) == [a]
    assert group.state is GroupState.PREPARING_REBALANCE and group.leader_id == b
    assert group.sync(b, None, 1, None, None, {}, deadline + 1) == SyncResult(
        error_code=E.rebalance_in_progress.value)


def test_a_new_rebalance_forgets_the_pending_syncs_and_the_last_one_leaving_empties() -> None:
    group, (a, b) = stable_group("a", "b")
    assert group.pending_sync == {b}
    join(group, request(a, client="a"), 200_000)  # the leader rejoins: a new join phase
    assert group.state is GroupState.PREPARING_REBALANCE and not group.pending_sync
    finish_join(group, 400_000)
    assert group.pending_sync == {a}  # b did not rejoin and was dropped
    assert group.on_deadline(group.sync_deadline_ms, CONFIG) == [a]
    assert group.state is GroupState.EMPTY and group.deadline_ms() == -1


def test_the_join_deadline_drops_members_that_did_not_rejoin_with_nobody_waiting() -> None:
    group, (a, b) = stable_group("a", "b")
    group.sync(b, None, 1, None, None, {}, 200_000)
    assert group.leave([(b, None)], 200_001, CONFIG) == [0]
    deadline = group.deadline_ms()
    assert deadline == 200_001 + 10_000
    assert group.on_deadline(deadline - 1, CONFIG) == []
    assert group.on_deadline(deadline, CONFIG) == [a]
    assert group.state is GroupState.EMPTY and group.generation == 2


def test_a_static_member_replaced_while_its_sync_is_pending_still_owes_it() -> None:
    group = Group(group_id="g")
    join(group, request(client="a", instance="i-a"), 0)
    join(group, request(client="b", instance="i-b"), 0)
    finish_join(group)
    old = group.static_member_id("i-b")
    assert old in group.pending_sync
    join(group, request(client="b", instance="i-b"), 1)
    new = group.static_member_id("i-b")
    assert new != old and group.pending_sync == {group.leader_id, new}
