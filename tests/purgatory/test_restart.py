"""The purgatory restarting while handlers wait in it: a parked fetch answers before its max
wait (never hangs), and waiting works again with the new purgatory. Real services on 127.0.0.1
(log node, replicator, handler from the handler tests' harness; the purgatory restarted on the
same address)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from kbroker.purgatory.v1 import purgatory_pb2 as pb
from kbroker.purgatory.v1 import purgatory_pb2_grpc
from services.common.channels import insecure_channel
from services.purgatory import server as purgatory_server
from services.purgatory.config import PurgatoryConfig
from tests.handler.batches import batch_offsets, record_batch
from tests.handler.harness import running_cluster

# Errors a consumer retries on its own (or none: an empty answer, fetched again).
RETRIABLE_OR_NONE = {0, 6, 7}  # NONE, NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT


async def until_parked(address: str, count: int = 1, within: float = 5.0) -> None:
    channel = insecure_channel(address)
    try:
        stub = purgatory_pb2_grpc.PurgatoryStub(channel)
        deadline = time.monotonic() + within
        while True:
            described = await stub.Describe(pb.DescribeRequest(), timeout=within)
            if described.pending_by_kind["fetch"] >= count:
                return
            assert time.monotonic() < deadline, "the fetch never parked in the purgatory"
            await asyncio.sleep(0.01)
    finally:
        await channel.close()


def test_a_fetch_parked_in_a_restarting_purgatory_answers_before_its_max_wait(tmp_path: Path):
    async def main() -> None:
        async with running_cluster(tmp_path) as cluster:
            await cluster.create_topic("idle")
            address = f"127.0.0.1:{cluster.purgatory.port}"
            max_wait = 5.0
            fetches = [asyncio.create_task(cluster.fetch(
                "idle", 0, 0, max_wait_ms=int(max_wait * 1000), min_bytes=1)) for _ in range(20)]
            replacement = None
            try:
                await until_parked(address, count=len(fetches))
                begin = time.monotonic()
                await cluster.purgatory.stop(0)
                replacement = await purgatory_server.start(PurgatoryConfig(grpc_address=address))
                answers = await asyncio.wait_for(asyncio.gather(*fetches), max_wait)
                answered_in = time.monotonic() - begin
                # Long before the 5 s max wait: the restart answered them, not the deadline.
                assert answered_in < 1.0, answered_in
                for answer in answers:
                    assert answer.error_code == 0
                    (partition,) = answer.responses[0].partitions
                    assert partition.error_code in RETRIABLE_OR_NONE
                    assert partition.records == b""

                # The handler parks in the new purgatory: an idle fetch waits out its max wait...
                started = time.monotonic()
                response = await cluster.fetch("idle", 0, 0, max_wait_ms=300, min_bytes=1)
                assert 0.29 <= time.monotonic() - started < 1.5
                assert response.responses[0].partitions[0].error_code == 0
                # ...and a parked one answers once the log node reports the append.
                fetching = asyncio.create_task(
                    cluster.fetch("idle", 0, 0, max_wait_ms=10_000, min_bytes=1))
                await until_parked(address)
                produced_at = time.monotonic()
                produced = await cluster.produce("idle", 0, record_batch([b"after restart"]))
                assert produced.error_code == 0
                response = await asyncio.wait_for(fetching, 10)
                (partition,) = response.responses[0].partitions
                assert batch_offsets(partition.records) == [(0, 1)]
                assert time.monotonic() - produced_at < 1.0
            finally:
                for task in fetches:
                    task.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.gather(*fetches, return_exceptions=True)
                if replacement is not None:
                    await replacement.stop(0)

    asyncio.run(main())
