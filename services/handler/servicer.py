"""gRPC glue for kbroker.handler.v1.KafkaHandler: every RPC goes to the API module registered
under its name, with the request context from gRPC metadata; per-request metrics (the time a
request parked in the purgatory goes back to the frontend as the trailing metadata
``kbroker-remote-ms``, see :mod:`.metrics`); and the guarantee that no request kills the
handler (an unexpected failure is logged and answered with UNKNOWN_SERVER_ERROR for every item
of the request, an API this handler does not serve with UNSUPPORTED_VERSION).

Unset optional request fields take Kafka's defaults (callers such as grpcurl may leave them
out), except where a hand-made request means something else: an unset replica id is a
consumer's (-1), unset partition counts and replication factors of CreateTopics mean the broker
default (-1), and a Metadata request that neither lists topics nor says its topic list is null
asks for every topic. Unset response fields are left for the frontend to fill with the
client version's defaults.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol
from urllib.parse import unquote

import grpc

from kbroker.handler.v1 import kafka_handler_pb2, kafka_handler_pb2_grpc
from kbroker.kafka.v1 import kafka_pb2 as k
from services.common.error_answers import error_codes, error_response
from services.common.errors import ErrorCode

from .apis import (
    configs,
    partitions,
    producer_ids,
    topics,
)
from .config import HandlerConfig
from .metrics import record_request, remote_time
from .request_context import RequestContext, split_host_port

log = logging.getLogger(__name__)

UNKNOWN_SERVER_ERROR = ErrorCode.unknown_server_error.value
UNSUPPORTED_VERSION = ErrorCode.unsupported_version.value


def _opt(message: Any, name: str, default: Any) -> Any:
    """An optional field's value, or ``default`` when unset."""
    return getattr(message, name) if message.HasField(name) else default


def _set_opt(message: Any, name: str, value: Any) -> None:
    """Set an optional field unless ``value`` is None (null: left to the frontend)."""
    if value is not None:
        setattr(message, name, value)


def _int_or_none(value: object) -> int | None:
    try:
        return int(str(value)) if value is not None else None
    except ValueError:
        return None


# --- CreateTopics / DeleteTopics ---------------------------------------------------------------


def create_topics_request(m: k.CreateTopicsRequest) -> topics.CreateTopicsRequest:
    return topics.CreateTopicsRequest(
        timeout_ms=_opt(m, "timeout_ms", 60_000),
        validate_only=_opt(m, "validate_only", False),
        topics=[
            topics.CreatableTopic(
                name=t.name,
                num_partitions=_opt(t, "num_partitions", -1),
                replication_factor=_opt(t, "replication_factor", -1),
                assignments=[(a.partition_index, tuple(a.broker_ids)) for a in t.assignments],
                configs=[(c.name, _opt(c, "value", None)) for c in t.configs],
            )
            for t in m.topics
        ],
    )


def create_topics_response(r: topics.CreateTopicsResponse) -> k.CreateTopicsResponse:
    out = k.CreateTopicsResponse(throttle_time_ms=0)
    for t in r.topics:
        topic = out.topics.add(
            name=t.name,
            error_code=t.error_code,
            topic_config_error_code=0,
            num_partitions=t.num_partitions,
            replication_factor=t.replication_factor,
            configs_is_null=False,
        )
        _set_opt(topic, "error_message", t.error_message)
        _set_opt(topic, "topic_id", t.topic_id)
        for c in t.configs:
            config = topic.configs.add(
                name=c.name,
                read_only=c.read_only,
                config_source=c.config_source,
                is_sensitive=c.is_sensitive,
            )
            _set_opt(config, "value", c.value)
    return out


def delete_topics_request(m: k.DeleteTopicsRequest) -> topics.DeleteTopicsRequest:
    refs = [topics.TopicToDelete(name=name) for name in m.topic_names]
    refs += [
        topics.TopicToDelete(name=_opt(t, "name", None), topic_id=_opt(t, "topic_id", None))
        for t in m.topics
    ]
    return topics.DeleteTopicsRequest(topics=refs, timeout_ms=_opt(m, "timeout_ms", 30_000))


def delete_topics_response(r: topics.DeleteTopicsResponse) -> k.DeleteTopicsResponse:
    out = k.DeleteTopicsResponse(throttle_time_ms=0)
    for t in r.topics:
        topic = out.responses.add(error_code=t.error_code)
        _set_opt(topic, "name", t.name)
        _set_opt(topic, "topic_id", t.topic_id)
        _set_opt(topic, "error_message", t.error_message)
    return out


# --- DescribeConfigs / AlterConfigs / IncrementalAlterConfigs ---------------------------------


def describe_configs_request(m: k.DescribeConfigsRequest) -> configs.DescribeConfigsRequest:
    resources = []
    for r in m.resources:
        keys = None if _opt(r, "configuration_keys_is_null", False) else list(
            r.configuration_keys)
        resources.append(configs.DescribeResource(
            resource_type=r.resource_type, resource_name=r.resource_name,
            configuration_keys=keys))
    return configs.DescribeConfigsRequest(
        resources=resources,
        include_synonyms=_opt(m, "include_synonyms", False),
        include_documentation=_opt(m, "include_documentation", False),
    )


def describe_configs_response(r: configs.DescribeConfigsResponse) -> k.DescribeConfigsResponse:
    out = k.DescribeConfigsResponse(throttle_time_ms=0)
    for result in r.results:
        item = out.results.add(error_code=result.error_code, resource_type=result.resource_type,
                               resource_name=result.resource_name)
        _set_opt(item, "error_message", result.error_message)
        for c in result.configs:
            entry = item.configs.add(name=c.name, read_only=c.read_only,
                                     config_source=c.config_source,
                                     is_sensitive=c.is_sensitive, config_type=c.config_type)
            _set_opt(entry, "value", c.value)
            _set_opt(entry, "documentation", c.documentation)
            for synonym in c.synonyms:
                added = entry.synonyms.add(name=synonym.name, source=synonym.source)
                _set_opt(added, "value", synonym.value)
    return out


def alter_configs_request(m: k.AlterConfigsRequest) -> configs.AlterConfigsRequest:
    return configs.AlterConfigsRequest(
        validate_only=_opt(m, "validate_only", False),
        resources=[
            configs.AlterResource(
                resource_type=r.resource_type, resource_name=r.resource_name,
                configs=[configs.AlterableConfig(name=c.name, value=_opt(c, "value", None))
                         for c in r.configs])
            for r in m.resources
        ],
    )


def incremental_alter_configs_request(
    m: k.IncrementalAlterConfigsRequest,
) -> configs.AlterConfigsRequest:
    return configs.AlterConfigsRequest(
        validate_only=_opt(m, "validate_only", False),
        incremental=True,
        resources=[
            configs.AlterResource(
                resource_type=r.resource_type, resource_name=r.resource_name,
                configs=[configs.AlterableConfig(name=c.name, value=_opt(c, "value", None),
                                                 operation=c.config_operation)
                         for c in r.configs])
            for r in m.resources
        ],
    )


def _alter_results(r: configs.AlterConfigsResponse, out: Any) -> Any:
    for result in r.results:
        item = out.responses.add(error_code=result.error_code,
                                 resource_type=result.resource_type,
                                 resource_name=result.resource_name)
        _set_opt(item, "error_message", result.error_message)
    return out


def alter_configs_response(r: configs.AlterConfigsResponse) -> k.AlterConfigsResponse:
    return _alter_results(r, k.AlterConfigsResponse(throttle_time_ms=0))


def incremental_alter_configs_response(
    r: configs.AlterConfigsResponse,
) -> k.IncrementalAlterConfigsResponse:
    return _alter_results(r, k.IncrementalAlterConfigsResponse(throttle_time_ms=0))


# --- CreatePartitions --------------------------------------------------------------------------


def create_partitions_request(m: k.CreatePartitionsRequest) -> partitions.CreatePartitionsRequest:
    return partitions.CreatePartitionsRequest(
        timeout_ms=_opt(m, "timeout_ms", 30_000),
        validate_only=_opt(m, "validate_only", False),
        topics=[
            partitions.CreatePartitionsTopic(
                name=t.name, count=t.count,
                assignments=None if _opt(t, "assignments_is_null", not t.assignments)
                else [tuple(a.broker_ids) for a in t.assignments],
            )
            for t in m.topics
        ],
    )


def create_partitions_response(
    r: partitions.CreatePartitionsResponse,
) -> k.CreatePartitionsResponse:
    out = k.CreatePartitionsResponse(throttle_time_ms=0)
    for result in r.results:
        item = out.results.add(name=result.name, error_code=result.error_code)
        _set_opt(item, "error_message", result.error_message)
    return out


# --- InitProducerId ----------------------------------------------------------------------------


def init_producer_id_request(m: k.InitProducerIdRequest) -> producer_ids.InitProducerIdRequest:
    return producer_ids.InitProducerIdRequest(
        transactional_id=_opt(m, "transactional_id", None),
        transaction_timeout_ms=_opt(m, "transaction_timeout_ms", 0),
        producer_id=_opt(m, "producer_id", producer_ids.NO_PRODUCER_ID),
        producer_epoch=_opt(m, "producer_epoch", producer_ids.NO_PRODUCER_EPOCH),
    )


def init_producer_id_response(
    r: producer_ids.InitProducerIdResponse,
) -> k.InitProducerIdResponse:
    return k.InitProducerIdResponse(throttle_time_ms=0, error_code=r.error_code,
                                    producer_id=r.producer_id, producer_epoch=r.producer_epoch)


# --- the service -------------------------------------------------------------------------------


class KafkaApi(Protocol):
    """One Kafka API: a request of ``kbroker.kafka.v1`` in, its response out."""

    async def handle(self, request: Any, context: RequestContext) -> Any: ...


class Converted:
    """An API module still on its own request and response objects, behind converters."""

    def __init__(self, to_domain: Callable[[Any, RequestContext], Any],
                 handle: Callable[[Any, RequestContext], Awaitable[Any]],
                 to_proto: Callable[[Any], Any]) -> None:
        self._to_domain, self._handle, self._to_proto = to_domain, handle, to_proto

    async def handle(self, request: Any, context: RequestContext) -> Any:
        return self._to_proto(await self._handle(self._to_domain(request, context), context))


def converted_apis(
    *,
    create_topics_api: topics.CreateTopicsApi | None = None,
    delete_topics_api: topics.DeleteTopicsApi | None = None,
    describe_configs_api: configs.DescribeConfigsApi | None = None,
    alter_configs_api: configs.AlterConfigsApi | None = None,
    create_partitions_api: partitions.CreatePartitionsApi | None = None,
    init_producer_id_api: producer_ids.InitProducerIdApi | None = None,
) -> dict[str, KafkaApi]:
    """The API modules not yet on the generated messages, by RPC name."""

    def plain(convert: Callable[[Any], Any]) -> Callable[[Any, RequestContext], Any]:
        return lambda m, _ctx: convert(m)

    def without_context(api: Any) -> Callable[[Any, RequestContext], Awaitable[Any]]:
        return lambda r, _ctx: api.handle(r)

    apis: dict[str, KafkaApi] = {}

    def add(name: str, api: Any, to_domain: Callable[[Any, RequestContext], Any],
            handle: Callable[[Any, RequestContext], Awaitable[Any]] | None,
            to_proto: Callable[[Any], Any]) -> None:
        if api is not None:
            apis[name] = Converted(to_domain, handle or without_context(api), to_proto)

    add("CreateTopics", create_topics_api, plain(create_topics_request), None,
        create_topics_response)
    add("DeleteTopics", delete_topics_api, plain(delete_topics_request), None,
        delete_topics_response)
    add("DescribeConfigs", describe_configs_api, plain(describe_configs_request), None,
        describe_configs_response)
    add("AlterConfigs", alter_configs_api, plain(alter_configs_request), None,
        alter_configs_response)
    add("IncrementalAlterConfigs", alter_configs_api,
        plain(incremental_alter_configs_request), None, incremental_alter_configs_response)
    add("CreatePartitions", create_partitions_api, plain(create_partitions_request), None,
        create_partitions_response)
    add("InitProducerId", init_producer_id_api, plain(init_producer_id_request), None,
        init_producer_id_response)
    return apis


SERVICE = kafka_handler_pb2.DESCRIPTOR.services_by_name["KafkaHandler"]


class KafkaHandlerServicer:
    """Every KafkaHandler RPC, as an attribute named after it, served by :meth:`serve`."""

    def __init__(self, config: HandlerConfig, apis: Mapping[str, KafkaApi]) -> None:
        self._default_advertised = split_host_port(config.advertised)
        self._default_broker_ports = config.broker_ports
        self._apis = dict(apis)
        for method in SERVICE.methods:
            setattr(self, method.name, functools.partial(self.serve, method.name))

    def request_context(self, context: grpc.aio.ServicerContext) -> RequestContext:
        values = {key: value for key, value in (context.invocation_metadata() or ())}
        host, port = self._default_advertised
        advertised = values.get("kafka-advertised")
        if advertised:
            try:
                host, port = split_host_port(str(advertised))
            except ValueError:
                log.warning("ignoring malformed kafka-advertised %r", advertised)
        try:
            broker_ports = int(values.get("kafka-broker-ports", self._default_broker_ports))
        except ValueError:
            broker_ports = self._default_broker_ports
        return RequestContext(
            advertised_host=host,
            advertised_port=port,
            broker_ports=broker_ports,
            # The frontend percent-encodes client ids (gRPC metadata is printable ASCII).
            client_id=unquote(str(values.get("kafka-client-id", ""))),
            client_host=str(values.get("kafka-client-host", "")),
            frontend_id=str(values.get("kafka-frontend-id", "")),
            api_version=_int_or_none(values.get("kafka-api-version")),
            broker_id=_int_or_none(values.get("kafka-broker-id")),
        )

    async def serve(self, name: str, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Answer one Kafka request with the API registered as ``name``."""
        started = time.perf_counter()
        api = self._apis.get(name)
        with remote_time(context):
            if api is None:
                response = error_response(request, UNSUPPORTED_VERSION)
            else:
                try:
                    response = await api.handle(request, self.request_context(context))
                except Exception:
                    log.exception("%s failed", name)
                    response = error_response(request, UNKNOWN_SERVER_ERROR)
        codes = error_codes(response)
        record_request(name, codes[0] if codes else 0, time.perf_counter() - started)
        return response


def add_to_server(servicer: KafkaHandlerServicer, server: grpc.aio.Server) -> None:
    kafka_handler_pb2_grpc.add_KafkaHandlerServicer_to_server(servicer, server)  # type: ignore[arg-type]
