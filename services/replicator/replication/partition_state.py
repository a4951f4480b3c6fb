"""One partition's replication as the replicator tracks it (the follower bookkeeping Kafka's
leader keeps in ``Partition`` and ``Replica``): the leader and its epoch, the ISR, every
follower's log end offset and the last time it was caught up, and the high watermark.

Rules (Kafka's, with the replicator in the leader's place):

- The high watermark is the smallest log end offset over the ISR (the leader's included); it
  only moves forward, and it is unknown (not moved) while any ISR member's offset is unknown.
- A follower is caught up when a copy left it at or past the leader's log end offset as of the
  read that produced the copy; ``last_caught_up_ms`` records when.
- A follower in the ISR that was not caught up for longer than ``replica.lag.time.max.ms``
  leaves it (the leader never does). A follower out of the ISR joins it once it was caught up
  recently and holds everything up to the high watermark. Joining a leader that is alone in
  the ISR takes two steps, because such a leader commits its appends itself: the follower is
  first ``expanding`` (counted for the high watermark, Kafka's "maximal ISR", while the leader
  is told it is no longer alone), and joins once the leader confirmed; so nothing gets
  committed that the follower lacks.
- When a partition gets a new leader or epoch, its state starts over: ISR followers get the
  whole lag time from that moment, the others must catch up first.

Times are milliseconds of a monotonic clock. Not thread-safe; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..log_nodes import NO_OFFSET, TopicPartition
from ..metadata import NodeId

NEVER = -1


@dataclass(slots=True)
class FollowerProgress:
    """What the replicator knows of one follower replica."""

    # Unknown (-1) until the follower was described or appended to.
    log_end_offset: int = NO_OFFSET
    # The high watermark the follower last reported.
    high_watermark: int = NO_OFFSET
    last_caught_up_ms: int = NEVER
    # The leader's log end offset when the follower was last copied to.
    leader_log_end_offset: int = NO_OFFSET
    # Its log was checked against the leader's at this epoch (and cut where it parted from
    # it): only then may it be copied to.
    verified: bool = False
    # Its log ends below the leader's log start: it starts over empty at this offset.
    start_over_at: int = NO_OFFSET


class PartitionReplication:
    """The replication state of one partition at one leader epoch."""

    def __init__(
        self,
        *,
        topic: str,
        partition: int,
        leader: NodeId,
        leader_epoch: int,
        replicas: Iterable[NodeId],
        isr: Iterable[NodeId],
        now_ms: int,
        high_watermark: int = NO_OFFSET,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.leader = leader
        self.leader_epoch = leader_epoch
        self.replicas = tuple(replicas)
        self.isr = tuple(isr)
        self.high_watermark = high_watermark
        self.leader_log_end_offset = NO_OFFSET
        # Followers about to join the ISR: the high watermark already waits for them.
        self.expanding: set[NodeId] = set()
        self.followers = {
            r: FollowerProgress(last_caught_up_ms=now_ms if r in self.isr else NEVER)
            for r in self.replicas if r != leader
        }

    @property
    def key(self) -> TopicPartition:
        return (self.topic, self.partition)

    def __repr__(self) -> str:
        return (f"PartitionReplication({self.topic}-{self.partition}, leader {self.leader} "
                f"epoch {self.leader_epoch}, isr {list(self.isr)}, hw {self.high_watermark})")

    def update_isr(self, isr: Iterable[NodeId], now_ms: int) -> None:
        """Take the ISR the metadata now has (same leader and epoch). A follower that joins
        starts its lag time now."""
        isr = tuple(isr)
        for node in isr:
            progress = self.followers.get(node)
            if progress is not None and node not in self.isr:
                progress.last_caught_up_ms = max(progress.last_caught_up_ms, now_ms)
        self.isr = isr
        self.expanding -= set(isr)

    def record_leader(self, log_end_offset: int, high_watermark: int) -> None:
        """Offsets the leader reported (a read answer)."""
        self.leader_log_end_offset = max(self.leader_log_end_offset, log_end_offset)
        self.high_watermark = max(self.high_watermark, high_watermark)

    def record_follower(
        self, follower: NodeId, log_end_offset: int, leader_log_end_offset: int, now_ms: int,
        high_watermark: int = NO_OFFSET,
    ) -> None:
        """The follower's log end offset after a copy made from a read that saw the leader's
        log end at ``leader_log_end_offset``."""
        progress = self.followers[follower]
        progress.log_end_offset = log_end_offset
        progress.leader_log_end_offset = leader_log_end_offset
        if high_watermark >= 0:
            progress.high_watermark = high_watermark
        if log_end_offset >= leader_log_end_offset >= 0:
            progress.last_caught_up_ms = now_ms

    def forget_follower(self, follower: NodeId) -> None:
        """The follower's offsets are unknown again (it restarted, or its log parted from
        the leader's): it is checked against the leader's log before the next copy."""
        progress = self.followers[follower]
        progress.log_end_offset = NO_OFFSET
        progress.high_watermark = NO_OFFSET
        progress.verified = False

    def high_watermark_candidate(self) -> int:
        """The smallest log end offset over the ISR and the followers expanding it, -1 while
        one of them is unknown."""
        members = [*self.isr, *(n for n in self.expanding if n not in self.isr)]
        offsets = [self.leader_log_end_offset if node == self.leader
                   else self.followers[node].log_end_offset
                   for node in members if node == self.leader or node in self.followers]
        if not offsets or min(offsets) < 0:
            return NO_OFFSET
        return min(offsets)

    def advance_high_watermark(self) -> bool:
        """Move the high watermark up to the candidate; returns whether it moved."""
        candidate = self.high_watermark_candidate()
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            return True
        return False

    def lagging_in_sync(self, now_ms: int, lag_ms: int) -> tuple[NodeId, ...]:
        """ISR followers not caught up for more than ``lag_ms``: to be removed."""
        return tuple(
            node for node in self.isr
            if node in self.followers
            and now_ms - self.followers[node].last_caught_up_ms > lag_ms
        )

    def caught_up_out_of_sync(self, now_ms: int, lag_ms: int) -> tuple[NodeId, ...]:
        """Followers out of the ISR that may join it: caught up within ``lag_ms`` and holding
        everything up to the high watermark."""
        if self.high_watermark < 0:
            return ()
        return tuple(
            node for node, progress in self.followers.items()
            if node not in self.isr
            and progress.last_caught_up_ms != NEVER
            and now_ms - progress.last_caught_up_ms <= lag_ms
            and progress.log_end_offset >= self.high_watermark
        )

    def follower_lag(self, follower: NodeId, now_ms: int) -> tuple[int, float]:
        """(messages behind the leader's log end, seconds since last caught up); the
        messages are -1 while either offset is unknown, the seconds -1 if never caught up."""
        progress = self.followers[follower]
        messages = NO_OFFSET
        if progress.log_end_offset >= 0 and self.leader_log_end_offset >= 0:
            messages = max(self.leader_log_end_offset - progress.log_end_offset, 0)
        seconds = -1.0
        if progress.last_caught_up_ms != NEVER:
            seconds = max(now_ms - progress.last_caught_up_ms, 0) / 1000
        return messages, seconds
