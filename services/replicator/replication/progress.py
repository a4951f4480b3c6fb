"""Telling the purgatory that a partition's high watermark moved, straight from the replicator
(as well as through the leader, whose log node reports its own high watermark): the acks=all
produces waiting on it complete one process hop sooner.

Each move is reported on the partition's key (``<topic>-<partition>``, which long-poll fetches
wait on) and on its key at the leader epoch (``<topic>-<partition>@<epoch>``, which acks=all
produces wait on, so that a later leader never completes what an earlier one appended); when a
partition gets a new leader, the old epoch's key is failed with NOT_LEADER_OR_FOLLOWER, so its
waiting produces answer at once and the clients retry with the new leader. The purgatory keeps
the last report of a key, from whoever made it; the leader's report of the same high
watermark follows shortly after, so a stale report from either side is overtaken at once.

Reports go on a :class:`~services.common.progress_reports.ProgressStream` (coalescing, only
watched keys, fire and forget). The replicator gives it no position source: the
leader's log node answers each newly watched key.
"""

from __future__ import annotations

from services.common.errors import ErrorCode
from services.common.progress_reports import ProgressStream, epoch_key, partition_key


class ProgressReporter(ProgressStream):
    """Coalescing, fire-and-forget high watermark reports; create inside the event loop."""

    def report_high_watermark(self, topic: str, partition: int, leader_epoch: int,
                              high_watermark: int) -> None:
        self.report(partition_key(topic, partition), high_watermark)
        self.report(epoch_key(topic, partition, leader_epoch), high_watermark)

    def leader_changed(self, topic: str, partition: int, old_epoch: int,
                       high_watermark: int) -> None:
        """Fail what waits on ``old_epoch``'s key: that leader no longer leads."""
        self.report(epoch_key(topic, partition, old_epoch), high_watermark,
                    ErrorCode.not_leader_or_follower.value)
