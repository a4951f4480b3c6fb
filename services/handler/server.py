"""Start and stop a handler: its collaborator channels, the metadata cache and the stream
that feeds it, and the KafkaHandler gRPC server (with health, reflection and metrics), which
also serves the same methods multiplexed over streams (KafkaHandlerStream, for frontends)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from kbroker.handler.v1 import handler_pb2, handler_pb2_grpc
from services.common.server import ServiceBinding, create_server

from .apis.cluster import DescribeClusterApi
from .apis.configs import AlterConfigsApi, DescribeConfigsApi
from .apis.fetch import FetchApi
from .apis.metadata import MetadataApi
from .apis.offsets import ListOffsetsApi
from .apis.partitions import CreatePartitionsApi
from .apis.produce import ProduceApi
from .apis.producer_ids import InitProducerIdApi, ProducerIdBlocks
from .apis.records import DeleteRecordsApi
from .apis.topics import CreateTopicsApi, DeleteTopicsApi
from .clients import LogNodeClients, PurgatoryClient, ReplicatorClient
from .config import HandlerConfig
from .exchange import ExchangeServicer
from .metadata_cache import MetadataCache
from .servicer import KafkaHandlerServicer

log = logging.getLogger(__name__)

SERVICE_NAME = handler_pb2.DESCRIPTOR.services_by_name["KafkaHandler"].full_name
STREAM_SERVICE_NAME = handler_pb2.DESCRIPTOR.services_by_name["KafkaHandlerStream"].full_name


class HandlerService:
    """A running handler."""

    def __init__(
        self,
        server: grpc.aio.Server,
        port: int,
        cache: MetadataCache,
        follower: asyncio.Task[None],
        replicator: ReplicatorClient,
        log_nodes: LogNodeClients,
        purgatory: PurgatoryClient,
        producer_id_blocks: ProducerIdBlocks | None = None,
    ) -> None:
        self.server = server
        self.port = port
        self.cache = cache
        self._follower = follower
        self._replicator = replicator
        self._log_nodes = log_nodes
        self._purgatory = purgatory
        self._producer_id_blocks = producer_id_blocks

    async def stop(self, grace: float = 1.0) -> None:
        """Finish in-flight requests (up to ``grace`` seconds), then close every channel."""
        await self.server.stop(grace)
        self._follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._follower
        if self._producer_id_blocks is not None:
            await self._producer_id_blocks.close()
        await self._replicator.close()
        await self._log_nodes.close()
        await self._purgatory.close()


async def start(config: HandlerConfig) -> HandlerService:
    replicator = ReplicatorClient(config.replicator_address)
    log_nodes = LogNodeClients()
    purgatory = PurgatoryClient(config.purgatory_address)
    cache = MetadataCache(replicator.load_metadata)
    cache.add_listener(log_nodes.on_metadata)
    producer_id_blocks = ProducerIdBlocks(replicator, requester=config.instance)
    servicer = KafkaHandlerServicer(
        config,
        metadata_api=MetadataApi(cache, replicator, config.auto_create_topics_enable),
        produce_api=ProduceApi(cache, log_nodes, purgatory),
        fetch_api=FetchApi(cache, log_nodes, purgatory),
        list_offsets_api=ListOffsetsApi(cache, log_nodes),
        create_topics_api=CreateTopicsApi(cache, replicator),
        delete_topics_api=DeleteTopicsApi(cache, replicator),
        describe_cluster_api=DescribeClusterApi(cache),
        delete_records_api=DeleteRecordsApi(cache, log_nodes),
        describe_configs_api=DescribeConfigsApi(
            cache, auto_create_topics_enable=config.auto_create_topics_enable),
        alter_configs_api=AlterConfigsApi(cache, replicator),
        create_partitions_api=CreatePartitionsApi(cache, replicator),
        init_producer_id_api=InitProducerIdApi(producer_id_blocks),
    )
    follower = asyncio.create_task(cache.follow(replicator.watch), name="metadata-follower")
    try:
        server, port, _health = await create_server(
            "handler",
            [ServiceBinding(SERVICE_NAME, handler_pb2_grpc.add_KafkaHandlerServicer_to_server,
                            servicer),
             ServiceBinding(STREAM_SERVICE_NAME,
                            handler_pb2_grpc.add_KafkaHandlerStreamServicer_to_server,
                            ExchangeServicer(servicer))],
            config.grpc_address,
            config.instance,
        )
    except BaseException:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        await replicator.close()
        await purgatory.close()
        raise
    log.info("handler %s serving on port %d", config.instance, port)
    return HandlerService(server, port, cache, follower, replicator, log_nodes, purgatory,
                          producer_id_blocks)
