"""Telling the purgatory that a partition's leader epoch ended: acks=all produces wait on the
partition's key at the epoch of their append (``<topic>-<partition>@<epoch>@<topic id>``), which
only that leader's high watermark reports complete; when the partition gets a new leader epoch,
the old key is failed with NOT_LEADER_OR_FOLLOWER, so its waiting produces (and any parked on
it later) answer at once and the clients retry with the new leader. (A leader that is alive
when it steps down reports its epoch's end too, with its last high watermark, see
:mod:`services.log.replica_manager`.)

Reports go on a :class:`~services.common.progress_reports.ProgressStream` (coalescing, only
watched keys, fire and forget). The replicator gives it no position source: the leader's log
node answers each newly watched key.
"""

from __future__ import annotations

from services.common.errors import ErrorCode
from services.common.progress_reports import UNKNOWN_POSITION, ProgressStream, epoch_key


class ProgressReporter(ProgressStream):
    """Coalescing, fire-and-forget reports; create inside the event loop."""

    def leader_changed(self, topic: str, partition: int, old_epoch: int, topic_id: str) -> None:
        """Fail what waits on ``old_epoch``'s key, now or later: that epoch has ended. Its
        position is unknown here (the purgatory keeps the leader's last report of it)."""
        self.report(epoch_key(topic, partition, old_epoch, topic_id), UNKNOWN_POSITION,
                    ErrorCode.not_leader_or_follower.value)
