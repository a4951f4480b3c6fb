"""InitProducerId: producer ids for idempotent and transactional producers (Kafka's
``KafkaApis.handleInitProducerIdRequest``, ``TransactionCoordinator.handleInitProducerId`` and
``RPCProducerIdManager``).

    InitProducerId Request => transactional_id transaction_timeout_ms producer_id producer_epoch
    InitProducerId Response => throttle_time_ms error_code producer_id producer_epoch

Ids come from blocks the replicator hands out (KIP-730, :class:`ProducerIdBlocks`): a handler
takes one block when it first needs an id and the next one when 90% of the current one is given
out, so requests rarely wait. Handlers stay stateless: a handler that dies loses the rest of its
block, which only wastes ids, as a Kafka broker does.

Answers, as a Java broker gives them:

- no transactional id: a fresh producer id with epoch 0, always, even when the request names
  a previous producer id and epoch (KIP-360 re-initialisation bumps epochs only for
  transactional ids; an idempotent producer bumps its epoch itself).
- authorization first: a transactional id needs WRITE on it
  (TRANSACTIONAL_ID_AUTHORIZATION_FAILED); an idempotent producer IDEMPOTENT_WRITE on the
  cluster or WRITE on some topic (KIP-679; CLUSTER_AUTHORIZATION_FAILED).
- producer_id set without producer_epoch or the other way round: INVALID_REQUEST.
- a transactional id: the transaction coordinator's answer
  (:meth:`~..transactions.coordinator.TransactionCoordinator.init_producer_id`: an empty id
  INVALID_REQUEST, a timeout over ``transaction.max.timeout.ms`` INVALID_TRANSACTION_TIMEOUT,
  then NOT_COORDINATOR from a broker that does not coordinate the id; epoch bumps, KIP-360
  recovery, fencing with CONCURRENT_TRANSACTIONS), PRODUCER_FENCED being
  INVALID_PRODUCER_EPOCH before v4; on an error the producer id and epoch are -1.
- no block can be had (the replicator is unreachable, or failed): COORDINATOR_LOAD_IN_PROGRESS,
  which every client retries (Kafka answers it while its next block is on the way).
"""

from __future__ import annotations

import asyncio
import logging

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.replicator.v1 import replicator_pb2
from services.common.acls import Operation, ResourceType
from services.common.error_answers import error_response
from services.common.errors import ErrorCode, error_name

from ..collaborators import CallError, Controller
from ..coordinator.placement import CoordinatorError
from ..request_context import RequestContext
from ..transactions.coordinator import TransactionCoordinator
from ..transactions.metadata import ProducerIdAndEpoch

log = logging.getLogger(__name__)

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
# Fetch the next block once this share of the current one is given out (Kafka's
# PidPrefetchThreshold).
PREFETCH_THRESHOLD = 0.9
ALLOCATE_TIMEOUT_S = 10.0


class ProducerIdBlocks:
    """The producer ids this handler gives out: the current block (a range of ids), and the
    next one fetched ahead. One fetch at a time; concurrent callers wait for it. Event-loop
    only."""

    def __init__(self, source: Controller, requester: str = "") -> None:
        self._source = source
        self._requester = requester
        self._current = range(0)
        self._next_id = 0
        self._ahead: range | None = None
        self._fetching: asyncio.Task[range] | None = None

    async def next_id(self) -> int:
        """A producer id no one else got. Raises :class:`~..collaborators.CallError` when no
        block can be had."""
        while True:
            block = self._current
            if self._next_id in block:
                producer_id = self._next_id
                self._next_id += 1
                if self._ahead is None and producer_id == block.start + int(
                    len(block) * PREFETCH_THRESHOLD
                ):
                    self._start_fetch()
                return producer_id
            if self._ahead is not None:
                self._use(self._ahead)
                self._ahead = None
                continue
            task = self._start_fetch()
            fetched = await asyncio.shield(task)
            # Another waiter may have switched to it already.
            if self._ahead is fetched:
                self._use(fetched)
                self._ahead = None

    def _use(self, block: range) -> None:
        log.info("giving out producer ids %d-%d", block.start, block[-1])
        self._current = block
        self._next_id = block.start

    def _start_fetch(self) -> asyncio.Task[range]:
        if self._fetching is None:
            task = asyncio.get_running_loop().create_task(self._fetch())
            # A prefetch nobody awaits must not leave its failure unretrieved.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._fetching = task
        return self._fetching

    async def _fetch(self) -> range:
        try:
            answer = await self._source.allocate_producer_ids(
                replicator_pb2.AllocateProducerIdsRequest(requester=self._requester),
                ALLOCATE_TIMEOUT_S)
            if answer.error_code or answer.producer_id_len <= 0:
                raise CallError(f"no producer ids: {error_name(answer.error_code)} "
                                f"{answer.error_message}")
            start = answer.producer_id_start
            self._ahead = range(start, start + answer.producer_id_len)
            return self._ahead
        except CallError as exc:
            log.warning("no producer id block: %s", exc)
            raise
        finally:
            self._fetching = None

    async def close(self) -> None:
        task = self._fetching
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


# The first InitProducerId version that knows PRODUCER_FENCED.
PRODUCER_FENCED_VERSION = 4


class InitProducerIdApi:
    def __init__(self, blocks: ProducerIdBlocks,
                 transactions: TransactionCoordinator | None = None) -> None:
        self._blocks = blocks
        self._transactions = transactions

    async def handle(self, request: k.InitProducerIdRequest,
                     context: RequestContext) -> k.InitProducerIdResponse:
        denied = self._denied(request, context)
        if denied:
            return error_response(request, denied)
        producer_id, epoch = request.producer_id, request.producer_epoch
        if (producer_id == NO_PRODUCER_ID) != (epoch == NO_PRODUCER_EPOCH):
            return error_response(request, ErrorCode.invalid_request.value)
        if request.HasField("transactional_id"):
            expected = None if producer_id == NO_PRODUCER_ID else ProducerIdAndEpoch(
                producer_id=producer_id, epoch=epoch)
            return await self._transactional(request, expected, context)
        try:
            producer_id = await self._blocks.next_id()
        except CallError:
            return error_response(request, ErrorCode.coordinator_load_in_progress.value)
        return k.InitProducerIdResponse(error_code=0, producer_id=producer_id, producer_epoch=0)

    @staticmethod
    def _denied(request: k.InitProducerIdRequest, context: RequestContext) -> int:
        access = context.access
        if request.HasField("transactional_id"):
            return access.check(Operation.WRITE, ResourceType.TRANSACTIONAL_ID,
                                request.transactional_id)
        if access.allows(Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER) or access.allows_any(
                Operation.WRITE, ResourceType.TOPIC):
            return 0
        return access.check(Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER)

    async def _transactional(self, request: k.InitProducerIdRequest,
                             expected: ProducerIdAndEpoch | None,
                             context: RequestContext) -> k.InitProducerIdResponse:
        tid = request.transactional_id
        coordinator = self._transactions
        timeout_ms = request.transaction_timeout_ms
        error, producer_id, epoch = 0, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        if not tid:
            error = ErrorCode.invalid_request.value
        elif coordinator is None:
            error = ErrorCode.coordinator_not_available.value
        elif not 0 < timeout_ms <= coordinator.config.max_timeout_ms:
            error = ErrorCode.invalid_transaction_timeout.value
        else:
            error = await coordinator.placement.not_coordinator(tid, context.broker_id)
        if not error and coordinator is not None:
            try:
                decision = await coordinator.init_producer_id(tid, timeout_ms, expected)
                error = decision.error
                if not error:
                    producer_id, epoch = decision.producer_id, decision.producer_epoch
            except CoordinatorError as exc:
                error = exc.code
        if error == ErrorCode.producer_fenced.value and context.api_version is not None \
                and context.api_version < PRODUCER_FENCED_VERSION:
            error = ErrorCode.invalid_producer_epoch.value
        return k.InitProducerIdResponse(error_code=error, producer_id=producer_id,
                                        producer_epoch=epoch)
