"""How a member's current assignment moves towards its target (Kafka's
``CurrentAssignmentBuilder``): partitions are revoked from a member before they are assigned to
another, and a member reaches the target assignment epoch only once it has given up what it
must give up.

Member states (Kafka's ``MemberState``) and moves, on each heartbeat:

    STABLE                 at the target epoch: nothing to do; behind it: compute the next step
    UNREVOKED_PARTITIONS   the member still owns partitions it must revoke; it stays at its
                           epoch until its heartbeat's owned partitions no longer include any
                           of them (an unknown owned list, a heartbeat that leaves it out,
                           counts as still owning), then moves on at epoch + 1
    UNRELEASED_PARTITIONS  at the target epoch, waiting for partitions another member still
                           holds (assigned or pending revocation); each heartbeat hands over
                           those released since

The next step (``computeNextAssignment``): keep what is both held and targeted; what is held
but not targeted is pending revocation; what is targeted, not held, and held by nobody else is
assigned now. With partitions to revoke that the member (as far as its heartbeat says) still
owns, it revokes them first (UNREVOKED_PARTITIONS, same epoch); else it moves to the target
epoch with what it can have (UNRELEASED_PARTITIONS if some targeted partition is still held
elsewhere, else STABLE). A member in an unknown state is fenced unless it owns nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from .consumer_group import ConsumerMember, MemberState, TopicAssignment, freeze

# (topic id, partition) -> the epoch of the member holding it, -1 when nobody does.
PartitionEpoch = Callable[[str, int], int]


class FencedMemberEpochError(Exception):
    """The member must give up all its partitions and rejoin (FENCED_MEMBER_EPOCH)."""


def _owns_any(owned: TopicAssignment | None, partitions: TopicAssignment) -> bool:
    """Whether the member's reported partitions include any of ``partitions`` (an unknown
    report counts as yes)."""
    if owned is None:
        return True
    return any(partitions.get(topic, frozenset()) & ps for topic, ps in owned.items())


def reconcile(member: ConsumerMember, target_epoch: int, target: TopicAssignment,
              partition_epoch: PartitionEpoch,
              owned: Mapping[str, frozenset[int]] | None) -> ConsumerMember:
    """The member after one reconciliation step towards ``target`` at ``target_epoch``;
    ``owned`` is what its heartbeat reports owning (None: not reported). Raises
    :class:`FencedMemberEpochError` for a member in an unknown state that still owns partitions.
    What the member keeps keeps its assignment epoch; what it gets was assigned at the target
    epoch (KIP-1251)."""
    after = _step(member, target_epoch, target, partition_epoch, owned)
    return member if after is member else after.with_epochs(member, target_epoch)


def _step(member: ConsumerMember, target_epoch: int, target: TopicAssignment,
          partition_epoch: PartitionEpoch,
          owned: Mapping[str, frozenset[int]] | None) -> ConsumerMember:
    state = member.state
    if state is MemberState.STABLE:
        if member.member_epoch != target_epoch:
            return _next(member, member.member_epoch, target_epoch, target, partition_epoch, owned)
        return member
    if state is MemberState.UNREVOKED_PARTITIONS:
        if _owns_any(owned, member.pending_revocation):
            return member
        return _next(member, member.member_epoch + 1, target_epoch, target, partition_epoch,
                     owned)
    if state is MemberState.UNRELEASED_PARTITIONS:
        return _next(member, member.member_epoch, target_epoch, target, partition_epoch, owned)
    if owned is None or any(owned.values()):
        raise FencedMemberEpochError("the member is in an unknown state")
    return _next(member, target_epoch, target_epoch, target, partition_epoch, owned)


def _with_epoch(member: ConsumerMember, epoch: int) -> ConsumerMember:
    """Kafka's ``updateMemberEpoch``: the previous epoch is the one it had."""
    return replace(member, member_epoch=epoch, previous_member_epoch=member.member_epoch)


def _next(member: ConsumerMember, epoch: int, target_epoch: int, target: TopicAssignment,
          partition_epoch: PartitionEpoch,
          owned: Mapping[str, frozenset[int]] | None) -> ConsumerMember:
    held = member.assigned
    assigned: dict[str, set[int]] = {}
    revoking: dict[str, set[int]] = {}
    pending: dict[str, set[int]] = {}
    unreleased = False
    for topic in set(target) | set(held):
        wanted = target.get(topic, frozenset())
        current = held.get(topic, frozenset())
        keep = current & wanted
        assigned[topic] = set(keep)
        revoking[topic] = set(current - keep)
        free = set()
        for p in wanted - keep:
            if partition_epoch(topic, p) != -1:
                unreleased = True
            else:
                free.add(p)
        pending[topic] = free
    new_assigned, new_revoking, new_pending = freeze(assigned), freeze(revoking), freeze(pending)
    if new_revoking and _owns_any(owned, new_revoking):
        return replace(_with_epoch(member, epoch), state=MemberState.UNREVOKED_PARTITIONS,
                       assigned=new_assigned, pending_revocation=new_revoking)
    if new_pending:
        merged = {t: new_assigned.get(t, frozenset()) | new_pending.get(t, frozenset())
                  for t in set(new_assigned) | set(new_pending)}
        state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
        return replace(_with_epoch(member, target_epoch), state=state, assigned=freeze(merged),
                       pending_revocation={})
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    return replace(_with_epoch(member, target_epoch), state=state, assigned=new_assigned,
                   pending_revocation={})
