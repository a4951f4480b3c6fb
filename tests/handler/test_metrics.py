"""Remote time: the handler's account of time parked in the purgatory, returned to the frontend
as trailing metadata, unit-tested and then against real services over gRPC."""

from __future__ import annotations

import asyncio
import time

from kbroker.kafka.v1 import kafka_pb2 as k
from services.handler.metrics import REMOTE_TIME_METADATA_KEY, parked, remote_time

from .batches import record_batch
from .harness import running_cluster


class TrailerContext:
    def __init__(self) -> None:
        self.trailers: tuple[tuple[str, str], ...] | None = None

    def set_trailing_metadata(self, trailers) -> None:
        self.trailers = tuple(trailers)


def test_parked_time_adds_up_per_request_also_from_spawned_tasks():
    async def main() -> None:
        context = TrailerContext()
        with remote_time(context) as account:
            with parked():
                await asyncio.sleep(0.05)

            async def in_a_task() -> None:
                with parked():
                    await asyncio.sleep(0.05)

            # A task runs on a copy of the context: the account is shared, not copied.
            await asyncio.create_task(in_a_task())
            await asyncio.sleep(0.05)  # not parked: not remote
        assert 0.09 <= account.seconds < 0.14, account.seconds
        assert context.trailers is not None
        ((key, value),) = context.trailers
        assert key == REMOTE_TIME_METADATA_KEY
        assert float(value) == round(account.seconds * 1000, 3)

        # Nothing parked: no metadata at all; parked outside any request: counted nowhere.
        quiet = TrailerContext()
        with remote_time(quiet):
            pass
        assert quiet.trailers is None
        with parked():
            pass

    asyncio.run(asyncio.wait_for(main(), 10))


async def _remote_ms(call) -> float | None:
    await call
    for key, value in await call.trailing_metadata() or ():
        if key == REMOTE_TIME_METADATA_KEY:
            return float(value)
    return None


def test_a_long_poll_fetch_reports_its_park_as_remote_time(tmp_path):
    async def main() -> None:
        async with running_cluster(tmp_path) as cluster:
            await cluster.create_topic("idle")

            def fetch(max_wait_ms: int):
                return cluster.stub.Fetch(k.FetchRequest(
                    replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
                    session_id=0, session_epoch=-1,
                    topics=[k.FetchRequest.FetchTopic(topic="idle", partitions=[
                        k.FetchRequest.FetchPartition(partition=0, fetch_offset=0,
                                                      partition_max_bytes=1 << 20)])]),
                    timeout=15)

            started = time.monotonic()
            remote = await _remote_ms(fetch(400))
            elapsed = time.monotonic() - started
            assert remote is not None and 380 <= remote <= elapsed * 1000, (remote, elapsed)

            # No wait asked for, or data there: never parked, no remote time.
            assert await _remote_ms(fetch(0)) is None
            produced = await cluster.produce("idle", 0, record_batch([b"x"]))
            assert produced.error_code == 0
            assert await _remote_ms(fetch(400)) is None

            # acks=1 and acks=all produces are answered after the leader's append (replication
            # does not hold acks=all yet), so neither parks.
            for acks in (1, -1):
                call = cluster.stub.Produce(k.ProduceRequest(
                    acks=acks, timeout_ms=5000, topic_data=[k.ProduceRequest.TopicProduceData(
                        name="idle", partition_data=[k.ProduceRequest.PartitionProduceData(
                            index=0, records=record_batch([b"y"]))])]), timeout=15)
                assert await _remote_ms(call) is None

    asyncio.run(asyncio.wait_for(main(), 60))
