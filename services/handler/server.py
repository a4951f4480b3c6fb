"""Start and stop a handler: its collaborator channels, the metadata cache and the stream
that feeds it, and the KafkaHandler gRPC server (with health, reflection and metrics), which
also serves the same methods multiplexed over streams (KafkaHandlerStream, for frontends)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from kbroker.handler.v1 import kafka_handler_pb2
from services.common.server import ServiceBinding, create_server
from services.common.tls import InternalTls

from .apis.acls import CreateAclsApi, DeleteAclsApi, DescribeAclsApi
from .apis.client_quotas import AlterClientQuotasApi, DescribeClientQuotasApi
from .apis.cluster import DescribeClusterApi
from .apis.configs import AlterConfigsApi, DescribeConfigsApi
from .apis.consumer_groups import ConsumerGroupDescribeApi, ConsumerGroupHeartbeatApi
from .apis.fetch import FetchApi
from .apis.group_offsets import (
    OffsetCommitApi,
    OffsetDeleteApi,
    OffsetFetchApi,
    TxnOffsetCommitApi,
)
from .apis.groups import (
    DeleteGroupsApi,
    DescribeGroupsApi,
    FindCoordinatorApi,
    HeartbeatApi,
    JoinGroupApi,
    LeaveGroupApi,
    ListGroupsApi,
    SyncGroupApi,
)
from .apis.leader_epochs import OffsetForLeaderEpochApi
from .apis.leaders import ElectLeadersApi
from .apis.log_dirs import DescribeLogDirsApi
from .apis.metadata import MetadataApi
from .apis.offsets import ListOffsetsApi
from .apis.partitions import CreatePartitionsApi
from .apis.produce import ProduceApi
from .apis.producer_ids import InitProducerIdApi, ProducerIdBlocks
from .apis.producers import DescribeProducersApi
from .apis.reassignments import AlterPartitionReassignmentsApi, ListPartitionReassignmentsApi
from .apis.records import DeleteRecordsApi
from .apis.scram_credentials import (
    AlterUserScramCredentialsApi,
    DescribeUserScramCredentialsApi,
)
from .apis.telemetry import GetTelemetrySubscriptionsApi, PushTelemetryApi
from .apis.topics import CreateTopicsApi, DeleteTopicsApi
from .apis.transactions import (
    AddOffsetsToTxnApi,
    AddPartitionsToTxnApi,
    DescribeTransactionsApi,
    EndTxnApi,
    ListTransactionsApi,
)
from .apis.txn_markers import WriteTxnMarkersApi
from .client_metrics import ClientMetricsManager, ClientMetricsStore, Subscription
from .clients import LogNodeClients, PurgatoryClient, ReplicatorClient
from .collaborators import Controller, LogNodes, Purgatory
from .config import HandlerConfig
from .exchange import STREAM_SERVICE_NAME, ExchangeServicer, add_exchange_to_server
from .groups.coordinator import GroupCoordinator
from .metadata_cache import MetadataCache
from .metrics import CLIENT_TELEMETRY
from .security.access import Authorization
from .security.authorizer import parse_super_users
from .servicer import KafkaApi, KafkaHandlerServicer, add_to_server
from .transactions.coordinator import TransactionCoordinator

log = logging.getLogger(__name__)

SERVICE_NAME = kafka_handler_pb2.DESCRIPTOR.services_by_name["KafkaHandler"].full_name


class HandlerService:
    """A running handler: its gRPC server, bound port, and what stops with it."""

    def __init__(self, server: grpc.aio.Server, port: int,
                 resources: contextlib.AsyncExitStack) -> None:
        self.server = server
        self.port = port
        self._resources = resources

    async def stop(self, grace: float = 1.0) -> None:
        """Finish in-flight requests (up to ``grace`` seconds), then stop the background tasks
        and close every channel."""
        await self.server.stop(grace)
        await self._resources.aclose()


async def start(config: HandlerConfig, *,
                log_nodes: LogNodeClients | None = None) -> HandlerService:
    """Start a handler; ``log_nodes`` replaces its log node clients (tests: a log node side
    the log nodes at hand do not have)."""
    async with contextlib.AsyncExitStack() as stack:
        tls = InternalTls.of(config)
        replicator = ReplicatorClient(config.replicator_address, tls)
        log_nodes = log_nodes or LogNodeClients(tls)
        purgatory = PurgatoryClient(config.purgatory_address, tls)
        cache = MetadataCache(replicator.load_metadata)
        cache.add_listener(log_nodes.on_metadata)
        producer_id_blocks = ProducerIdBlocks(replicator, requester=config.instance)
        coordinator = GroupCoordinator(cache, log_nodes, replicator, purgatory, config)
        transactions = TransactionCoordinator(cache, log_nodes, replicator, purgatory, config,
                                              producer_id_blocks)
        for resource in (replicator, log_nodes, purgatory, producer_id_blocks, coordinator,
                         transactions):
            stack.push_async_callback(resource.close)
        apis = kafka_apis(config, cache, replicator, log_nodes, purgatory, producer_id_blocks,
                          coordinator, transactions)
        telemetry = client_metrics(config)
        CLIENT_TELEMETRY.sources.add(telemetry)
        stack.callback(CLIENT_TELEMETRY.sources.discard, telemetry)
        apis["GetTelemetrySubscriptions"] = GetTelemetrySubscriptionsApi(telemetry)
        apis["PushTelemetry"] = PushTelemetryApi(telemetry)
        servicer = KafkaHandlerServicer(config, apis, cache, authorization(config))
        for task in (
            asyncio.create_task(cache.follow(replicator.watch), name="metadata-follower"),
            asyncio.create_task(coordinator.follow_expirations(), name="session-expirations"),
            asyncio.create_task(transactions.follow_expirations(),
                                name="transaction-expirations"),
        ):
            stack.push_async_callback(_cancel, task)
        server, port, _health = await create_server(
            "handler",
            [ServiceBinding(SERVICE_NAME, add_to_server, servicer),
             ServiceBinding(STREAM_SERVICE_NAME, add_exchange_to_server,
                            ExchangeServicer(servicer))],
            config.grpc_address,
            config.instance,
            tls=tls,
        )
        log.info("handler %s serving on port %d", config.instance, port)
        return HandlerService(server, port, stack.pop_all())


def client_metrics(config: HandlerConfig) -> ClientMetricsManager:
    """Client telemetry (KIP-714) as the handler's flags configure it."""
    subscription = Subscription.from_flags(config.client_telemetry_metrics,
                                           config.client_telemetry_push_interval_ms,
                                           config.client_telemetry_max_bytes)
    return ClientMetricsManager(subscription,
                                ClientMetricsStore(config.client_telemetry_max_series))


def authorization(config: HandlerConfig) -> Authorization:
    """The handler's authorizer settings, from its configuration."""
    return Authorization(enabled=config.authorizer_enabled,
                         super_users=parse_super_users(config.super_users),
                         allow_everyone_if_no_acl_found=config.allow_everyone_if_no_acl_found)


def kafka_apis(config: HandlerConfig, cache: MetadataCache, replicator: Controller,
               log_nodes: LogNodes, purgatory: Purgatory, producer_id_blocks: ProducerIdBlocks,
               coordinator: GroupCoordinator, transactions: TransactionCoordinator,
               ) -> dict[str, KafkaApi]:
    """Every Kafka API this handler serves, by RPC name, over its collaborators."""
    alter_configs = AlterConfigsApi(cache, replicator)
    return {
        "Produce": ProduceApi(cache, log_nodes, purgatory, transactions,
                              leader_wait_ms=config.acks_all_leader_wait_ms),
        "Fetch": FetchApi(cache, log_nodes, purgatory),
        "ListOffsets": ListOffsetsApi(cache, log_nodes),
        "Metadata": MetadataApi(cache, replicator, config.auto_create_topics_enable),
        "DescribeCluster": DescribeClusterApi(cache),
        "DeleteRecords": DeleteRecordsApi(cache, log_nodes),
        "OffsetForLeaderEpoch": OffsetForLeaderEpochApi(cache, log_nodes),
        "CreateTopics": CreateTopicsApi(cache, replicator),
        "DeleteTopics": DeleteTopicsApi(cache, replicator),
        "CreatePartitions": CreatePartitionsApi(cache, replicator),
        "ElectLeaders": ElectLeadersApi(cache, replicator),
        "AlterPartitionReassignments": AlterPartitionReassignmentsApi(cache, replicator),
        "ListPartitionReassignments": ListPartitionReassignmentsApi(cache),
        "DescribeLogDirs": DescribeLogDirsApi(cache, log_nodes),
        "DescribeConfigs": DescribeConfigsApi(
            cache, auto_create_topics_enable=config.auto_create_topics_enable),
        "AlterConfigs": alter_configs,
        "IncrementalAlterConfigs": alter_configs,
        "InitProducerId": InitProducerIdApi(producer_id_blocks, transactions),
        "FindCoordinator": FindCoordinatorApi(coordinator, transactions.placement),
        "JoinGroup": JoinGroupApi(coordinator),
        "SyncGroup": SyncGroupApi(coordinator),
        "Heartbeat": HeartbeatApi(coordinator),
        "LeaveGroup": LeaveGroupApi(coordinator),
        "ListGroups": ListGroupsApi(coordinator),
        "DescribeGroups": DescribeGroupsApi(coordinator),
        "DeleteGroups": DeleteGroupsApi(coordinator),
        "ConsumerGroupHeartbeat": ConsumerGroupHeartbeatApi(coordinator),
        "ConsumerGroupDescribe": ConsumerGroupDescribeApi(coordinator),
        "OffsetCommit": OffsetCommitApi(cache, coordinator),
        "OffsetFetch": OffsetFetchApi(coordinator),
        "OffsetDelete": OffsetDeleteApi(cache, coordinator),
        "AddPartitionsToTxn": AddPartitionsToTxnApi(cache, transactions),
        "AddOffsetsToTxn": AddOffsetsToTxnApi(transactions, coordinator),
        "EndTxn": EndTxnApi(transactions),
        "TxnOffsetCommit": TxnOffsetCommitApi(cache, coordinator, transactions),
        "WriteTxnMarkers": WriteTxnMarkersApi(cache, log_nodes, purgatory,
                                              leader_wait_ms=config.acks_all_leader_wait_ms),
        "DescribeProducers": DescribeProducersApi(cache, log_nodes),
        "DescribeTransactions": DescribeTransactionsApi(transactions),
        "ListTransactions": ListTransactionsApi(transactions),
        "DescribeAcls": DescribeAclsApi(cache),
        "CreateAcls": CreateAclsApi(cache, replicator),
        "DeleteAcls": DeleteAclsApi(cache, replicator),
        "DescribeUserScramCredentials": DescribeUserScramCredentialsApi(cache),
        "AlterUserScramCredentials": AlterUserScramCredentialsApi(cache, replicator),
        "DescribeClientQuotas": DescribeClientQuotasApi(cache),
        "AlterClientQuotas": AlterClientQuotasApi(cache, replicator),
    }


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
