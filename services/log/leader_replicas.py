"""What a partition's leader knows of its replicas at one leader epoch (Kafka's ``Partition``
on the leader, with its remote ``Replica`` states and its ``IsrState``): each follower's log
end offset and when it was last caught up, all learnt from the follower's fetches; the ISR as
committed in the cluster metadata and as the leader asked to change it; the high watermark
over it; and the ISR changes to ask the controller for.

- Positions: a follower's fetch names its log end offset; the leader records it with its own
  log end at that moment (Kafka's ``updateFetchState``): a follower fetching at or past the
  leader's log end is caught up now; one fetching at or past the log end the leader had at its
  previous fetch was caught up then. Positions are unknown (-1) until the follower's first
  fetch at this epoch.
- High watermark: the smallest log end offset over the maximal ISR (the committed ISR and the
  followers the leader asked to add, Kafka's ``maximalIsr``), the leader's own included;
  unknown while a member's position is. It never moves back (the caller keeps the larger).
  Followers being added count before they are committed, and followers being removed until
  the removal is committed, so nothing is committed that a member of either ISR lacks.
- ISR changes (Kafka's ``maybeExpandIsr``/``maybeShrinkIsr``), one at a time: a follower out
  of the ISR joins once its log end offset reaches the high watermark and the start of the
  leader's epoch; an ISR follower not caught up for more than ``replica.lag.time.max.ms``
  leaves. The change is pending until the controller answered it (:meth:`answered`); a newer
  committed state (:meth:`update`) replaces the committed ISR but not the pending change.

Times are milliseconds of a monotonic clock. Pure domain: no I/O, not thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

NO_OFFSET = -1
NEVER = -1


@dataclass(slots=True)
class FollowerState:
    """A follower as the leader sees it (Kafka's ``ReplicaState``)."""

    log_end_offset: int = NO_OFFSET
    last_caught_up_ms: int = NEVER
    # The leader's log end offset and the time at the follower's last fetch.
    last_fetch_leader_log_end_offset: int = NO_OFFSET
    last_fetch_ms: int = NEVER


@dataclass(frozen=True, slots=True)
class IsrProposal:
    """An ISR change the leader asked for: from ``current`` to ``proposed``."""

    current: tuple[int, ...]
    proposed: tuple[int, ...]

    @property
    def adding(self) -> frozenset[int]:
        return frozenset(self.proposed) - frozenset(self.current)


class LeaderReplicas:
    """One partition's replicas, seen from its leader ``node_id`` at ``leader_epoch``."""

    def __init__(self, *, node_id: int, leader_epoch: int, replicas: Iterable[int],
                 isr: Iterable[int], partition_epoch: int, epoch_start_offset: int,
                 now_ms: int) -> None:
        self.node_id = node_id
        self.leader_epoch = leader_epoch
        self.partition_epoch = partition_epoch
        # Where this leader's epoch began in its log: a follower joins only past it.
        self.epoch_start_offset = epoch_start_offset
        self.replicas: tuple[int, ...] = tuple(replicas)
        self.isr: tuple[int, ...] = tuple(isr)
        self.pending: IsrProposal | None = None
        # An expansion the controller refused (a follower not live, or in controlled
        # shutdown) is not asked for again before this time.
        self.expand_after_ms = NEVER
        # A new leader gives its ISR followers the whole lag time from now (Kafka's
        # resetReplicaState); the others must catch up first.
        self.followers = {
            r: FollowerState(last_caught_up_ms=now_ms if r in self.isr else NEVER)
            for r in self.replicas if r != node_id
        }

    def __repr__(self) -> str:
        return (f"LeaderReplicas(epoch {self.leader_epoch}, isr {list(self.isr)}, pending "
                f"{self.pending})")

    # -- state -----------------------------------------------------------------------------

    def update(self, replicas: Iterable[int], isr: Iterable[int], partition_epoch: int,
               now_ms: int) -> None:
        """A newer committed state at the same leader epoch: its replicas (new followers
        start unknown, removed ones are forgotten) and ISR (a follower that joins starts its
        lag time now). A pending change stays pending."""
        self.partition_epoch = partition_epoch
        replicas = tuple(replicas)
        isr = tuple(isr)
        for node in replicas:
            if node != self.node_id and node not in self.followers:
                self.followers[node] = FollowerState()
        for node in [n for n in self.followers if n not in replicas]:
            del self.followers[node]
        for node in isr:
            follower = self.followers.get(node)
            if follower is not None and node not in self.isr:
                follower.last_caught_up_ms = max(follower.last_caught_up_ms, now_ms)
        self.replicas, self.isr = replicas, isr

    def maximal_isr(self) -> frozenset[int]:
        """The committed ISR and the followers a pending change adds."""
        members = frozenset(self.isr) | {self.node_id}
        return members | self.pending.adding if self.pending is not None else members

    @property
    def alone(self) -> bool:
        """Whether the leader is the whole maximal ISR (it commits its appends at once)."""
        return self.maximal_isr() == {self.node_id}

    # -- fetches ---------------------------------------------------------------------------

    def record_fetch(self, follower: int, fetch_offset: int, leader_log_end_offset: int,
                     now_ms: int) -> bool:
        """A fetch of ``follower`` at ``fetch_offset`` (its log end offset) while the leader's
        log ended at ``leader_log_end_offset``. Returns False for a node that is not a
        follower of this partition."""
        state = self.followers.get(follower)
        if state is None:
            return False
        if fetch_offset >= leader_log_end_offset:
            state.last_caught_up_ms = max(state.last_caught_up_ms, now_ms)
        elif fetch_offset >= state.last_fetch_leader_log_end_offset >= 0:
            state.last_caught_up_ms = max(state.last_caught_up_ms, state.last_fetch_ms)
        state.last_fetch_leader_log_end_offset = leader_log_end_offset
        state.last_fetch_ms = now_ms
        state.log_end_offset = fetch_offset
        return True

    def high_watermark_candidate(self, leader_log_end_offset: int) -> int:
        """The smallest log end offset over the maximal ISR; -1 while one is unknown."""
        offsets = [leader_log_end_offset]
        for node in self.maximal_isr():
            if node == self.node_id:
                continue
            follower = self.followers.get(node)
            offsets.append(NO_OFFSET if follower is None else follower.log_end_offset)
        return min(offsets)

    # -- ISR changes -----------------------------------------------------------------------

    def expansion(self, high_watermark: int, now_ms: int = 0,
                  fetching: int | None = None) -> tuple[int, ...] | None:
        """The ISR with the followers that may join it now (caught up to the high watermark
        and past the start of this epoch), None when none may, a change is pending, or one was
        refused a short while ago (see :meth:`answered`). With ``fetching``, only that
        follower, whose fetch is being served, may join (Kafka's expansion on a follower's
        fetch): a follower that stopped fetching (it exited, or is shutting down) is not
        asked for on its last position, where the controller would refuse the whole change
        and hold back the followers that are fetching."""
        if self.pending is not None or high_watermark < 0 or now_ms < self.expand_after_ms:
            return None
        joining = {node for node, f in self.followers.items()
                   if node not in self.isr and f.log_end_offset >= high_watermark
                   and f.log_end_offset >= self.epoch_start_offset
                   and (fetching is None or node == fetching)}
        if not joining:
            return None
        return tuple(r for r in self.replicas if r in self.isr or r in joining or
                     r == self.node_id)

    def out_of_sync(self, now_ms: int, lag_ms: int) -> tuple[int, ...]:
        """ISR followers not caught up for more than ``lag_ms``."""
        return tuple(node for node in self.isr if node in self.followers
                     and now_ms - self.followers[node].last_caught_up_ms > lag_ms)

    def shrink(self, now_ms: int, lag_ms: int) -> tuple[int, ...] | None:
        """The ISR without its followers out of sync, None when all are in sync or a change
        is pending."""
        if self.pending is not None:
            return None
        leaving = set(self.out_of_sync(now_ms, lag_ms))
        if not leaving:
            return None
        return tuple(r for r in self.isr if r not in leaving)

    def propose(self, proposed: Iterable[int]) -> IsrProposal:
        """Ask for ``proposed`` as the ISR: pending until answered."""
        self.pending = IsrProposal(current=self.isr, proposed=tuple(proposed))
        return self.pending

    def answered(self, isr: Iterable[int] | None = None, now_ms: int = 0,
                 retry_ms: int = 0) -> None:
        """The controller decided the pending change, leaving the partition with ``isr``
        (its state follows): an expansion it did not apply is not asked for again for
        ``retry_ms``."""
        pending, self.pending = self.pending, None
        if pending is not None and isr is not None and pending.adding - set(isr):
            self.expand_after_ms = now_ms + retry_ms

    # -- metrics ---------------------------------------------------------------------------

    def follower_lag(self, follower: int, leader_log_end_offset: int,
                     now_ms: int) -> tuple[int, float]:
        """(messages behind the leader's log end, seconds since last caught up); -1 each
        while unknown."""
        state = self.followers[follower]
        messages = NO_OFFSET
        if state.log_end_offset >= 0:
            messages = max(leader_log_end_offset - state.log_end_offset, 0)
        seconds = -1.0
        if state.last_caught_up_ms != NEVER:
            seconds = max(now_ms - state.last_caught_up_ms, 0) / 1000
        return messages, seconds
