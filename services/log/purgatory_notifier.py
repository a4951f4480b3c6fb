"""Tells the purgatory when a partition's high watermark moves on this log node, so that
parked operations watching the partition (DelayedProduce, DelayedFetch) complete without
waiting for their timeout. An append never waits for, or fails because of, the purgatory: the
reports go on a :class:`~services.common.progress_reports.ProgressStream` (coalescing, only
watched keys, fire and forget).
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.channels import PLAINTEXT
from services.common.errors import ErrorCode
from services.common.progress_reports import ProgressStream, epoch_key, partition_key
from services.common.tls import InternalTls

from .metrics import PURGATORY_NOTIFICATIONS


class PurgatoryNotifier(ProgressStream):
    """A log node's progress reports; create inside the event loop. Set :attr:`position_of`
    once the replicas are loaded, so newly watched keys are answered."""

    def __init__(self, address: str, tls: InternalTls = PLAINTEXT) -> None:
        super().__init__(address,
                         on_outcome=lambda outcome: PURGATORY_NOTIFICATIONS.labels(outcome).inc(),
                         tls=tls)

    def on_high_watermark(self, topic: str, partition: int, high_watermark: int,
                          leader_epoch: int = -1, topic_id: str = "",
                          isr: Sequence[int] = ()) -> None:
        """A partition log's high watermark listener. Besides the partition's key, a leader at
        an epoch reports its epoch key, with its ISR at that moment: acks=all produces wait on
        that one, and min.insync.replicas is checked against that ISR."""
        self.report(partition_key(topic, partition), high_watermark)
        if leader_epoch >= 0:
            self.report(epoch_key(topic, partition, leader_epoch, topic_id), high_watermark,
                        isr=isr)

    def on_epoch_ended(self, topic: str, partition: int, leader_epoch: int,
                       high_watermark: int, topic_id: str) -> None:
        """This node stopped leading the partition at ``leader_epoch``: what waits on that
        epoch's key, now or later, fails (NOT_LEADER_OR_FOLLOWER); what the high watermark
        covered completed already."""
        self.report(epoch_key(topic, partition, leader_epoch, topic_id), high_watermark,
                    ErrorCode.not_leader_or_follower.value)
