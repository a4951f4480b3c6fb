"""gRPC glue of the Purgatory service: protobuf <-> :class:`Purgatories` calls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from kbroker.purgatory.v1 import purgatory_pb2, purgatory_pb2_grpc
from services.common.call_streams import serve_calls

from .purgatories import Purgatories

_PREFIX = "OPERATION_KIND_"
KIND_NAMES: dict[int, str] = {
    number: name[len(_PREFIX):].lower()
    for name, number in purgatory_pb2.OperationKind.items()
    if number != purgatory_pb2.OPERATION_KIND_UNSPECIFIED
}


class PurgatoryServicer(purgatory_pb2_grpc.PurgatoryServicer):
    def __init__(self, purgatories: Purgatories) -> None:
        self._purgatories = purgatories

    async def Await(
        self, request: purgatory_pb2.AwaitRequest, context: grpc.aio.ServicerContext
    ) -> purgatory_pb2.AwaitResponse:
        kind = KIND_NAMES.get(request.kind)
        if kind is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"unknown operation kind {request.kind}")
        return await self._await(kind, request)

    async def AwaitStream(
        self, request_iterator: AsyncIterator[purgatory_pb2.AwaitStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        """Await, many calls on one stream; operations still parked when it ends are taken
        off."""

        async def answer(
            message: purgatory_pb2.AwaitStreamRequest,
        ) -> purgatory_pb2.AwaitStreamResponse:
            reply = purgatory_pb2.AwaitStreamResponse(call_id=message.call_id)
            kind = KIND_NAMES.get(message.request.kind)
            if kind is None:
                reply.status_code = grpc.StatusCode.INVALID_ARGUMENT.value[0]
                reply.status_details = f"unknown operation kind {message.request.kind}"
            else:
                reply.response.CopyFrom(await self._await(kind, message.request))
            return reply

        await serve_calls(request_iterator, context, answer, cancel_at_end=True, name="await")

    async def _await(self, kind: str,
                     request: purgatory_pb2.AwaitRequest) -> purgatory_pb2.AwaitResponse:
        thresholds: dict[str, int] = {}
        for watched in request.keys:
            # A key named twice must satisfy the stricter threshold.
            thresholds[watched.key] = max(watched.threshold,
                                          thresholds.get(watched.key, watched.threshold))
        op = self._purgatories.park(
            kind=kind,
            thresholds=thresholds,
            require_all=request.require_all,
            timeout_ms=request.timeout_ms,
        )
        try:
            return await op.result
        except asyncio.CancelledError:
            # The caller cancelled or the server is stopping: take the operation off every list.
            self._purgatories.cancel(op)
            raise

    async def CheckAndComplete(
        self, request: purgatory_pb2.CheckAndCompleteRequest, context: grpc.aio.ServicerContext
    ) -> purgatory_pb2.CheckAndCompleteResponse:
        return purgatory_pb2.CheckAndCompleteResponse(completed=self._report(request))

    async def ReportProgress(
        self, request_iterator: AsyncIterator[purgatory_pb2.CheckAndCompleteRequest],
        context: grpc.aio.ServicerContext,
    ) -> purgatory_pb2.CheckAndCompleteResponse:
        completed = 0
        async for request in request_iterator:
            completed += self._report(request)
        return purgatory_pb2.CheckAndCompleteResponse(completed=completed)

    def _report(self, request: purgatory_pb2.CheckAndCompleteRequest) -> int:
        return self._purgatories.report(
            (state.key, state.position, state.error_code, state.isr) for state in request.keys)

    async def WatchKeys(
        self, request: purgatory_pb2.WatchKeysRequest, context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[purgatory_pb2.WatchedKeys]:
        watched = self._purgatories.watched
        subscription = watched.subscribe()
        try:
            while True:
                yield await subscription.next_changes()
        finally:
            watched.unsubscribe(subscription)

    async def Schedule(
        self, request: purgatory_pb2.ScheduleRequest, context: grpc.aio.ServicerContext
    ) -> purgatory_pb2.ScheduleResponse:
        rearmed = self._purgatories.heartbeats.schedule(
            {d.key: d.timeout_ms for d in request.deadlines})
        return purgatory_pb2.ScheduleResponse(rearmed=rearmed)

    async def Unschedule(
        self, request: purgatory_pb2.UnscheduleRequest, context: grpc.aio.ServicerContext
    ) -> purgatory_pb2.UnscheduleResponse:
        removed = self._purgatories.heartbeats.unschedule(request.keys)
        return purgatory_pb2.UnscheduleResponse(removed=removed)

    async def WatchExpirations(
        self, request: purgatory_pb2.WatchExpirationsRequest,
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[purgatory_pb2.Expirations]:
        heartbeats = self._purgatories.heartbeats
        subscription = heartbeats.subscribe()
        try:
            # An empty first message tells the subscriber the subscription is in place.
            yield purgatory_pb2.Expirations()
            while True:
                keys = await subscription.next_batch()
                yield purgatory_pb2.Expirations(keys=keys)
        finally:
            heartbeats.unsubscribe(subscription)

    async def Armed(
        self, request: purgatory_pb2.ArmedRequest, context: grpc.aio.ServicerContext
    ) -> purgatory_pb2.ArmedResponse:
        return purgatory_pb2.ArmedResponse(keys=self._purgatories.heartbeats.armed(request.keys))

    async def Describe(
        self, request: purgatory_pb2.DescribeRequest, context: grpc.aio.ServicerContext
    ) -> purgatory_pb2.DescribeResponse:
        return self._purgatories.describe()

