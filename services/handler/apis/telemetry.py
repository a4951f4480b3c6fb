"""Client telemetry (KIP-714): GetTelemetrySubscriptions and PushTelemetry, as Kafka's
``KafkaApis.handleGetTelemetrySubscriptionsRequest`` / ``handlePushTelemetryRequest`` answer
them, over :class:`~..client_metrics.ClientMetricsManager` (subscriptions, client instances,
the store of pushed metrics; where each lives is told there).

    GetTelemetrySubscriptions Request (v0) => client_instance_id
    GetTelemetrySubscriptions Response (v0) => throttle_time_ms error_code client_instance_id
        subscription_id [accepted_compression_types] push_interval_ms telemetry_max_bytes
        delta_temporality [requested_metrics]
    PushTelemetry Request (v0) => client_instance_id subscription_id terminating
        compression_type metrics
    PushTelemetry Response (v0) => throttle_time_ms error_code

No ACL guards them (Kafka checks none). A request with a zero client instance id gets a new id;
``requested_metrics`` is empty for no subscription and ``["*"]`` for every metric, as Kafka
and librdkafka spell it. Push errors, in Kafka's order: INVALID_REQUEST (a zero or reserved id,
or a push after the client's terminating push), THROTTLING_QUOTA_EXCEEDED (within the push
interval, unless terminating), UNKNOWN_SUBSCRIPTION_ID (the subscription changed: the client
asks again at once), UNSUPPORTED_COMPRESSION_TYPE, TELEMETRY_TOO_LARGE (compressed or
decompressed beyond ``telemetry_max_bytes``), INVALID_RECORD (not decompressible, or not OTLP
``MetricsData``: the client stops pushing).
"""

from __future__ import annotations

from kbroker.kafka.v1 import kafka_pb2 as k

from ..client_metrics import ACCEPTED_COMPRESSION_TYPES, ZERO_UUID, ClientMetricsManager
from ..request_context import RequestContext


class GetTelemetrySubscriptionsApi:
    def __init__(self, manager: ClientMetricsManager) -> None:
        self._manager = manager

    async def handle(self, request: k.GetTelemetrySubscriptionsRequest,
                     context: RequestContext) -> k.GetTelemetrySubscriptionsResponse:
        answer = self._manager.get_subscriptions(request.client_instance_id)
        if answer.error_code:
            return k.GetTelemetrySubscriptionsResponse(
                error_code=answer.error_code, client_instance_id=str(ZERO_UUID))
        return k.GetTelemetrySubscriptionsResponse(
            error_code=0, client_instance_id=str(answer.client_instance_id),
            subscription_id=answer.subscription_id,
            accepted_compression_types=list(ACCEPTED_COMPRESSION_TYPES),
            push_interval_ms=answer.push_interval_ms, telemetry_max_bytes=answer.max_bytes,
            delta_temporality=True, requested_metrics=list(answer.metrics))


class PushTelemetryApi:
    def __init__(self, manager: ClientMetricsManager) -> None:
        self._manager = manager

    async def handle(self, request: k.PushTelemetryRequest,
                     context: RequestContext) -> k.PushTelemetryResponse:
        code = self._manager.push(
            request.client_instance_id, request.subscription_id, request.terminating,
            request.compression_type, request.metrics, client_id=context.client_id)
        return k.PushTelemetryResponse(error_code=code)
