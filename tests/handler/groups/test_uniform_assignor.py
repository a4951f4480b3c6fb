"""The uniform assignor of consumer groups when subscriptions differ, against Kafka's
``UniformHeterogeneousAssignmentBuilder``: the assignments Kafka's own tests expect of it
(same topics, partition counts, members in the same order), and properties over any group
(every partition of a subscribed topic to exactly one of its subscribers, balance as far as
subscriptions allow, stickiness)."""

from __future__ import annotations

import base64
import uuid
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from services.handler.groups.assignors import (
    MemberSpec,
    homogeneous,
    uniform,
    uniform_heterogeneous,
)


def kafka_uuid(text: str) -> str:
    """A topic id written as Kafka's ``Uuid.toString`` (url-safe base64) in our form."""
    return str(uuid.UUID(bytes=base64.urlsafe_b64decode(text + "==")))


# The topic ids of Kafka's tests: their order breaks ties between topics.
T1, T2, T3, T4 = (kafka_uuid(t) for t in ("T1-A4s3VTwiI5CTbEp6POw", "T2-B4s3VTwiI5YHbPp6YUe",
                                         "T3-CU8fVTLCz5YMkLoDQsa", "T4-Tw9fVTLCz5HbPp6YQsa"))


def member(member_id: str, topics: list[str], **current: list[int]) -> MemberSpec:
    ids = {"t1": T1, "t2": T2, "t3": T3, "t4": T4}
    return MemberSpec(member_id=member_id, topics=frozenset(ids[t] for t in topics),
                      current={ids[t]: frozenset(ps) for t, ps in current.items()})


def named(result: dict) -> dict:  # type: ignore[type-arg]
    names = {T1: "t1", T2: "t2", T3: "t3", T4: "t4"}
    return {m: {names[t]: sorted(ps) for t, ps in a.items() if ps} for m, a in result.items()}


def test_first_assignment_of_two_members_two_topics() -> None:
    result = uniform_heterogeneous(
        [member("A", ["t1", "t3"]), member("B", ["t3"])], {T1: 3, T3: 6})
    assert named(result) == {"A": {"t1": [0, 1, 2], "t3": [4]}, "B": {"t3": [0, 1, 2, 3, 5]}}


def test_an_unbalanced_previous_assignment_is_balanced_keeping_what_it_can() -> None:
    result = uniform_heterogeneous([
        member("A", ["t1"], t1=[0, 1, 2]),
        member("B", ["t1", "t2"], t1=[3], t2=[0]),
        member("C", ["t1", "t2", "t3"], t1=[4, 5], t2=[1, 2, 3], t3=[0, 1, 2, 3])],
        {T1: 6, T2: 4, T3: 4})
    assert named(result) == {"A": {"t1": [0, 1, 2, 5]}, "B": {"t1": [3], "t2": [0, 1, 2, 3]},
                             "C": {"t1": [4], "t3": [0, 1, 2, 3]}}


def test_added_partitions_go_to_the_subscribers() -> None:
    result = uniform_heterogeneous([
        member("A", ["t1", "t3"], t1=[0, 1, 2, 3], t3=[0, 1]),
        member("B", ["t1", "t2", "t3", "t4"], t2=[0, 1, 2], t4=[0, 1, 2])],
        {T1: 6, T2: 5, T3: 3, T4: 3})
    assert named(result) == {"A": {"t1": [0, 1, 2, 3, 4, 5], "t3": [0, 1, 2]},
                             "B": {"t2": [0, 1, 2, 3, 4], "t4": [0, 1, 2]}}


def test_a_member_and_partitions_added() -> None:
    result = uniform_heterogeneous([
        member("A", ["t1"], t1=[0, 2], t2=[0]),
        member("B", ["t1", "t2"], t1=[1], t2=[1, 2]),
        member("C", ["t1", "t2"])], {T1: 6, T2: 7})
    assert named(result) == {"A": {"t1": [0, 2, 3, 4, 5]}, "B": {"t1": [1], "t2": [1, 2, 6]},
                             "C": {"t2": [0, 3, 4, 5]}}


def test_a_member_removed_and_a_subscription_dropped() -> None:
    result = uniform_heterogeneous([
        member("A", ["t1", "t3"], t1=[0, 1, 2], t3=[0, 1]),
        member("B", ["t2"], t2=[3, 4, 5, 6])], {T1: 3, T2: 8, T3: 3})
    assert named(result) == {"A": {"t1": [0, 1, 2], "t3": [0, 1, 2]},
                             "B": {"t2": [0, 1, 2, 3, 4, 5, 6, 7]}}
    result = uniform_heterogeneous([
        member("A", ["t1"], t1=[0, 2], t2=[1, 3]),
        member("B", ["t1", "t2"], t1=[1], t2=[0, 2, 4])], {T1: 3, T2: 5})
    assert named(result) == {"A": {"t1": [0, 1, 2]}, "B": {"t2": [0, 1, 2, 3, 4]}}


def test_ties_between_topics_are_broken_by_topic_id() -> None:
    # Same partitions per subscriber and subscribers everywhere: Kafka's topic id order
    # (signed 64-bit halves) decides which topic moves first.
    result = uniform_heterogeneous([
        member("A", ["t1", "t2", "t3"], t1=[0, 1], t2=[0, 1], t3=[0, 1]),
        member("B", ["t1", "t2", "t3"])], {T1: 2, T2: 2, T3: 2})
    assert named(result) == {"A": {"t2": [0], "t3": [0, 1]}, "B": {"t1": [0, 1], "t2": [1]}}


def test_subscriptions_decide_which_builder_runs() -> None:
    same = [MemberSpec(member_id=m, topics=frozenset({"a"}),
                       subscription=(frozenset({"a", "gone"}), None)) for m in "xy"]
    assert homogeneous(same)
    # Kafka's rule is on what members subscribe to, not on the topics that exist.
    differ = [MemberSpec(member_id="x", topics=frozenset({"a"}),
                         subscription=(frozenset({"a", "gone"}), None)),
              MemberSpec(member_id="y", topics=frozenset({"a"}),
                         subscription=(frozenset({"a"}), None))]
    assert not homogeneous(differ)
    both = [MemberSpec(member_id=m, topics=frozenset({"a"}),
                       subscription=(frozenset({"a"}), "a.*")) for m in "xy"]
    assert not homogeneous(both)


TOPICS = ["a", "b", "c", "d"]


@st.composite
def heterogeneous_groups(draw):  # type: ignore[no-untyped-def]
    """Members with differing subscriptions, holding (possibly stale or shared) partitions of
    any topic, and the topics' partition counts."""
    partitions = {t: draw(st.integers(0, 10)) for t in TOPICS}
    members = []
    for i in range(draw(st.integers(2, 7))):
        topics = frozenset(draw(st.sets(st.sampled_from(TOPICS), max_size=4)))
        current = {t: frozenset(draw(st.sets(st.integers(0, 11), max_size=4)))
                   for t in draw(st.sets(st.sampled_from(TOPICS), max_size=3))}
        members.append(MemberSpec(member_id=f"m{i}", topics=topics, current=current))
    if len({m.topics for m in members}) == 1:
        members[0] = MemberSpec(member_id="m0", topics=members[0].topics ^ {"a"},
                                current=members[0].current)
    return members, partitions


def owners(result: dict) -> dict:  # type: ignore[type-arg]
    return {(t, p): m for m, a in result.items() for t, ps in a.items() for p in ps}


@settings(max_examples=300, deadline=None)
@given(heterogeneous_groups())
def test_every_partition_goes_to_exactly_one_of_its_subscribers(group) -> None:
    members, partitions = group
    result = uniform(members, partitions)
    counts = Counter((t, p) for a in result.values() for t, ps in a.items() for p in ps)
    assert all(n == 1 for n in counts.values())
    by_id = {m.member_id: m for m in members}
    assert all(t in by_id[m].topics for (t, _), m in owners(result).items())
    subscribed = {t for m in members for t in m.topics}
    assert set(counts) == {(t, p) for t in subscribed for p in range(partitions[t])}


@settings(max_examples=300, deadline=None)
@given(heterogeneous_groups())
def test_no_partition_could_move_to_a_subscriber_with_two_fewer(group) -> None:
    """Balance as far as subscriptions allow: the owner of each partition has at most one
    partition more than any other subscriber of its topic."""
    members, partitions = group
    result = uniform(members, partitions)
    load = {m: sum(len(ps) for ps in a.values()) for m, a in result.items()}
    for (topic, _), owner in owners(result).items():
        for m in members:
            if topic in m.topics:
                assert load[owner] - load[m.member_id] <= 1, (topic, owner, m.member_id, load)


@settings(max_examples=300, deadline=None)
@given(heterogeneous_groups())
def test_a_balanced_assignment_stays_as_it_is(group) -> None:
    """Stickiness: given its own assignment back, the assignor moves nothing; and, where the
    subscribing members share one subscription, from any previous assignment a member keeps
    every partition it held of a topic it still subscribes to unless it gave some up to a
    member that had at least two fewer. (With different subscriptions, balance can force a
    member to give a partition to one that ends with more: the only members able to take the
    other topics' partitions may be those already fuller.)"""
    members, partitions = group
    first = uniform(members, partitions)
    again = uniform([MemberSpec(member_id=m.member_id, topics=m.topics,
                                current=first[m.member_id]) for m in members], partitions)
    assert again == first
    if len({m.topics for m in members if m.topics}) > 1:
        return
    load = {m: sum(len(ps) for ps in a.values()) for m, a in first.items()}
    claimed: set[tuple[str, int]] = set()
    for m in members:  # in member id order, as the assignor keeps them
        kept = {(t, p) for t, ps in m.current.items() if t in m.topics for p in ps
                if p < partitions[t] and (t, p) not in claimed}
        claimed |= kept
        lost = {tp for tp in kept if tp not in owners(first) or owners(first)[tp] != m.member_id}
        if lost:
            assert load[m.member_id] >= min(load[owners(first)[tp]] for tp in lost)
