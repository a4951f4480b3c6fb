"""A replicator restart with acks=all produces waiting in the purgatory (real log nodes,
purgatory and replicator): leaders, epochs and ISRs carry on as they were, the high watermark
takes up where it was, and every wait completes once the restarted replicator commits the
append, or expires at its own timeout (which handlers answer REQUEST_TIMED_OUT, retriable)
while there is none; nothing is completed for records a follower lacks."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kbroker.purgatory.v1 import purgatory_pb2

from ...record_batches import build_batch, values
from .harness import Replication, replication, wait_for


def test_acks_all_waits_complete_after_a_replicator_restart(tmp_path: Path) -> None:
    async def scenario(r: Replication) -> None:
        await r.create_topic("waits", partitions=2, replication=3)
        before = [await r.partition("waits", p) for p in (0, 1)]
        leaders = [r.node(meta.leader) for meta in before]
        for partition, leader in enumerate(leaders):
            first = await leader.append("waits", build_batch(values(3)), partition)
            answer = await r.await_produce(f"waits-{partition}@{first.leader_epoch}",
                                           first.log_end_offset, 10_000)
            assert answer.outcome == purgatory_pb2.OUTCOME_COMPLETED

        await r.stop_replicator()
        appended = [await leader.append("waits", build_batch(values(2)), partition)
                    for partition, leader in enumerate(leaders)]
        for result in appended:
            assert result.error_code == 0 and result.high_watermark < result.log_end_offset
        waits = [asyncio.ensure_future(r.await_produce(
            f"waits-{p}@{result.leader_epoch}", result.log_end_offset, 20_000))
            for p, result in enumerate(appended)]
        # Nobody commits while the replicator is down: a short wait runs out.
        short = await r.await_produce(f"waits-0@{appended[0].leader_epoch}",
                                      appended[0].log_end_offset, 300)
        assert short.outcome == purgatory_pb2.OUTCOME_EXPIRED
        assert not any(w.done() for w in waits)

        await r.start_replicator()
        answers = await asyncio.gather(*waits)
        assert [a.outcome for a in answers] == [purgatory_pb2.OUTCOME_COMPLETED] * 2
        after = [await r.partition("waits", p) for p in (0, 1)]
        for old, new in zip(before, after, strict=True):
            assert (new.leader, new.leader_epoch, sorted(new.isr)) == (
                old.leader, old.leader_epoch, sorted(old.isr))
        for partition, result in enumerate(appended):
            # Committed means every replica holds it.
            for node in after[partition].replicas:
                described = await r.node(node).describe("waits", partition)
                assert described.log_end_offset >= result.log_end_offset

        async def committed() -> bool:
            marks = [(await leader.describe("waits", p)).high_watermark
                     for p, leader in enumerate(leaders)]
            return marks == [result.log_end_offset for result in appended]

        await wait_for(committed)

    async def main() -> None:
        async with replication(tmp_path) as r:
            await scenario(r)

    asyncio.run(asyncio.wait_for(main(), 60))
