"""Every handler API, served over gRPC with the authorizer on, checked both ways: a principal
without ACLs gets Kafka's authorization error for the API (and nothing is read, written or
shown), and the same request from a principal holding just the ACLs Kafka requires gets no
authorization error. Then the APIs that filter (Metadata, ListGroups, OffsetFetch,
ListTransactions, DescribeTransactions), authorized operations, KIP-679 for idempotent
producers, super users and the switch that turns the authorizer off."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from google.protobuf.message import Message

from kbroker.kafka.v1 import kafka_pb2 as k
from services.common.acls import Operation, PatternType, ResourceType
from services.common.errors import ErrorCode
from services.common.records.record_batch import ATTRIBUTES_OFFSET, TRANSACTIONAL_BIT
from services.handler.apis.cluster import AUTHORIZED_OPERATIONS_OMITTED
from services.handler.security.authorizer import operations_bitfield

from ..batches import record_batch
from .handler import TOPICS as TOPICS_BY_NAME
from .handler import Handler, allow, deny, running_handler

Op, R = Operation, ResourceType
TOPIC_DENIED = ErrorCode.topic_authorization_failed.value
GROUP_DENIED = ErrorCode.group_authorization_failed.value
CLUSTER_DENIED = ErrorCode.cluster_authorization_failed.value
TXN_DENIED = ErrorCode.transactional_id_authorization_failed.value
AUTHORIZATION_ERRORS = {TOPIC_DENIED, GROUP_DENIED, CLUSTER_DENIED, TXN_DENIED}
CLUSTER = "kafka-cluster"
TIMEOUT = 60


def run(test: Callable[[Handler], Any], **options: Any) -> None:
    async def main() -> None:
        async with running_handler(**options) as handler:
            await test(handler)

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))


def error_codes(message: Message) -> list[int]:
    """Every item's error code in a response (``topic_config_error_code`` aside: it says
    whether configs are shown)."""
    codes = []
    for field, value in message.ListFields():
        if field.message_type is not None:
            items = value if field.is_repeated else [value]
            for item in items:
                codes += error_codes(item)
        elif field.name.endswith("error_code") and field.name != "topic_config_error_code":
            codes.append(value)
    return codes


def succeeded(response: Message) -> bool:
    """No item of ``response`` has an error."""
    return not set(error_codes(response)) - {0}


def transactional(records: bytes) -> bytes:
    batch = bytearray(records)
    batch[ATTRIBUTES_OFFSET + 1] |= TRANSACTIONAL_BIT
    return bytes(batch)


RECORDS = record_batch([b"v"])
TXN_RECORDS = transactional(record_batch([b"v"], producer_id=7))


@dataclass(frozen=True)
class Case:
    """One API's check: the request, the ACLs that let it through, Kafka's error without
    them, and the client version whose shape the request has."""

    method: str
    request: Message
    acls: tuple[Any, ...]
    denied: int
    version: int | None = None

    def __str__(self) -> str:
        return self.method


def produce(transactional_id: str | None = None, records: bytes = RECORDS) -> k.ProduceRequest:
    return k.ProduceRequest(transactional_id=transactional_id, acks=1, timeout_ms=1000,
                            topic_data=[{"name": "orders", "partition_data": [
                                {"index": 0, "records": records}]}])


CASES = [
    Case("Produce", produce(), (allow(R.TOPIC, "orders", Op.WRITE),), TOPIC_DENIED),
    Case("Produce", produce("tx", TXN_RECORDS),
         (allow(R.TRANSACTIONAL_ID, "tx", Op.WRITE), allow(R.TOPIC, "orders", Op.WRITE)),
         TXN_DENIED),
    Case("Fetch", k.FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=0, session_epoch=-1,
                                 topics=[{"topic": "orders", "partitions": [
                                     {"partition": 0, "fetch_offset": 0}]}]),
         (allow(R.TOPIC, "orders", Op.READ),), TOPIC_DENIED),
    Case("ListOffsets", k.ListOffsetsRequest(replica_id=-1, topics=[
        {"name": "orders", "partitions": [{"partition_index": 0, "timestamp": -1}]}]),
         (allow(R.TOPIC, "orders", Op.DESCRIBE),), TOPIC_DENIED),
    Case("OffsetForLeaderEpoch", k.OffsetForLeaderEpochRequest(replica_id=-1, topics=[
        {"topic": "orders", "partitions": [{"partition": 0, "leader_epoch": 0}]}]),
         (allow(R.TOPIC, "orders", Op.DESCRIBE),), TOPIC_DENIED),
    Case("Metadata", k.MetadataRequest(topics=[{"name": "orders"}], topics_is_null=False),
         (allow(R.TOPIC, "orders", Op.DESCRIBE),), TOPIC_DENIED),
    Case("Metadata", k.MetadataRequest(topics=[{"name": "fresh"}], topics_is_null=False,
                                       allow_auto_topic_creation=True),
         (allow(R.TOPIC, "fresh", Op.DESCRIBE), allow(R.TOPIC, "fresh", Op.CREATE)),
         TOPIC_DENIED),
    Case("DescribeProducers", k.DescribeProducersRequest(topics=[
        {"name": "orders", "partition_indexes": [0]}]),
         (allow(R.TOPIC, "orders", Op.READ),), TOPIC_DENIED),
    Case("DeleteRecords", k.DeleteRecordsRequest(timeout_ms=1000, topics=[
        {"name": "orders", "partitions": [{"partition_index": 0, "offset": 0}]}]),
         (allow(R.TOPIC, "orders", Op.DELETE),), TOPIC_DENIED),
    Case("CreateTopics", k.CreateTopicsRequest(timeout_ms=1000, topics=[
        {"name": "fresh", "num_partitions": 1, "replication_factor": 1}]),
         (allow(R.TOPIC, "fresh", Op.CREATE),), TOPIC_DENIED),
    Case("DeleteTopics", k.DeleteTopicsRequest(timeout_ms=1000, topics=[{"name": "secret"}]),
         (allow(R.TOPIC, "secret", Op.DELETE),), TOPIC_DENIED),
    Case("CreatePartitions", k.CreatePartitionsRequest(timeout_ms=1000, topics=[
        {"name": "orders", "count": 3}]), (allow(R.TOPIC, "orders", Op.ALTER),), TOPIC_DENIED),
    Case("DescribeConfigs", k.DescribeConfigsRequest(resources=[
        {"resource_type": 2, "resource_name": "orders"}]),
         (allow(R.TOPIC, "orders", Op.DESCRIBE_CONFIGS),), TOPIC_DENIED),
    Case("DescribeConfigs", k.DescribeConfigsRequest(resources=[
        {"resource_type": 4, "resource_name": "0"}]),
         (allow(R.CLUSTER, CLUSTER, Op.DESCRIBE_CONFIGS),), CLUSTER_DENIED),
    Case("AlterConfigs", k.AlterConfigsRequest(resources=[
        {"resource_type": 2, "resource_name": "orders",
         "configs": [{"name": "retention.ms", "value": "1000"}]}]),
         (allow(R.TOPIC, "orders", Op.ALTER_CONFIGS),), TOPIC_DENIED),
    Case("IncrementalAlterConfigs", k.IncrementalAlterConfigsRequest(resources=[
        {"resource_type": 4, "resource_name": "0"}]),
         (allow(R.CLUSTER, CLUSTER, Op.ALTER_CONFIGS),), CLUSTER_DENIED),
    Case("InitProducerId", k.InitProducerIdRequest(producer_id=-1, producer_epoch=-1),
         (allow(R.CLUSTER, CLUSTER, Op.IDEMPOTENT_WRITE),), CLUSTER_DENIED),
    Case("InitProducerId", k.InitProducerIdRequest(
        transactional_id="tx", transaction_timeout_ms=10_000, producer_id=-1,
        producer_epoch=-1), (allow(R.TRANSACTIONAL_ID, "tx", Op.WRITE),), TXN_DENIED),
    Case("FindCoordinator", k.FindCoordinatorRequest(key_type=0, coordinator_keys=["g"]),
         (allow(R.GROUP, "g", Op.DESCRIBE),), GROUP_DENIED, 4),
    Case("FindCoordinator", k.FindCoordinatorRequest(key_type=1, key="tx"),
         (allow(R.TRANSACTIONAL_ID, "tx", Op.DESCRIBE),), TXN_DENIED, 3),
    Case("JoinGroup", k.JoinGroupRequest(group_id="g", session_timeout_ms=10_000,
                                         rebalance_timeout_ms=10_000, member_id="m",
                                         protocol_type="consumer", protocols=[
                                             {"name": "range", "metadata": b""}]),
         (allow(R.GROUP, "g", Op.READ),), GROUP_DENIED, 9),
    Case("SyncGroup", k.SyncGroupRequest(group_id="g", generation_id=1, member_id="m"),
         (allow(R.GROUP, "g", Op.READ),), GROUP_DENIED),
    Case("Heartbeat", k.HeartbeatRequest(group_id="g", generation_id=1, member_id="m"),
         (allow(R.GROUP, "g", Op.READ),), GROUP_DENIED),
    Case("LeaveGroup", k.LeaveGroupRequest(group_id="g", members=[{"member_id": "m"}]),
         (allow(R.GROUP, "g", Op.READ),), GROUP_DENIED, 5),
    Case("DescribeGroups", k.DescribeGroupsRequest(groups=["g"]),
         (allow(R.GROUP, "g", Op.DESCRIBE),), GROUP_DENIED, 5),
    Case("DeleteGroups", k.DeleteGroupsRequest(groups_names=["g"]),
         (allow(R.GROUP, "g", Op.DELETE),), GROUP_DENIED),
    Case("OffsetCommit", k.OffsetCommitRequest(
        group_id="g", generation_id_or_member_epoch=-1, member_id="", retention_time_ms=-1,
        topics=[{"name": "orders", "partitions": [{"partition_index": 0,
                                                    "committed_offset": 1}]}]),
         (allow(R.GROUP, "g", Op.READ), allow(R.TOPIC, "orders", Op.READ)), GROUP_DENIED),
    Case("OffsetFetch", k.OffsetFetchRequest(groups=[
        {"group_id": "g", "topics": [{"name": "orders", "partition_indexes": [0]}]}]),
         (allow(R.GROUP, "g", Op.DESCRIBE), allow(R.TOPIC, "orders", Op.DESCRIBE)),
         GROUP_DENIED, 8),
    Case("OffsetDelete", k.OffsetDeleteRequest(group_id="g", topics=[
        {"name": "orders", "partitions": [{"partition_index": 0}]}]),
         (allow(R.GROUP, "g", Op.DELETE), allow(R.TOPIC, "orders", Op.READ)), GROUP_DENIED),
    Case("TxnOffsetCommit", k.TxnOffsetCommitRequest(
        transactional_id="tx", group_id="g", producer_id=1000, producer_epoch=0,
        generation_id=-1, member_id="", topics=[
            {"name": "orders", "partitions": [{"partition_index": 0, "committed_offset": 1}]}]),
         (allow(R.TRANSACTIONAL_ID, "tx", Op.WRITE), allow(R.GROUP, "g", Op.READ),
          allow(R.TOPIC, "orders", Op.READ)), TXN_DENIED, 3),
    Case("AddPartitionsToTxn", k.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id="tx", v3_and_below_producer_id=1000,
        v3_and_below_producer_epoch=0,
        v3_and_below_topics=[{"name": "orders", "partitions": [0]}]),
         (allow(R.TRANSACTIONAL_ID, "tx", Op.WRITE), allow(R.TOPIC, "orders", Op.WRITE)),
         TXN_DENIED, 3),
    Case("AddPartitionsToTxn", k.AddPartitionsToTxnRequest(transactions=[
        {"transactional_id": "tx", "producer_id": 1000, "producer_epoch": 0,
         "verify_only": True, "topics": [{"name": "orders", "partitions": [0]}]}]),
         (allow(R.CLUSTER, CLUSTER, Op.CLUSTER_ACTION),), CLUSTER_DENIED, 4),
    Case("AddOffsetsToTxn", k.AddOffsetsToTxnRequest(
        transactional_id="tx", producer_id=1000, producer_epoch=0, group_id="g"),
         (allow(R.TRANSACTIONAL_ID, "tx", Op.WRITE), allow(R.GROUP, "g", Op.READ)), TXN_DENIED),
    Case("EndTxn", k.EndTxnRequest(transactional_id="tx", producer_id=1000, producer_epoch=0,
                                   committed=False),
         (allow(R.TRANSACTIONAL_ID, "tx", Op.WRITE),), TXN_DENIED, 4),
    Case("WriteTxnMarkers", k.WriteTxnMarkersRequest(markers=[
        {"producer_id": 1000, "producer_epoch": 0, "transaction_result": False,
         "coordinator_epoch": 0, "topics": [{"name": "orders", "partition_indexes": [0]}]}]),
         (allow(R.CLUSTER, CLUSTER, Op.CLUSTER_ACTION),), CLUSTER_DENIED),
    Case("DescribeTransactions", k.DescribeTransactionsRequest(transactional_ids=["tx"]),
         (allow(R.TRANSACTIONAL_ID, "tx", Op.DESCRIBE),), TXN_DENIED),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_each_api_refuses_a_principal_without_the_acls_and_serves_one_with_them(case: Case):
    async def test(handler: Handler) -> None:
        # Bob has no ACLs; the resources have some (Alice's), so bob is denied, not defaulted.
        handler.use(case.acls)
        refused = await handler.call(case.method, case.request, "User:bob", case.version)
        codes = error_codes(refused)
        assert codes and set(codes) == {case.denied}, refused
        served = await handler.call(case.method, case.request, "User:alice", case.version)
        assert not AUTHORIZATION_ERRORS & set(error_codes(served)), served
        # A DENY for Alice on the first resource beats her ALLOWs.
        first = case.acls[0]
        handler.use((*case.acls, deny(first.resource_type, first.resource_name, Op.ALL)))
        again = await handler.call(case.method, case.request, "User:alice", case.version)
        assert case.denied in error_codes(again), again

    run(test)


def test_nothing_is_read_or_written_without_the_acl():
    async def test(handler: Handler) -> None:
        handler.use([allow(R.TOPIC, "orders", Op.READ)])
        written = await handler.call("Produce", produce(), "User:alice")
        assert error_codes(written) == [TOPIC_DENIED]
        handler.use([allow(R.TOPIC, "orders", Op.WRITE)])
        assert succeeded(await handler.call("Produce", produce(), "User:alice"))
        fetch = k.FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=0, session_epoch=-1,
                               topics=[{"topic": "orders", "partitions": [
                                   {"partition": 0, "fetch_offset": 0}]}])
        refused = await handler.call("Fetch", fetch, "User:alice")
        assert not refused.responses[0].partitions[0].records
        assert refused.responses[0].partitions[0].error_code == TOPIC_DENIED
        handler.use([allow(R.TOPIC, "orders", Op.READ)])
        read = await handler.call("Fetch", fetch, "User:alice")
        assert read.responses[0].partitions[0].error_code == 0
        assert read.responses[0].partitions[0].records == RECORDS

    run(test)


def test_unknown_topics_are_not_disclosed_to_a_principal_that_may_not_describe_them():
    async def test(handler: Handler) -> None:
        handler.use([allow(R.TOPIC, "orders", Op.ALL)])
        request = produce()
        request.topic_data[0].name = "missing"
        assert error_codes(await handler.call("Produce", request, "User:alice")) == [
            TOPIC_DENIED]
        handler.use([allow(R.TOPIC, "*", Op.ALL)])
        assert error_codes(await handler.call("Produce", request, "User:alice")) == [
            ErrorCode.unknown_topic_or_partition.value]

    run(test)


def test_metadata_lists_only_what_the_principal_may_describe():
    async def test(handler: Handler) -> None:
        handler.use([allow(R.TOPIC, "ord", Op.READ, pattern=PatternType.PREFIXED)])
        every = await handler.call("Metadata", k.MetadataRequest(topics_is_null=True))
        assert [t.name for t in every.topics] == ["orders"]
        none = await handler.call("Metadata", k.MetadataRequest(topics_is_null=True),
                                  "User:bob")
        assert not none.topics
        named = await handler.call("Metadata", k.MetadataRequest(
            topics=[{"name": "orders"}, {"name": "secret"}], topics_is_null=False,
            include_topic_authorized_operations=True,
            include_cluster_authorized_operations=True))
        by_name = {t.name: t for t in named.topics}
        assert by_name["secret"].error_code == TOPIC_DENIED
        assert by_name["orders"].error_code == 0
        assert by_name["orders"].topic_authorized_operations == operations_bitfield(
            [Op.READ, Op.DESCRIBE])
        assert named.cluster_authorized_operations == 0  # no DESCRIBE on the cluster
        # By id: an unauthorized topic is answered without its name.
        by_id = await handler.call("Metadata", k.MetadataRequest(
            topics=[{"topic_id": "0c0c0c0c-0000-0000-0000-000000000002"}],
            topics_is_null=False))
        assert by_id.topics[0].error_code == TOPIC_DENIED and not by_id.topics[0].name
        # Auto-creation needs CREATE: DESCRIBE alone answers TOPIC_AUTHORIZATION_FAILED and
        # creates nothing.
        handler.use([allow(R.TOPIC, "*", Op.DESCRIBE)])
        auto = await handler.call("Metadata", k.MetadataRequest(
            topics=[{"name": "fresh"}], topics_is_null=False, allow_auto_topic_creation=True))
        assert auto.topics[0].error_code == TOPIC_DENIED
        assert not handler.controller.created
        handler.use([allow(R.TOPIC, "*", Op.DESCRIBE), allow(R.CLUSTER, CLUSTER, Op.CREATE)])
        auto = await handler.call("Metadata", k.MetadataRequest(
            topics=[{"name": "fresh"}], topics_is_null=False, allow_auto_topic_creation=True))
        assert auto.topics[0].error_code != TOPIC_DENIED and handler.controller.created

    run(test)


def test_describe_cluster_reports_the_principals_cluster_operations():
    async def test(handler: Handler) -> None:
        handler.use([allow(R.CLUSTER, CLUSTER, Op.DESCRIBE), allow(R.CLUSTER, CLUSTER, Op.ALTER)])
        request = k.DescribeClusterRequest(include_cluster_authorized_operations=True,
                                           endpoint_type=1)
        alice = await handler.call("DescribeCluster", request)
        assert alice.cluster_authorized_operations == operations_bitfield(
            [Op.DESCRIBE, Op.ALTER])
        bob = await handler.call("DescribeCluster", request, "User:bob")
        assert bob.error_code == 0 and bob.cluster_authorized_operations == 0
        request.include_cluster_authorized_operations = False
        assert (await handler.call("DescribeCluster", request)
                ).cluster_authorized_operations == AUTHORIZED_OPERATIONS_OMITTED

    run(test)


def test_list_groups_and_transactions_show_only_what_the_principal_may_describe():
    async def test(handler: Handler) -> None:
        handler.use([allow(R.GROUP, "*", Op.READ), allow(R.TRANSACTIONAL_ID, "*", Op.WRITE),
                     allow(R.TOPIC, "*", Op.WRITE), allow(R.GROUP, "*", Op.DESCRIBE,
                                                          principal="User:carol")])
        for group in ("g1", "g2"):
            joined = await handler.call("JoinGroup", k.JoinGroupRequest(
                group_id=group, session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
                member_id="", protocol_type="consumer",
                protocols=[{"name": "range", "metadata": b""}]), version=3)
            assert joined.error_code == 0, joined
        init = await handler.call("InitProducerId", k.InitProducerIdRequest(
            transactional_id="tx", transaction_timeout_ms=10_000, producer_id=-1,
            producer_epoch=-1), version=4)
        assert init.error_code == 0, init
        added = await handler.call("AddPartitionsToTxn", k.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id="tx", v3_and_below_producer_id=init.producer_id,
            v3_and_below_producer_epoch=init.producer_epoch,
            v3_and_below_topics=[{"name": "orders", "partitions": [0]}]), version=3)
        assert succeeded(added), added

        async def groups(principal: str) -> set[str]:
            listed = await handler.call("ListGroups", k.ListGroupsRequest(), principal)
            return {g.group_id for g in listed.groups}

        assert await groups("User:alice") == {"g1", "g2"}  # READ implies DESCRIBE
        assert await groups("User:carol") == {"g1", "g2"}
        assert await groups("User:bob") == set()
        handler.use([allow(R.GROUP, "g1", Op.DESCRIBE, principal="User:bob"),
                     allow(R.TRANSACTIONAL_ID, "tx", Op.DESCRIBE, principal="User:bob")])
        assert await groups("User:bob") == {"g1"}
        handler.use([allow(R.CLUSTER, CLUSTER, Op.DESCRIBE, principal="User:bob")])
        assert await groups("User:bob") == {"g1", "g2"}

        async def transactions(principal: str) -> list[str]:
            listed = await handler.call("ListTransactions", k.ListTransactionsRequest(),
                                        principal)
            return [t.transactional_id for t in listed.transaction_states]

        handler.use([allow(R.TRANSACTIONAL_ID, "tx", Op.DESCRIBE, principal="User:bob")])
        assert await transactions("User:bob") == ["tx"]
        assert await transactions("User:dave") == []
        # DescribeTransactions leaves out the topics bob may not describe.
        described = await handler.call("DescribeTransactions", k.DescribeTransactionsRequest(
            transactional_ids=["tx"]), "User:bob")
        assert described.transaction_states[0].error_code == 0
        assert not described.transaction_states[0].topics
        handler.use([allow(R.TRANSACTIONAL_ID, "tx", Op.DESCRIBE, principal="User:bob"),
                     allow(R.TOPIC, "orders", Op.DESCRIBE, principal="User:bob")])
        described = await handler.call("DescribeTransactions", k.DescribeTransactionsRequest(
            transactional_ids=["tx"]), "User:bob")
        assert [t.topic for t in described.transaction_states[0].topics] == ["orders"]

    run(test)


def test_offset_fetch_answers_or_hides_topics_the_principal_may_not_describe():
    async def test(handler: Handler) -> None:
        handler.use([allow(R.GROUP, "g", Op.READ), allow(R.TOPIC, "orders", Op.READ),
                      allow(R.TOPIC, "secret", Op.READ)])
        committed = await handler.call("OffsetCommit", k.OffsetCommitRequest(
            group_id="g", generation_id_or_member_epoch=-1, member_id="", retention_time_ms=-1,
            topics=[{"name": n, "partitions": [{"partition_index": 0, "committed_offset": 5}]}
                    for n in ("orders", "secret")]), version=8)
        assert succeeded(committed), committed
        handler.use([allow(R.GROUP, "g", Op.READ), allow(R.TOPIC, "orders", Op.READ)])
        every = await handler.call("OffsetFetch", k.OffsetFetchRequest(groups=[
            {"group_id": "g", "topics_is_null": True}]), version=8)
        assert [t.name for t in every.groups[0].topics] == ["orders"]
        named = await handler.call("OffsetFetch", k.OffsetFetchRequest(groups=[
            {"group_id": "g", "topics": [{"name": n, "partition_indexes": [0]}
                                         for n in ("orders", "secret")]}]), version=8)
        answers = {t.name: t.partitions[0] for t in named.groups[0].topics}
        assert (answers["orders"].error_code, answers["orders"].committed_offset) == (0, 5)
        assert (answers["secret"].error_code, answers["secret"].committed_offset) == (
            TOPIC_DENIED, -1)
        # A commit with the group's READ but not the topic's: the topic is refused.
        refused = await handler.call("OffsetCommit", k.OffsetCommitRequest(
            group_id="g", generation_id_or_member_epoch=-1, member_id="", retention_time_ms=-1,
            topics=[{"name": "secret", "partitions": [{"partition_index": 0,
                                                        "committed_offset": 9}]}]), version=8)
        assert error_codes(refused) == [TOPIC_DENIED]

    run(test)


def test_idempotent_producers_need_idempotent_write_or_write_on_some_topic():
    async def test(handler: Handler) -> None:
        request = k.InitProducerIdRequest(producer_id=-1, producer_epoch=-1)
        handler.use([allow(R.TOPIC, "orders", Op.READ)])
        assert (await handler.call("InitProducerId", request)).error_code == CLUSTER_DENIED
        handler.use([allow(R.TOPIC, "ord", Op.WRITE, pattern=PatternType.PREFIXED)])
        assert (await handler.call("InitProducerId", request)).error_code == 0
        handler.use([allow(R.TOPIC, "orders", Op.WRITE), deny(R.TOPIC, "*", Op.WRITE)])
        assert (await handler.call("InitProducerId", request)).error_code == CLUSTER_DENIED

    run(test)


def test_super_users_and_allow_everyone_if_no_acl_found():
    async def test(handler: Handler) -> None:
        handler.use([deny(R.TOPIC, "*", Op.ALL, principal="User:*")])
        assert succeeded(await handler.call("Produce", produce(), "User:admin"))
        assert error_codes(await handler.call("Produce", produce(), "User:alice")) == [
            TOPIC_DENIED]

    run(test, super_users="User:admin;User:ops")

    async def lenient(handler: Handler) -> None:
        handler.use([allow(R.TOPIC, "secret", Op.READ)])
        assert succeeded(await handler.call("Produce", produce(), "User:bob"))
        secret = produce()
        secret.topic_data[0].name = "secret"
        assert error_codes(await handler.call("Produce", secret, "User:bob")) == [
            TOPIC_DENIED]

    run(lenient, allow_everyone_if_no_acl_found=True)


def test_without_the_authorizer_everything_is_allowed():
    async def test(handler: Handler) -> None:
        handler.use([deny(R.TOPIC, "*", Op.ALL, principal="User:*")])
        assert succeeded(await handler.call("Produce", produce(), "User:bob"))
        cluster = await handler.call("DescribeCluster", k.DescribeClusterRequest(
            include_cluster_authorized_operations=True, endpoint_type=1), "User:bob")
        assert cluster.cluster_authorized_operations == operations_bitfield(
            [Op.CREATE, Op.CLUSTER_ACTION, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS,
             Op.IDEMPOTENT_WRITE, Op.ALTER, Op.DESCRIBE])

    run(test, authorizer_enabled=False)


def test_delete_topics_by_id_tells_its_name_only_to_a_principal_that_may_describe_it():
    secret_id = "0c0c0c0c-0000-0000-0000-000000000002"

    async def test(handler: Handler) -> None:
        async def delete(principal: str, topic_id: str = secret_id) -> Any:
            answer = await handler.call("DeleteTopics", k.DeleteTopicsRequest(
                timeout_ms=1000, topics=[{"topic_id": topic_id}]), principal)
            return answer.responses[0]

        handler.use([allow(R.TOPIC, "secret", Op.DESCRIBE)])
        bob = await delete("User:bob")
        assert (bob.error_code, bob.HasField("name")) == (TOPIC_DENIED, False)
        alice = await delete("User:alice")
        assert (alice.error_code, alice.name) == (TOPIC_DENIED, "secret")
        unknown = await delete("User:alice", "0c0c0c0c-0000-0000-0000-0000000000ff")
        assert unknown.error_code == ErrorCode.unknown_topic_id.value
        assert not handler.controller.deleted
        handler.use([allow(R.TOPIC, "secret", Op.DELETE)])
        assert (await delete("User:alice")).error_code == 0
        assert handler.controller.deleted == [([], [secret_id])]

    run(test)


def test_created_topics_show_their_configs_only_with_describe_configs():
    async def test(handler: Handler) -> None:
        request = k.CreateTopicsRequest(timeout_ms=1000, validate_only=True, topics=[
            {"name": "fresh", "num_partitions": 1, "replication_factor": 1}])
        handler.use([allow(R.TOPIC, "fresh", Op.CREATE)])
        hidden = (await handler.call("CreateTopics", request)).topics[0]
        assert (hidden.error_code, hidden.topic_config_error_code) == (0, TOPIC_DENIED)
        assert not hidden.configs
        handler.use([allow(R.CLUSTER, CLUSTER, Op.CREATE),
                     allow(R.TOPIC, "fresh", Op.DESCRIBE_CONFIGS)])
        shown = (await handler.call("CreateTopics", request)).topics[0]
        assert shown.error_code == 0 and not shown.topic_config_error_code and shown.configs

    run(test)


def test_replicas_need_cluster_action():
    async def test(handler: Handler) -> None:
        fetch = k.FetchRequest(replica_id=1, max_wait_ms=0, min_bytes=0, session_epoch=-1,
                               topics=[{"topic": "orders", "partitions": [
                                   {"partition": 0, "fetch_offset": 0}]}])
        epochs = k.OffsetForLeaderEpochRequest(replica_id=1, topics=[
            {"topic": "orders", "partitions": [{"partition": 0, "leader_epoch": 0}]}])
        handler.use([allow(R.TOPIC, "orders", Op.ALL)])
        assert error_codes(await handler.call("Fetch", fetch)) == [TOPIC_DENIED]
        handler.use([allow(R.CLUSTER, CLUSTER, Op.CLUSTER_ACTION)])
        # Log nodes replicate through the replicator, not through Fetch.
        assert error_codes(await handler.call("Fetch", fetch)) == [
            ErrorCode.not_leader_or_follower.value]
        # CLUSTER_ACTION stands for DESCRIBE on every topic here.
        answer = await handler.call("OffsetForLeaderEpoch", epochs)
        assert not AUTHORIZATION_ERRORS & set(error_codes(answer)), answer

    run(test)


def test_a_regex_subscription_matches_only_the_topics_the_member_may_describe():
    """Kafka 4's regular expression resolution: with the authorizer on, the topics a
    member's expression matches are those its principal may DESCRIBE."""
    ids = {t.name: t.topic_id for t in TOPICS_BY_NAME}

    async def test(handler: Handler) -> None:
        handler.use([allow(R.GROUP, "*", Op.READ), allow(R.TOPIC, "orders", Op.DESCRIBE),
                     allow(R.GROUP, "*", Op.READ, principal="User:bob"),
                     allow(R.TOPIC, "*", Op.DESCRIBE, principal="User:bob")])

        async def assigned(group: str, principal: str) -> set[str]:
            beat = await handler.call("ConsumerGroupHeartbeat", k.ConsumerGroupHeartbeatRequest(
                group_id=group, member_id=f"{group}-member", member_epoch=0,
                rebalance_timeout_ms=10_000, subscribed_topic_regex="orders|secret",
                topic_partitions=[]), principal, version=1)
            assert beat.error_code == 0, beat
            return {tp.topic_id for tp in beat.assignment.topic_partitions}

        assert await assigned("alices", "User:alice") == {ids["orders"]}
        assert await assigned("bobs", "User:bob") == {ids["orders"], ids["secret"]}

    run(test)
