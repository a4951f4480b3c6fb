"""A handler's KafkaHandler gRPC service on 127.0.0.1 port 0 with the authorizer on, serving
every API the handler registers over in-memory collaborators, and a snapshot whose ACLs a test
swaps; calls carry the principal as a frontend sends it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import replace
from typing import Any

import grpc

from kbroker.handler.v1 import kafka_handler_pb2_grpc
from services.common.acls import AclBinding, PatternType, Permission
from services.common.channels import insecure_channel
from services.common.server import ServiceBinding, create_server
from services.handler import server as handler_server
from services.handler.apis.producer_ids import ProducerIdBlocks
from services.handler.config import HandlerConfig
from services.handler.exchange import STREAM_SERVICE_NAME, ExchangeServicer, add_exchange_to_server
from services.handler.groups.coordinator import OFFSETS_TOPIC, GroupCoordinator
from services.handler.metadata_cache import ClusterMetadata, MetadataCache
from services.handler.servicer import KafkaHandlerServicer, add_to_server
from services.handler.transactions.coordinator import (
    TRANSACTION_STATE_TOPIC,
    TransactionCoordinator,
)

from ..fakes import (
    FakeController,
    FakeLogNodes,
    FakePurgatory,
    MemoryLog,
    MemoryPurgatory,
    cluster,
    topic,
)

CALL_TIMEOUT = 10.0
TOPICS = (topic("orders", 2, topic_id="0c0c0c0c-0000-0000-0000-000000000001"),
          topic("secret", 1, topic_id="0c0c0c0c-0000-0000-0000-000000000002"),
          replace(topic(OFFSETS_TOPIC, 2), internal=True),
          replace(topic(TRANSACTION_STATE_TOPIC, 2), internal=True))


def allow(resource_type: Any, name: str, operation: Any, *, principal: str = "User:alice",
          pattern: PatternType = PatternType.LITERAL, host: str = "*") -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, host, operation, Permission.ALLOW)


def deny(resource_type: Any, name: str, operation: Any, *, principal: str = "User:alice",
         pattern: PatternType = PatternType.LITERAL, host: str = "*") -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, host, operation, Permission.DENY)


class Source:
    """The replicator's producer id blocks."""

    async def allocate_producer_ids(self, request: Any, time_limit: float) -> Any:
        from kbroker.replicator.v1 import replicator_pb2
        return replicator_pb2.AllocateProducerIdsResponse(producer_id_start=1000,
                                                          producer_id_len=100)


class Handler:
    """The running service: ``stub`` to call it, ``use(acls)`` to change the ACLs."""

    def __init__(self, cache: MetadataCache, stub: Any, controller: FakeController,
                 port: int) -> None:
        self.cache = cache
        self.stub = stub
        self.controller = controller
        self.port = port
        self._version = 1

    def use(self, acls: Iterable[AclBinding]) -> None:
        """Install a snapshot with these ACLs (and the topics as they are now)."""
        self._version += 1
        current = self.controller.metadata
        snapshot = ClusterMetadata(version=self._version + current.version,
                                   cluster_id=current.cluster_id,
                                   controller_id=current.controller_id,
                                   log_nodes=current.log_nodes.values(),
                                   topics=current.topics.values(), acls=acls)
        self.controller.metadata = snapshot
        self.cache.install(snapshot, authoritative=True)

    async def call(self, method: str, request: Any, principal: str = "User:alice",
                   version: int | None = None) -> Any:
        metadata = [("kafka-principal", principal), ("kafka-client-host", "10.1.2.3"),
                    ("kafka-client-id", "authz-test"), ("kafka-broker-id", "0")]
        if version is not None:
            metadata.append(("kafka-api-version", str(version)))
        return await getattr(self.stub, method)(request, metadata=metadata,
                                                timeout=CALL_TIMEOUT)


@contextlib.asynccontextmanager
async def running_handler(credentials: grpc.ServerCredentials | None = None,
                          **options: Any) -> AsyncIterator[Handler]:
    """A handler with ``authorizer_enabled`` (and ``options``) serving on port 0, over TLS
    with ``credentials`` (then ``stub`` is None: callers make their own channels)."""
    options.setdefault("authorizer_enabled", True)
    config = HandlerConfig(offsets_topic_num_partitions=2,
                           transaction_state_log_num_partitions=2,
                           group_initial_rebalance_delay_ms=0, **options)
    metadata = cluster(*TOPICS)
    controller = FakeController(metadata)
    cache = MetadataCache(controller.load_metadata)
    cache.install(metadata)
    coordinator_log, coordinator_purgatory = MemoryLog(), MemoryPurgatory()
    blocks = ProducerIdBlocks(Source())  # type: ignore[arg-type]
    groups = GroupCoordinator(cache, coordinator_log, controller,  # type: ignore[arg-type]
                              coordinator_purgatory, config)
    transactions = TransactionCoordinator(cache, coordinator_log, controller,  # type: ignore[arg-type]
                                          coordinator_purgatory, config, blocks)
    apis = handler_server.kafka_apis(config, cache, controller,  # type: ignore[arg-type]
                                     FakeLogNodes(), FakePurgatory(), blocks, groups,
                                     transactions)
    servicer = KafkaHandlerServicer(config, apis, cache, handler_server.authorization(config))
    if credentials is None:
        server, port, _ = await create_server(
            "handler", [ServiceBinding(handler_server.SERVICE_NAME, add_to_server, servicer),
                        ServiceBinding(STREAM_SERVICE_NAME, add_exchange_to_server,
                                       ExchangeServicer(servicer))], "127.0.0.1:0")
    else:
        server = grpc.aio.server()
        add_to_server(servicer, server)
        add_exchange_to_server(ExchangeServicer(servicer), server)
        port = server.add_secure_port("127.0.0.1:0", credentials)
        await server.start()
    channel: grpc.aio.Channel = insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Handler(cache, kafka_handler_pb2_grpc.KafkaHandlerStub(channel), controller, port)
    finally:
        await channel.close()
        await server.stop(0)
        await groups.close()
        await transactions.close()
        await blocks.close()
