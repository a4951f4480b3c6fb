"""The consumer group protocol's pure parts: the uniform and range assignors (property tests:
every partition of a subscribed topic goes to exactly one subscriber, counts even out as far
as subscriptions allow, the uniform assignor keeps what it can), reconciliation (revoke before
another member gets a partition), heartbeats through joins, revocations and static members,
and the records of a group replayed back to it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.handler.coordinator.schema import decode_key
from services.handler.coordinator_records import OFFSETS_KEYS
from services.handler.groups.assignors import MemberSpec, range_, uniform
from services.handler.groups.classic_members import classic_join
from services.handler.groups.consumer_group import (
    MemberState,
    SubscribedTopic,
    records_between,
    replay,
)
from services.handler.groups.consumer_heartbeat import (
    FENCED_MEMBER_EPOCH,
    INVALID_REGULAR_EXPRESSION,
    UNRELEASED_INSTANCE_ID,
    ConsumerGroupConfig,
    GroupError,
    HeartbeatRequest,
    TopicImage,
    heartbeat,
)
from services.handler.groups.consumer_protocol import Subscription, write_subscription
from services.handler.groups.group import GroupState
from services.handler.groups.offsets import (
    STALE_MEMBER_EPOCH,
    UNKNOWN_MEMBER_ID,
    UNSUPPORTED_VERSION,
    validate_consumer_commit,
)

TOPICS = ["a", "b", "c"]


@st.composite
def groups(draw):  # type: ignore[no-untyped-def]
    partitions = {t: draw(st.integers(0, 12)) for t in TOPICS}
    count = draw(st.integers(1, 6))
    same = draw(st.booleans())
    members = []
    for i in range(count):
        topics = frozenset(TOPICS[:2]) if same else frozenset(
            draw(st.sets(st.sampled_from(TOPICS), min_size=1)))
        current = {t: frozenset(draw(st.sets(st.integers(0, 14), max_size=4))) for t in topics}
        members.append(MemberSpec(member_id=f"m{i}", topics=topics, current=current))
    return members, partitions


def _check_complete(members, partitions, result) -> None:  # type: ignore[no-untyped-def]
    owners: dict[tuple[str, int], str] = {}
    for member in members:
        for topic, ps in result[member.member_id].items():
            assert topic in member.topics
            for p in ps:
                assert 0 <= p < partitions[topic]
                assert (topic, p) not in owners
                owners[(topic, p)] = member.member_id
    subscribed = {t for m in members for t in m.topics}
    assert set(owners) == {(t, p) for t in subscribed for p in range(partitions[t])}


@settings(max_examples=200, deadline=None)
@given(groups())
def test_the_uniform_assignor_assigns_every_partition_once_and_evenly(group) -> None:
    members, partitions = group
    result = uniform(members, partitions)
    _check_complete(members, partitions, result)
    if len({m.topics for m in members}) == 1:
        loads = [sum(len(ps) for ps in result[m.member_id].values()) for m in members]
        assert max(loads) - min(loads) <= 1


@settings(max_examples=200, deadline=None)
@given(groups())
def test_the_range_assignor_gives_each_topics_subscribers_consecutive_ranges(group) -> None:
    members, partitions = group
    result = range_(members, partitions)
    _check_complete(members, partitions, result)
    for topic in TOPICS:
        takers = sorted((m for m in members if topic in m.topics), key=lambda m: m.member_id)
        sizes = [len(result[m.member_id].get(topic, ())) for m in takers]
        assert sizes == sorted(sizes, reverse=True)
        assert not sizes or max(sizes) - min(sizes) <= 1


def test_the_uniform_assignor_keeps_what_members_had() -> None:
    members = [MemberSpec(member_id="m0", topics=frozenset({"a"}),
                          current={"a": frozenset({0, 1, 2})}),
               MemberSpec(member_id="m1", topics=frozenset({"a"}),
                          current={"a": frozenset({3, 4, 5})}),
               MemberSpec(member_id="m2", topics=frozenset({"a"}))]
    result = uniform(members, {"a": 6})
    assert result["m0"]["a"] < {0, 1, 2} and result["m1"]["a"] < {3, 4, 5}
    assert len(result["m2"]["a"]) == 2


IMAGE = TopicImage(topics={"t": SubscribedTopic(
    topic_id="6b1c6ad4-62a2-4c3c-9a64-3e1ea9a0b9f1", partitions=4)}, version=1)
TID = "6b1c6ad4-62a2-4c3c-9a64-3e1ea9a0b9f1"
CONFIG = ConsumerGroupConfig()


def beat(group, member, epoch, owned=None, **fields):  # type: ignore[no-untyped-def]
    request = HeartbeatRequest(
        group_id="g", member_id=member, member_epoch=epoch,
        rebalance_timeout_ms=1000 if epoch == 0 else -1,
        subscribed_topic_names=("t",) if epoch == 0 and "subscribed_topic_regex" not in fields
        else None,
        owned={} if epoch == 0 else owned, **fields)
    change = heartbeat(group, None, request, IMAGE, CONFIG, 0)
    _check_records(group, change.after)
    return change.after, change.result


def _check_records(before, after) -> None:  # type: ignore[no-untyped-def]
    """The records of a change, replayed on the group before it, give the group after it."""
    groups = {} if before is None else {"g": before}
    for key, value in records_between(before, after):
        replay(groups, decode_key(OFFSETS_KEYS, key), value)
    assert groups.get("g") == after


def test_a_partition_moves_only_once_its_owner_revoked_it() -> None:
    group, first = beat(None, "m1", 0)
    assert first.member_epoch == 1 and first.assignment == {TID: frozenset(range(4))}
    group, second = beat(group, "m2", 0)
    # m2 gets nothing yet: every partition is still m1's.
    assert second.member_epoch == 2 and second.assignment == {}
    assert group.members["m2"].state is MemberState.UNRELEASED_PARTITIONS
    group, revoking = beat(group, "m1", 1, owned={TID: frozenset(range(4))})
    kept = revoking.assignment[TID]
    assert len(kept) == 2 and group.members["m1"].state is MemberState.UNREVOKED_PARTITIONS
    assert revoking.member_epoch == 1
    group, waiting = beat(group, "m2", 2, owned={})
    assert waiting.assignment is None  # still held by m1
    group, revoked = beat(group, "m1", 1, owned={TID: kept})
    assert revoked.member_epoch == 2 and group.members["m1"].state is MemberState.STABLE
    group, got = beat(group, "m2", 2, owned={})
    assert got.assignment == {TID: frozenset(range(4)) - kept}
    assert group.state.value == "Stable"


def test_epochs_out_of_step_are_fenced_and_static_members_come_back() -> None:
    group, _ = beat(None, "m1", 0, instance_id="i1")
    try:
        beat(group, "m1", 5, owned={})
        raise AssertionError("not fenced")
    except GroupError as exc:
        assert exc.code == FENCED_MEMBER_EPOCH
    try:
        beat(group, "m9", 0, instance_id="i1")
        raise AssertionError("took an instance id in use")
    except GroupError as exc:
        assert exc.code == UNRELEASED_INSTANCE_ID
    group, away = beat(group, "m1", -2, instance_id="i1")
    assert away.member_epoch == -2
    group, back = beat(group, "m9", 0, instance_id="i1")
    # The new incarnation takes the old one's place and partitions, without a new epoch.
    assert set(group.members) == {"m9"} and back.assignment == {TID: frozenset(range(4))}
    assert group.epoch == 1


def test_a_commit_with_an_older_epoch_counts_for_partitions_held_since_then() -> None:
    """KIP-1251: a heartbeat may move a member to a new epoch while its commit is under way;
    the commit still counts for the partitions the member got at or before the epoch it sent,
    and for nothing else."""
    group, _ = beat(None, "m1", 0)
    group, _ = beat(group, "m2", 0)
    group, revoking = beat(group, "m1", 1, owned={TID: frozenset(range(4))})
    kept = revoking.assignment[TID]
    gone = frozenset(range(4)) - kept
    group, revoked = beat(group, "m1", 1, owned={TID: kept})
    assert revoked.member_epoch == 2
    group, got = beat(group, "m2", 2, owned={})
    assert got.assignment == {TID: gone}

    def commit(member: str, epoch: int, partitions, **fields) -> int:  # type: ignore[no-untyped-def]
        defaults = {"instance_id": None, "transactional": False, "api_version": 9}
        return validate_consumer_commit(group, member, member_epoch=epoch,
                                        partitions=[("t", p) for p in partitions],
                                        **{**defaults, **fields})

    assert commit("m1", 2, range(4)) == 0  # its epoch: not checked per partition
    assert commit("m1", 1, kept) == 0  # held since epoch 1
    assert commit("m1", 1, gone) == STALE_MEMBER_EPOCH  # no longer its partitions
    assert commit("m1", 3, kept) == STALE_MEMBER_EPOCH  # an epoch it never had
    assert commit("m2", 1, gone) == STALE_MEMBER_EPOCH  # assigned to it at epoch 2
    assert commit("m9", 2, kept) == UNKNOWN_MEMBER_ID
    assert commit("m1", 2, kept, api_version=8) == UNSUPPORTED_VERSION
    # A TxnOffsetCommit that names no member is not checked against the members.
    assert commit("", -1, kept, transactional=True, api_version=None) == 0
    assert commit("", -1, kept, api_version=9) == UNKNOWN_MEMBER_ID
    # The epochs are in the records: a handler replaying them judges alike.
    groups: dict = {}
    for key, value in records_between(None, group):
        replay(groups, decode_key(OFFSETS_KEYS, key), value)
    assert groups["g"].members["m1"].assignment_epochs == group.members["m1"].assignment_epochs
    assert {group.members["m2"].assignment_epoch(TID, p) for p in gone} == {2}


def test_regular_expressions_are_kafkas_re2_not_pythons() -> None:
    """Kafka compiles subscriptions with RE2/J: what RE2 refuses (lookaround,
    backreferences, possessive quantifiers, atomic groups, \\Z, verbose mode) is
    INVALID_REGULAR_EXPRESSION; what RE2 has and Python's re lacks (Unicode classes, \\Q..\\E
    quoting, \\z) works."""
    for regex in ("t(?=x)", "(?!x)t", r"(t)\1", "t*+", "(?>t)", r"t\Z", "(?x) t", "t{1001}"):
        try:
            beat(None, "m1", 0, subscribed_topic_regex=regex)
            raise AssertionError(f"{regex} accepted")
        except GroupError as exc:
            assert exc.code == INVALID_REGULAR_EXPRESSION, regex
    for regex in (r"\p{Ll}", r"\Qt\E", r"t\z", "[[:lower:]]", "(?i)T"):
        group, joined = beat(None, "m1", 0, subscribed_topic_regex=regex)
        assert group.regexes[regex].topics == {"t"}, regex
    group, joined = beat(None, "m1", 0, subscribed_topic_regex="x|tt")
    assert group.regexes["x|tt"].topics == frozenset()  # whole names only


def test_a_classic_static_member_replacing_the_last_consumer_member_downgrades_the_group(
        ) -> None:
    """Kafka's downgrade on a replaced static member: when a classic member takes the instance
    id of the last member speaking the consumer protocol, the group becomes a classic group
    with every member, rebalancing."""
    subscription = write_subscription(Subscription(version=1, topics=("t",), owned={}))

    def classic_join_as(group, instance_id):  # type: ignore[no-untyped-def]
        return classic_join(
            group, member_id="", instance_id=instance_id, client_id="c", client_host="/h",
            session_timeout_ms=10_000, rebalance_timeout_ms=10_000, protocol_type="consumer",
            protocols=(("range", subscription),), require_known_member_id=True,
            image=IMAGE, config=CONFIG, now=0)

    group, _ = beat(None, "m1", 0, instance_id="i1")
    joined = classic_join_as(group, "i2")
    group = joined.after
    assert joined.classic_after is None and set(group.members) == {"m1", joined.result[1]}
    group, _ = beat(group, "m1", -2, instance_id="i1")
    replaced = classic_join_as(group, "i1")
    assert replaced.after is None
    classic = replaced.classic_after
    assert classic is not None and classic.state is GroupState.PREPARING_REBALANCE
    assert set(classic.members) == {joined.result[1], replaced.result[1]}
    assert replaced.timers.disarm == ("m1",)
