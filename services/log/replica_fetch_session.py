"""A follower's fetch session as its leader keeps it (KIP-227's incremental fetch sessions, Kafka's
``FetchSession`` with its ``CachedPartition`` entries), one per ``ReplicaFetch`` stream.

The session holds the partitions the follower fetches on the stream, each with the fetch the
follower last named for it (fetch offset, leader epoch, byte limit) and the high watermark and
log start offset last answered for it (none after an error, or when the follower names another
leader epoch). A request that is not incremental replaces them all; an incremental one adds or
changes the partitions it names and drops those it lists as forgotten, and every partition of
the session is fetched. The answer to an incremental request leaves out the partitions with
nothing new for the follower: no batches, no error, and the high watermark and log start offset
it was last given. A follower following many partitions, few of them written, so sends and
reads a few small entries per round instead of one per partition. The leader, for its part,
looks at a quiet partition (the follower at its log end and told all there is) only when its
log changed since, or once in a while (its follower's position is then recorded again, so the
follower stays caught up in the leader's eyes).

The stream is the session: it begins with the stream (the follower's first request on it is
not incremental) and ends with it; a follower whose stream broke starts a new one with a full
request. Pure domain: no I/O, not thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kbroker.log.v1 import log_pb2

if TYPE_CHECKING:
    from .partition_log import PartitionLog

NO_OFFSET = -1
TopicPartition = tuple[str, int]


@dataclass(slots=True)
class CachedPartition:
    """One partition of a session: the follower's fetch (its key, leader epoch and offset
    copied out of the message, read on every round) and what it was last answered."""

    fetch: log_pb2.ReplicaFetchPartition
    key: TopicPartition
    leader_epoch: int
    fetch_offset: int
    answered: bool = False
    high_watermark: int = NO_OFFSET
    log_start_offset: int = NO_OFFSET
    # Quiet: the follower holds the log's end and was told all there is, when the log had
    # counted ``changes`` changes (see PartitionLog.changes); it stays quiet while the log
    # counts no more and the follower names nothing new.
    quiet_log: PartitionLog | None = None
    changes: int = 0

    def has_news(self, result: log_pb2.ReplicaFetchResult, records: bytes) -> bool:
        """Whether ``result`` tells the follower something its last answer did not."""
        return (not self.answered or bool(records) or result.error_code != 0
                or result.HasField("file_records")
                or result.high_watermark != self.high_watermark
                or result.log_start_offset != self.log_start_offset)


class ReplicaFetchSession:
    """The partitions one follower fetches on one stream."""

    def __init__(self) -> None:
        self.partitions: dict[TopicPartition, CachedPartition] = {}
        # Monotonic seconds after which the next fetch looks at quiet partitions again.
        self.look_again_at = 0.0

    def update(self, request: log_pb2.ReplicaFetchRequest) -> list[CachedPartition]:
        """Take ``request`` into the session; every partition to fetch now, in session
        order."""
        partitions = self.partitions
        if not request.incremental:
            partitions.clear()
        for gone in request.forgotten:
            partitions.pop((gone.topic, gone.partition), None)
        for fetch in request.partitions:
            key = (fetch.topic, fetch.partition)
            cached = partitions.get(key)
            if cached is None:
                partitions[key] = CachedPartition(fetch, key, fetch.leader_epoch,
                                                  fetch.fetch_offset)
            else:
                if fetch.leader_epoch != cached.leader_epoch:
                    cached.answered = False  # at another epoch: answered afresh
                cached.quiet_log = None
                cached.fetch = fetch
                cached.leader_epoch = fetch.leader_epoch
                cached.fetch_offset = fetch.fetch_offset
        return list(partitions.values())

    def answered(self, results: Iterable[log_pb2.ReplicaFetchResult]) -> None:
        """The follower is given ``results``: what it now knows of their partitions."""
        for result in results:
            cached = self.partitions.get((result.topic, result.partition))
            if cached is not None:
                # After an error, the next answer gives the partition whatever it holds.
                cached.answered = result.error_code == 0
                cached.high_watermark = result.high_watermark
                cached.log_start_offset = result.log_start_offset
