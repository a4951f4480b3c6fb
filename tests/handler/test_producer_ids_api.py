"""InitProducerId: unit tests of the API and the handler's producer id blocks with a fake
source, then a real in-process cluster: ids from the replicator, and an idempotent producer's
retried batch answered with its original offset through the handler."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.replicator.v1 import replicator_pb2
from services.common.errors import ErrorCode
from services.handler.apis.producer_ids import InitProducerIdApi, ProducerIdBlocks
from services.handler.collaborators import OutcomeUnknownError
from services.handler.request_context import RequestContext

from ..record_batches import build_batch, values
from .harness import CALL_TIMEOUT, running_cluster

InitProducerIdRequest = k.InitProducerIdRequest
CONTEXT = RequestContext(advertised_host="localhost", advertised_port=9092)


class FakeSource:
    """Hands out blocks of ``size`` from 0 on; ``failures`` calls fail first; ``gate`` holds
    every call until set."""

    def __init__(self, size: int = 10, failures: int = 0) -> None:
        self.size = size
        self.failures = failures
        self.calls = 0
        self.next_first = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def allocate_producer_ids(self, request: replicator_pb2.AllocateProducerIdsRequest,
                                    time_limit: float,
                                    ) -> replicator_pb2.AllocateProducerIdsResponse:
        self.calls += 1
        await self.gate.wait()
        if self.failures:
            self.failures -= 1
            raise OutcomeUnknownError("replicator: UNAVAILABLE")
        block = replicator_pb2.AllocateProducerIdsResponse(producer_id_start=self.next_first,
                                                           producer_id_len=self.size)
        self.next_first += self.size
        return block


def test_ids_are_unique_and_the_next_block_is_fetched_ahead() -> None:
    async def scenario() -> None:
        source = FakeSource(size=10)
        blocks = ProducerIdBlocks(source, requester="handler-0")
        ids = [await blocks.next_id() for _ in range(9)]
        await asyncio.sleep(0)
        assert ids == list(range(9)) and source.calls == 1
        # Id 9 is the 90% mark of the first block: the next block is fetched ahead.
        ids.append(await blocks.next_id())
        await asyncio.sleep(0)
        assert source.calls == 2
        ids += [await blocks.next_id() for _ in range(10)]
        assert ids == list(range(20)) and source.calls == 2
        await blocks.close()

    asyncio.run(scenario())


def test_concurrent_requests_share_one_fetch() -> None:
    async def scenario() -> None:
        source = FakeSource(size=100)
        source.gate.clear()
        blocks = ProducerIdBlocks(source)
        waiting = [asyncio.create_task(blocks.next_id()) for _ in range(20)]
        await asyncio.sleep(0.01)
        assert source.calls == 1
        source.gate.set()
        assert sorted(await asyncio.gather(*waiting)) == list(range(20))
        await blocks.close()

    asyncio.run(scenario())


def test_no_block_is_a_retriable_error_and_a_later_request_succeeds() -> None:
    async def scenario() -> None:
        api = InitProducerIdApi(ProducerIdBlocks(FakeSource(failures=1)))
        failed = await api.handle(InitProducerIdRequest(), CONTEXT)
        assert failed.error_code == ErrorCode.coordinator_load_in_progress.value
        assert (failed.producer_id, failed.producer_epoch) == (-1, -1)
        ok = await api.handle(InitProducerIdRequest(), CONTEXT)
        assert (ok.error_code, ok.producer_id, ok.producer_epoch) == (0, 0, 0)

    asyncio.run(scenario())


@pytest.mark.parametrize(("request_", "code"), [
    # A handler without a transaction coordinator (the transactional answers are in
    # tests/handler/transactions).
    (InitProducerIdRequest(transactional_id="txn-1", transaction_timeout_ms=60_000),
     ErrorCode.coordinator_not_available),
    (InitProducerIdRequest(transactional_id=""), ErrorCode.invalid_request),
    (InitProducerIdRequest(producer_id=5), ErrorCode.invalid_request),
    (InitProducerIdRequest(producer_epoch=3), ErrorCode.invalid_request),
])
def test_requests_this_broker_cannot_grant(request_: InitProducerIdRequest,
                                           code: ErrorCode) -> None:
    source = FakeSource()
    response = asyncio.run(InitProducerIdApi(ProducerIdBlocks(source)).handle(request_, CONTEXT))
    assert response.error_code == code.value
    assert (response.producer_id, response.producer_epoch) == (-1, -1)
    assert source.calls == 0


def test_a_known_producer_reinitialising_gets_a_new_id_at_epoch_zero() -> None:
    async def scenario() -> None:
        api = InitProducerIdApi(ProducerIdBlocks(FakeSource()))
        first = await api.handle(InitProducerIdRequest(), CONTEXT)
        again = await api.handle(InitProducerIdRequest(
            producer_id=first.producer_id, producer_epoch=first.producer_epoch), CONTEXT)
        assert again.error_code == 0
        assert again.producer_id != first.producer_id and again.producer_epoch == 0

    asyncio.run(scenario())


# ------------------------------------------------------------------------- a real cluster


def _produce(topic: str, records: bytes) -> k.ProduceRequest:
    return k.ProduceRequest(acks=-1, timeout_ms=5000, topic_data=[
        k.ProduceRequest.TopicProduceData(name=topic, partition_data=[
            k.ProduceRequest.PartitionProduceData(index=0, records=records)])])


def test_idempotent_produce_through_a_real_handler(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running_cluster(tmp_path) as c:
            await c.create_topic("idem")
            ids = [await c.stub.InitProducerId(k.InitProducerIdRequest(
                transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1),
                timeout=CALL_TIMEOUT) for _ in range(3)]
            assert [(r.error_code, r.producer_epoch) for r in ids] == [(0, 0)] * 3
            assert len({r.producer_id for r in ids}) == 3
            pid = ids[0].producer_id

            def batch(sequence: int, count: int = 2, epoch: int = 0) -> bytes:
                return build_batch(values(count, tag=f"s{sequence}-"), producer_id=pid,
                                   producer_epoch=epoch, base_sequence=sequence)

            async def produce(records: bytes) -> k.ProduceResponse.PartitionProduceResponse:
                response = await c.stub.Produce(_produce("idem", records), timeout=CALL_TIMEOUT)
                return response.responses[0].partition_responses[0]

            first = await produce(batch(0))
            second = await produce(batch(2))
            retry = await produce(batch(0))
            assert (first.error_code, first.base_offset) == (0, 0)
            assert (second.error_code, second.base_offset) == (0, 2)
            assert (retry.error_code, retry.base_offset) == (0, 0)
            gap = await produce(batch(9))
            assert gap.error_code == ErrorCode.out_of_order_sequence_number.value
            bumped = await produce(batch(0, epoch=1))
            assert (bumped.error_code, bumped.base_offset) == (0, 4)
            fenced = await produce(batch(4, epoch=0))
            assert fenced.error_code == ErrorCode.invalid_producer_epoch.value
            end = await c.list_offset("idem", 0, -1)
            assert end.offset == 6

    asyncio.run(scenario())
