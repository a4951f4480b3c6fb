"""acks=all while the replicator is down and across its restart (real log nodes, purgatory
and replicator): followers keep fetching from their leaders and leaders keep moving their high
watermarks, so acks=all waits complete with no replicator at all, and only once every replica
holds the records; the restarted replicator finds leaders, epochs and ISRs as they were."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kbroker.purgatory.v1 import purgatory_pb2
from services.common.progress_reports import epoch_key

from ...record_batches import build_batch, values
from .harness import Replication, replication, wait_for


def test_acks_all_waits_complete_without_a_replicator_and_after_its_restart(
        tmp_path: Path) -> None:
    async def scenario(r: Replication) -> None:
        await r.create_topic("waits", partitions=2, replication=3)
        before = [await r.partition("waits", p) for p in (0, 1)]
        leaders = [r.node(meta.leader) for meta in before]
        for partition, leader in enumerate(leaders):
            first = await leader.append("waits", build_batch(values(3)), partition)
            answer = await r.await_produce(epoch_key("waits", partition, first.leader_epoch,
                                                     first.topic_id),
                                           first.log_end_offset, 10_000)
            assert answer.outcome == purgatory_pb2.OUTCOME_COMPLETED

        await r.stop_replicator()
        for _ in range(3):
            appended = [await leader.append("waits", build_batch(values(2)), partition)
                        for partition, leader in enumerate(leaders)]
            for result in appended:
                assert result.error_code == 0 and result.high_watermark < result.log_end_offset
            answers = await asyncio.gather(*(
                r.await_produce(epoch_key("waits", p, result.leader_epoch, result.topic_id),
                                result.log_end_offset, 10_000)
                for p, result in enumerate(appended)))
            assert [a.outcome for a in answers] == [purgatory_pb2.OUTCOME_COMPLETED] * 2
            for partition, result in enumerate(appended):
                # Committed means every in-sync replica holds it.
                for node in before[partition].replicas:
                    described = await r.node(node).describe("waits", partition)
                    assert described.log_end_offset >= result.log_end_offset

        await r.start_replicator()
        later = [await leader.append("waits", build_batch(values(2)), partition)
                 for partition, leader in enumerate(leaders)]
        answers = await asyncio.gather(*(
            r.await_produce(epoch_key("waits", p, result.leader_epoch, result.topic_id),
                            result.log_end_offset, 10_000)
            for p, result in enumerate(later)))
        assert [a.outcome for a in answers] == [purgatory_pb2.OUTCOME_COMPLETED] * 2
        after = [await r.partition("waits", p) for p in (0, 1)]
        for old, new in zip(before, after, strict=True):
            assert (new.leader, new.leader_epoch, sorted(new.isr)) == (
                old.leader, old.leader_epoch, sorted(old.isr))

        async def committed() -> bool:
            marks = [(await leader.describe("waits", p)).high_watermark
                     for p, leader in enumerate(leaders)]
            return marks == [result.log_end_offset for result in later]

        await wait_for(committed)

    async def main() -> None:
        async with replication(tmp_path) as r:
            await scenario(r)

    asyncio.run(asyncio.wait_for(main(), 60))
