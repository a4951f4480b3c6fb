"""Authorization end to end, through real clients, on a cluster of its own: a
SASL_PLAINTEXT listener with SCRAM-SHA-512, handlers with the authorizer on and
``super.users=User:admin`` (the admin's password from the users file). The admin creates every
other user with AlterUserScramCredentials, and they log in with SCRAM from the cluster metadata.

The ACL matrix: for each API a fresh user is refused with the error Kafka's broker gives, as
the client surfaces it, until the admin grants exactly the ACLs the API needs, one at a time;
then the call succeeds. Listings show only what the user may describe. A DENY beats an ALLOW,
PREFIXED patterns and ``User:*`` match, and a deleted ACL stops applying. Client quotas set
with AlterClientQuotas for one user throttle that user's producer and no other, until they are
removed.

The clients are confluent-kafka, and kafka-python where librdkafka lacks the API
(DescribeProducers, OffsetDelete) or hides the broker's answer; raw requests on a SCRAM
connection where no client sends the request at all (Fetch and ListOffsets on a topic the
user may not describe, whose leader the clients never learn; the client quota APIs)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import count

import kafka.errors
import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    ElectionType,
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kafka import KafkaAdminClient
from kafka.admin import (
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ResourcePatternFilter,
)
from kafka.admin import ResourceType as KResourceType
from kafka.structs import TopicPartition as KTopicPartition
from kio.schema.alter_client_quotas.v1 import request as alter_quotas
from kio.schema.describe_client_quotas.v1 import request as describe_quotas
from kio.schema.list_offsets.v8 import request as list_offsets_v8
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import f64, i8, i32, i64

from services.local_cluster import ClusterSpec, LocalCluster, free_port_range
from tests.frontend.sasl_client import ScramClient, authenticate, handshake

from .test_client_quotas import PRODUCE_QUOTA, ProducerRun
from .test_long_poll import fetch_request
from .wire import encode_request, read_response

HOST = "127.0.0.1"
MECHANISM = "SCRAM-SHA-512"
ADMIN_PASSWORD = "admin-secret"
TIMEOUT = 15
WINDOWS = 3  # quota windows of 1 s: a new client's burst allowance stays short


@dataclass
class Secure:
    cluster: LocalCluster
    admin: AdminClient

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    folder = tmp_path_factory.mktemp("authorization")
    users = folder / "users.txt"
    users.write_text(f"admin:{ADMIN_PASSWORD}\n")
    kafka_port = free_port_range(HOST, 1)
    spec = ClusterSpec(
        data_dir=folder / "cluster", kafka_port=kafka_port, base_port=0, handlers=1, log_nodes=1,
        log_level=os.environ.get("KBROKER_TEST_LOG_LEVEL", "INFO"),
        group_initial_rebalance_delay_ms=0,
        service_flags={
            "frontend": {"listeners": f"SASL_PLAINTEXT://{HOST}:{kafka_port}",
                         "sasl_enabled_mechanisms": MECHANISM, "sasl_users_file": users,
                         "quota_window_num": WINDOWS, "quota_window_size_seconds": 1},
            "handler": {"authorizer_enabled": True, "super_users": "User:admin"}})
    cluster = LocalCluster(spec)
    cluster.start()
    secure = Secure(cluster, AdminClient(client_config(cluster.bootstrap, "admin",
                                                       ADMIN_PASSWORD)))
    try:
        yield secure
    finally:
        # confluent-kafka clients have no close: the admin client goes (and stops its
        # threads) when its last reference does, before the cluster it talks to.
        del secure.admin
        gc.collect()
        cluster.stop()


@contextlib.contextmanager
def producing(config: dict[str, object]) -> Iterator[Producer]:
    """A producer that is gone when the block ends, whatever happened: its queued messages
    dropped, its threads stopped (an unreferenced one lingers until garbage collection,
    reconnecting to a cluster long stopped)."""
    producer = Producer(config)
    try:
        yield producer
    finally:
        producer.purge()
        # Closing aborts an open transaction, which fails when the transaction already did
        # (an authorization error): the block's own error is the one that counts.
        with contextlib.suppress(KafkaException):
            producer.close()


def client_config(bootstrap: str, user: str, password: str) -> dict[str, object]:
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": MECHANISM, "sasl.username": user, "sasl.password": password}


def wait_until(condition: Callable[[], bool], message: str | Callable[[], str],
               within: float = TIMEOUT) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, (
            f"{message if isinstance(message, str) else message()}: not within {within}s")
        time.sleep(0.2)


_users = count()


def new_user(secure: Secure) -> tuple[str, str]:
    """A user the admin creates with AlterUserScramCredentials; returned once it logs in."""
    user, password = f"user-{next(_users)}", "pw-" + os.urandom(6).hex()
    upsert = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode())
    secure.admin.alter_user_scram_credentials([upsert], request_timeout=TIMEOUT)[user].result(
        TIMEOUT)

    def logs_in() -> bool:
        try:
            AdminClient(client_config(secure.bootstrap, user, password)).list_topics(timeout=3)
        except KafkaException:
            return False
        return True

    wait_until(logs_in, f"{user} logging in with SCRAM")
    return user, password


@dataclass
class Ctx:
    """One matrix case's user and the resources it works on."""

    secure: Secure
    user: str
    password: str
    topic: str
    config: dict[str, object] = field(init=False)

    def __post_init__(self) -> None:
        self.config = client_config(self.secure.bootstrap, self.user, self.password)

    @property
    def group(self) -> str:
        return f"{self.topic}-g"

    @property
    def transactional_id(self) -> str:
        return f"{self.topic}-t"

    def admin(self) -> AdminClient:
        return AdminClient(self.config)

    def kafka_python_settings(self) -> dict[str, object]:
        return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": MECHANISM,
                "sasl_plain_username": self.user, "sasl_plain_password": self.password,
                "request_timeout_ms": 10000}

    def kafka_python_admin(self) -> KafkaAdminClient:
        return KafkaAdminClient(bootstrap_servers=self.secure.bootstrap,
                                **self.kafka_python_settings())

    def binding(self, resource: str, operation: AclOperation,
                permission: AclPermissionType = AclPermissionType.ALLOW,
                pattern: ResourcePatternType = ResourcePatternType.LITERAL,
                name: str | None = None, principal: str | None = None,
                host: str = "*") -> AclBinding:
        names = {"TOPIC": self.topic, "GROUP": self.group,
                 "TRANSACTIONAL_ID": self.transactional_id, "BROKER": "kafka-cluster"}
        return AclBinding(ResourceType[resource], name or names[resource], pattern,
                          principal or f"User:{self.user}", host, operation, permission)


def grant(secure: Secure, bindings: Sequence[AclBinding]) -> None:
    if bindings:
        for future in secure.admin.create_acls(list(bindings), request_timeout=TIMEOUT).values():
            assert future.result(TIMEOUT) is None


def revoke(secure: Secure, binding: AclBinding) -> None:
    acl_filter = AclBindingFilter(binding.restype, binding.name, binding.resource_pattern_type,
                                  binding.principal, binding.host, binding.operation,
                                  binding.permission_type)
    deleted = secure.admin.delete_acls([acl_filter], request_timeout=TIMEOUT)[acl_filter].result(
        TIMEOUT)
    assert len(deleted) == 1


# --- what the clients do --------------------------------------------------------------------

def raise_for(error: KafkaError | None) -> None:
    if error is not None:
        raise KafkaException(error)


def raise_partition_errors(partitions: Sequence[TopicPartition]) -> None:
    for partition in partitions:
        raise_for(partition.error)


def produce_one(ctx: Ctx, **settings: object) -> None:
    fatal: list[KafkaError] = []
    delivered: list[KafkaError | None] = []

    def on_error(error: KafkaError) -> None:
        if error.fatal():
            fatal.append(error)

    def on_delivery(error: KafkaError | None, _message: object) -> None:
        delivered.append(error)

    try:
        with producing({**ctx.config, "message.timeout.ms": 8000, "linger.ms": 0,
                        "error_cb": on_error, **settings}) as producer:
            producer.produce(ctx.topic, b"value", on_delivery=on_delivery)
            assert producer.flush(TIMEOUT) == 0
    except KafkaException as e:  # librdkafka raises a fatal error from the callbacks' poll
        fatal.append(e.args[0])
    except SystemError as e:  # ... or while a callback runs
        if not isinstance(e.__context__, KafkaException):
            raise
        fatal.append(e.__context__.args[0])
    if fatal:
        # librdkafka answers the delivery with _FATAL; the broker's error is the fatal one.
        raise KafkaException(fatal[0])
    (error,) = delivered
    raise_for(error)


def produce_idempotently(ctx: Ctx) -> None:
    produce_one(ctx, **{"enable.idempotence": True})


def produce_in_a_transaction(ctx: Ctx) -> None:
    with producing({**ctx.config, "transactional.id": ctx.transactional_id,
                    "transaction.timeout.ms": 10000}) as producer:
        producer.init_transactions(TIMEOUT)
        producer.begin_transaction()
        producer.produce(ctx.topic, b"in a transaction")
        producer.commit_transaction(TIMEOUT)


def commit_offsets_in_a_transaction(ctx: Ctx) -> None:
    consumer = Consumer({**ctx.config, "group.id": ctx.group})
    try:
        with producing({**ctx.config, "transactional.id": ctx.transactional_id,
                        "transaction.timeout.ms": 10000}) as producer:
            producer.init_transactions(TIMEOUT)
            producer.begin_transaction()
            producer.send_offsets_to_transaction([TopicPartition(ctx.topic, 0, 1)],
                                                 consumer.consumer_group_metadata(), TIMEOUT)
            producer.commit_transaction(TIMEOUT)
    finally:
        consumer.close()


def describe_transaction(ctx: Ctx) -> None:  # DescribeTransactions: kafka-python only
    admin = ctx.kafka_python_admin()
    try:
        assert ctx.transactional_id in admin.describe_transactions([ctx.transactional_id])
    finally:
        admin.close()


def poll_one(consumer: Consumer) -> None:
    """Poll until a record (returns) or an error (raised)."""
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.3)
            if message is not None:
                raise_for(message.error())
                return
        raise AssertionError("neither a record nor an error")
    finally:
        consumer.close()


def fetch(ctx: Ctx) -> None:
    """A raw Fetch: a client fetching assigned partitions of a topic it may not describe
    learns no leader and sends none (librdkafka and kafka-python wait quietly)."""
    response = sasl_request(ctx.secure.bootstrap, ctx.user, ctx.password,
                            fetch_request(ctx.topic, 0, max_wait_ms=0))
    ((partition,),) = (t.partitions for t in response.responses)  # type: ignore[attr-defined]
    if partition.error_code:
        raise KafkaException(KafkaError(int(partition.error_code)))
    assert partition.records, "the records were fetched"


def consume_in_a_group(ctx: Ctx) -> None:
    consumer = Consumer({**ctx.config, "group.id": ctx.group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "session.timeout.ms": 6000})
    consumer.subscribe([ctx.topic])
    poll_one(consumer)


def list_offsets(ctx: Ctx) -> None:
    """A raw request: without DESCRIBE the clients learn no leader to send ListOffsets to."""
    request = list_offsets_v8.ListOffsetsRequest(
        replica_id=BrokerId(-1), isolation_level=i8(0), topics=(list_offsets_v8.ListOffsetsTopic(
            name=TopicName(ctx.topic), partitions=(list_offsets_v8.ListOffsetsPartition(
                partition_index=i32(0), current_leader_epoch=i32(-1), timestamp=i64(-1)),)),))
    response = sasl_request(ctx.secure.bootstrap, ctx.user, ctx.password, request)
    ((partition,),) = (t.partitions for t in response.topics)  # type: ignore[attr-defined]
    if partition.error_code:
        raise KafkaException(KafkaError(int(partition.error_code)))


def create_topic(ctx: Ctx) -> None:
    admin = ctx.admin()
    admin.create_topics([NewTopic(ctx.topic, 1, 1)], request_timeout=TIMEOUT)[
        ctx.topic].result(TIMEOUT)


def delete_topic(ctx: Ctx) -> None:
    admin = ctx.admin()
    admin.delete_topics([ctx.topic], request_timeout=TIMEOUT)[ctx.topic].result(TIMEOUT)


def describe_topic_configs(ctx: Ctx) -> None:
    resource = ConfigResource(ResourceType.TOPIC, ctx.topic)
    admin = ctx.admin()
    admin.describe_configs([resource], request_timeout=TIMEOUT)[resource].result(TIMEOUT)


def describe_broker_configs(ctx: Ctx) -> None:
    broker = next(iter(ctx.secure.admin.list_topics(timeout=TIMEOUT).brokers))
    resource = ConfigResource(ResourceType.BROKER, str(broker))
    admin = ctx.admin()
    admin.describe_configs([resource], request_timeout=TIMEOUT)[resource].result(TIMEOUT)


def alter_broker_configs(ctx: Ctx) -> None:
    resource = ConfigResource(ResourceType.BROKER, str(only_broker(ctx)), incremental_configs=[
        ConfigEntry("log.retention.ms", "604800000",
                    incremental_operation=AlterConfigOpType.SET)])
    admin = ctx.admin()
    admin.incremental_alter_configs([resource], request_timeout=TIMEOUT)[resource].result(
        TIMEOUT)


def alter_topic_configs(ctx: Ctx) -> None:
    resource = ConfigResource(ResourceType.TOPIC, ctx.topic, incremental_configs=[ConfigEntry(
        "retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)])
    admin = ctx.admin()
    admin.incremental_alter_configs([resource], request_timeout=TIMEOUT)[
        resource].result(TIMEOUT)


def create_partitions(ctx: Ctx) -> None:
    admin = ctx.admin()
    admin.create_partitions([NewPartitions(ctx.topic, 2)], request_timeout=TIMEOUT)[
        ctx.topic].result(TIMEOUT)


def elect_leaders(ctx: Ctx) -> None:
    partition = TopicPartition(ctx.topic, 0)
    admin = ctx.admin()  # kept until the answer: a collected client cancels its requests
    results = admin.elect_leaders(ElectionType.PREFERRED, [partition]).result(TIMEOUT)
    error = results[partition]
    if error is not None:
        raise error if isinstance(error, KafkaException) else KafkaException(error)


def describe_log_dirs(ctx: Ctx) -> None:
    """kafka-python: its answer carries the error code (v3+) instead of raising it."""
    admin = ctx.kafka_python_admin()
    try:
        (answer,) = admin.describe_log_dirs(brokers=[only_broker(ctx)])
    finally:
        admin.close()
    if not answer["log_dirs"]:
        raise KafkaException(KafkaError(E.CLUSTER_AUTHORIZATION_FAILED))


def only_broker(ctx: Ctx) -> int:
    return next(iter(ctx.secure.admin.list_topics(timeout=TIMEOUT).brokers))


def delete_records(ctx: Ctx) -> None:
    """kafka-python, sent to the leader: librdkafka (and kafka-python by default) first look
    the leader up, and answer a topic the user may not describe with an error of their own."""
    admin = ctx.kafka_python_admin()
    try:
        admin.delete_records({KTopicPartition(ctx.topic, 0): 1},
                             partition_leader_id=only_broker(ctx))
    finally:
        admin.close()


def commit_offsets(ctx: Ctx) -> None:
    request = ConsumerGroupTopicPartitions(ctx.group, [TopicPartition(ctx.topic, 0, 1)])
    admin = ctx.admin()
    result = admin.alter_consumer_group_offsets([request], request_timeout=TIMEOUT)[
        ctx.group].result(TIMEOUT)
    raise_partition_errors(result.topic_partitions)


def fetch_offsets(ctx: Ctx) -> None:
    request = ConsumerGroupTopicPartitions(ctx.group, [TopicPartition(ctx.topic, 0)])
    admin = ctx.admin()
    result = admin.list_consumer_group_offsets([request], request_timeout=TIMEOUT)[
        ctx.group].result(TIMEOUT)
    raise_partition_errors(result.topic_partitions)


def describe_group(ctx: Ctx) -> None:
    admin = ctx.admin()
    admin.describe_consumer_groups([ctx.group], request_timeout=TIMEOUT)[
        ctx.group].result(TIMEOUT)


def delete_group(ctx: Ctx) -> None:
    admin = ctx.admin()
    admin.delete_consumer_groups([ctx.group], request_timeout=TIMEOUT)[
        ctx.group].result(TIMEOUT)


def delete_group_offsets(ctx: Ctx) -> None:  # OffsetDelete: kafka-python only
    admin = ctx.kafka_python_admin()
    try:
        result = admin.delete_group_offsets(ctx.group, [KTopicPartition(ctx.topic, 0)])
    finally:
        admin.close()
    for error in result.values():
        if error is not None and error.errno:
            raise error


def describe_producers(ctx: Ctx) -> None:  # DescribeProducers: kafka-python only
    admin = ctx.kafka_python_admin()
    try:
        admin.describe_producers([KTopicPartition(ctx.topic, 0)], broker_id=only_broker(ctx))
    finally:
        admin.close()


def describe_acls(ctx: Ctx) -> None:
    """kafka-python: librdkafka 2.16 answers a DescribeAcls error with an empty list."""
    admin = ctx.kafka_python_admin()
    try:
        admin.describe_acls(ACLFilter(
            principal=None, host=None, operation=ACLOperation.ANY,
            permission_type=ACLPermissionType.ANY, resource_pattern=ResourcePatternFilter(
                KResourceType.ANY, None, ACLResourcePatternType.ANY)))
    finally:
        admin.close()


def create_acl(ctx: Ctx) -> None:
    binding = ctx.binding("TOPIC", AclOperation.READ, principal="User:someone-else")
    admin = ctx.admin()
    admin.create_acls([binding], request_timeout=TIMEOUT)[binding].result(TIMEOUT)


def delete_acls(ctx: Ctx) -> None:
    nobody = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:nobody",
                              None, AclOperation.ANY, AclPermissionType.ANY)
    admin = ctx.admin()
    admin.delete_acls([nobody], request_timeout=TIMEOUT)[nobody].result(TIMEOUT)


def describe_scram_users(ctx: Ctx) -> None:
    """kafka-python: librdkafka 2.16 crashes (munmap_chunk) on the error answer Kafka's broker
    gives, one result per user asked about, each with an empty name."""
    admin = ctx.kafka_python_admin()
    try:
        described = admin.describe_user_scram_credentials([ctx.user])
    finally:
        admin.close()
    assert described[ctx.user]["error"] is None


def alter_scram_users(ctx: Ctx) -> None:
    name = f"{ctx.user}-made"
    upsert = UserScramCredentialUpsertion(
        name, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"pw")
    admin = ctx.admin()
    admin.alter_user_scram_credentials([upsert], request_timeout=TIMEOUT)[name].result(
        TIMEOUT)


# Client quotas: no installed client speaks DescribeClientQuotas and AlterClientQuotas, so
# these are raw requests on a connection authenticated with SCRAM.

_correlation = count(100)


def sasl_request(bootstrap: str, user: str, password: str, request: object) -> object:
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock:
        def call(message: object) -> object:
            sock.sendall(encode_request(message, next(_correlation)))
            return read_response(sock, type(message))[1]

        assert call(handshake(MECHANISM)).error_code == 0  # type: ignore[attr-defined]
        scram = ScramClient(MECHANISM, user, password)
        first = call(authenticate(scram.first()))
        assert first.error_code == 0, first  # type: ignore[attr-defined]
        final = call(authenticate(scram.final(first.auth_bytes)))  # type: ignore[attr-defined]
        assert final.error_code == 0, final  # type: ignore[attr-defined]
        return call(request)


def alter_quota_request(user: str | None, **values: float | None) -> object:
    """AlterClientQuotas for ``user`` (None: the default user's quotas)."""
    return alter_quotas.AlterClientQuotasRequest(validate_only=False, entries=(
        alter_quotas.EntryData(
            entity=(alter_quotas.EntityData(entity_type="user", entity_name=user),),
            ops=tuple(alter_quotas.OpData(key=key, value=f64(float(value or 0.0)),
                                          remove=value is None)
                      for key, value in values.items())),))


def alter_client_quotas(ctx: Ctx) -> None:
    response = sasl_request(ctx.secure.bootstrap, ctx.user, ctx.password,
                            alter_quota_request(f"{ctx.user}-quota", request_percentage=90.0))
    (entry,) = response.entries  # type: ignore[attr-defined]
    if entry.error_code:
        raise KafkaException(KafkaError(int(entry.error_code)))


def describe_client_quotas(ctx: Ctx) -> None:
    response = sasl_request(ctx.secure.bootstrap, ctx.user, ctx.password,
                            describe_quotas.DescribeClientQuotasRequest(strict=False, components=(
                                describe_quotas.ComponentData(entity_type="user",
                                                              match_type=i8(1), match=None),)))
    if response.error_code:  # type: ignore[attr-defined]
        raise KafkaException(KafkaError(int(response.error_code)))  # type: ignore[attr-defined]


# --- what is prepared, by the admin ---------------------------------------------------------

def a_topic(ctx: Ctx) -> None:
    ctx.secure.admin.create_topics([NewTopic(ctx.topic, 1, 1)], request_timeout=TIMEOUT)[
        ctx.topic].result(TIMEOUT)


def a_topic_with_records(ctx: Ctx) -> None:
    a_topic(ctx)
    with producing({**client_config(ctx.secure.bootstrap, "admin", ADMIN_PASSWORD),
                    "linger.ms": 0}) as producer:
        for value in (b"first", b"second"):
            producer.produce(ctx.topic, value, partition=0)
        assert producer.flush(TIMEOUT) == 0


def a_transaction(ctx: Ctx) -> None:
    a_topic(ctx)
    a_transaction_on_the_topic(ctx)


def a_transaction_on_the_topic(ctx: Ctx) -> None:
    with producing({**client_config(ctx.secure.bootstrap, "admin", ADMIN_PASSWORD),
                    "transactional.id": ctx.transactional_id}) as producer:
        producer.init_transactions(TIMEOUT)
        producer.begin_transaction()
        producer.produce(ctx.topic, b"committed")
        producer.commit_transaction(TIMEOUT)


def a_group_with_offsets(ctx: Ctx) -> None:
    a_topic_with_records(ctx)
    request = ConsumerGroupTopicPartitions(ctx.group, [TopicPartition(ctx.topic, 0, 1)])
    result = ctx.secure.admin.alter_consumer_group_offsets([request], request_timeout=TIMEOUT)[
        ctx.group].result(TIMEOUT)
    raise_partition_errors(result.topic_partitions)


# --- the matrix -----------------------------------------------------------------------------

Grant = tuple[str, AclOperation]  # resource (TOPIC, GROUP, TRANSACTIONAL_ID, BROKER), operation
E = KafkaError
TOPIC_DENIED, GROUP_DENIED = E.TOPIC_AUTHORIZATION_FAILED, E.GROUP_AUTHORIZATION_FAILED
CLUSTER_DENIED = E.CLUSTER_AUTHORIZATION_FAILED


@dataclass(frozen=True)
class Case:
    action: Callable[[Ctx], None]
    # The error while the next grant is missing, and the grant, in order; then it succeeds.
    steps: tuple[tuple[int, Grant], ...]
    prepare: Callable[[Ctx], None] | None = None
    given: tuple[Grant, ...] = ()  # granted before the first check
    granted: int = 0  # the outcome with every grant


CASES = {
    "produce": Case(produce_one, ((TOPIC_DENIED, ("TOPIC", AclOperation.WRITE)),), a_topic),
    "fetch": Case(fetch, ((TOPIC_DENIED, ("TOPIC", AclOperation.READ)),),
                  a_topic_with_records),
    "consume-subscribed": Case(consume_in_a_group,
                               ((TOPIC_DENIED, ("TOPIC", AclOperation.READ)),),
                               a_topic_with_records, given=(("GROUP", AclOperation.READ),)),
    "consume-in-a-group": Case(consume_in_a_group,
                               ((GROUP_DENIED, ("GROUP", AclOperation.READ)),),
                               a_topic_with_records, given=(("TOPIC", AclOperation.READ),)),
    "list-offsets": Case(list_offsets, ((TOPIC_DENIED, ("TOPIC", AclOperation.DESCRIBE)),),
                         a_topic),
    "auto-topic-creation": Case(produce_one, ((TOPIC_DENIED, ("TOPIC", AclOperation.CREATE)),),
                                given=(("TOPIC", AclOperation.WRITE),)),
    "create-topics": Case(create_topic, ((TOPIC_DENIED, ("TOPIC", AclOperation.CREATE)),)),
    "create-topics-with-cluster-create": Case(create_topic, (
        (TOPIC_DENIED, ("BROKER", AclOperation.CREATE)),)),
    "auto-topic-creation-with-cluster-create": Case(produce_one, (
        (TOPIC_DENIED, ("BROKER", AclOperation.CREATE)),), given=(("TOPIC", AclOperation.WRITE),)),
    "delete-topics": Case(delete_topic, ((TOPIC_DENIED, ("TOPIC", AclOperation.DELETE)),),
                          a_topic),
    "describe-topic-configs": Case(describe_topic_configs, (
        (TOPIC_DENIED, ("TOPIC", AclOperation.DESCRIBE_CONFIGS)),), a_topic),
    "describe-broker-configs": Case(describe_broker_configs, (
        (CLUSTER_DENIED, ("BROKER", AclOperation.DESCRIBE_CONFIGS)),)),
    # Authorized, a broker config change is refused: broker configs are static here.
    "alter-broker-configs": Case(alter_broker_configs, (
        (CLUSTER_DENIED, ("BROKER", AclOperation.ALTER_CONFIGS)),),
        granted=E.INVALID_REQUEST),
    "alter-topic-configs": Case(alter_topic_configs, (
        (TOPIC_DENIED, ("TOPIC", AclOperation.ALTER_CONFIGS)),), a_topic),
    "describe-log-dirs": Case(describe_log_dirs, (
        (CLUSTER_DENIED, ("BROKER", AclOperation.DESCRIBE)),)),
    # Authorized, the one replica leads already.
    "elect-leaders": Case(elect_leaders, ((CLUSTER_DENIED, ("BROKER", AclOperation.ALTER)),),
                          a_topic, granted=E.ELECTION_NOT_NEEDED),
    "create-partitions": Case(create_partitions, ((TOPIC_DENIED, ("TOPIC", AclOperation.ALTER)),),
                              a_topic),
    "delete-records": Case(delete_records, ((TOPIC_DENIED, ("TOPIC", AclOperation.DELETE)),),
                           a_topic_with_records),
    "commit-offsets": Case(commit_offsets, ((GROUP_DENIED, ("GROUP", AclOperation.READ)),
                                            (TOPIC_DENIED, ("TOPIC", AclOperation.READ))),
                           a_topic),
    "fetch-offsets": Case(fetch_offsets, ((GROUP_DENIED, ("GROUP", AclOperation.DESCRIBE)),
                                          (TOPIC_DENIED, ("TOPIC", AclOperation.DESCRIBE))),
                          a_group_with_offsets),
    "describe-groups": Case(describe_group, ((GROUP_DENIED, ("GROUP", AclOperation.DESCRIBE)),),
                            a_group_with_offsets),
    "delete-groups": Case(delete_group, ((GROUP_DENIED, ("GROUP", AclOperation.DELETE)),),
                          a_group_with_offsets),
    "delete-group-offsets": Case(delete_group_offsets, (
        (GROUP_DENIED, ("GROUP", AclOperation.DELETE)),
        (TOPIC_DENIED, ("TOPIC", AclOperation.READ))), a_group_with_offsets),
    "describe-producers": Case(describe_producers, (
        (TOPIC_DENIED, ("TOPIC", AclOperation.READ)),), a_topic),
    "idempotent-producer": Case(produce_idempotently, (
        (CLUSTER_DENIED, ("BROKER", AclOperation.IDEMPOTENT_WRITE)),
        (TOPIC_DENIED, ("TOPIC", AclOperation.WRITE))), a_topic,
        given=(("TOPIC", AclOperation.DESCRIBE),)),
    # KIP-679: WRITE on any topic stands for IDEMPOTENT_WRITE.
    "idempotent-producer-with-write": Case(produce_idempotently, (
        (CLUSTER_DENIED, ("TOPIC", AclOperation.WRITE)),), a_topic,
        given=(("TOPIC", AclOperation.DESCRIBE),)),
    "transactional-producer": Case(produce_in_a_transaction, (
        (E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
         ("TRANSACTIONAL_ID", AclOperation.WRITE)),), a_topic,
        given=(("TOPIC", AclOperation.WRITE),)),
    "transactional-produce": Case(produce_in_a_transaction, (
        (TOPIC_DENIED, ("TOPIC", AclOperation.WRITE)),), a_topic,
        given=(("TRANSACTIONAL_ID", AclOperation.WRITE), ("TOPIC", AclOperation.DESCRIBE))),
    "transactional-offset-commit": Case(commit_offsets_in_a_transaction, (
        (GROUP_DENIED, ("GROUP", AclOperation.READ)),
        (TOPIC_DENIED, ("TOPIC", AclOperation.READ))), a_topic,
        given=(("TRANSACTIONAL_ID", AclOperation.WRITE),)),
    "describe-transactions": Case(describe_transaction, (
        (E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
         ("TRANSACTIONAL_ID", AclOperation.DESCRIBE)),), a_transaction),
    "describe-acls": Case(describe_acls, ((CLUSTER_DENIED, ("BROKER", AclOperation.DESCRIBE)),)),
    "create-acls": Case(create_acl, ((CLUSTER_DENIED, ("BROKER", AclOperation.ALTER)),)),
    "delete-acls": Case(delete_acls, ((CLUSTER_DENIED, ("BROKER", AclOperation.ALTER)),)),
    "describe-scram-credentials": Case(describe_scram_users, (
        (CLUSTER_DENIED, ("BROKER", AclOperation.DESCRIBE)),)),
    "alter-scram-credentials": Case(alter_scram_users, (
        (CLUSTER_DENIED, ("BROKER", AclOperation.ALTER)),)),
    "describe-client-quotas": Case(describe_client_quotas, (
        (CLUSTER_DENIED, ("BROKER", AclOperation.DESCRIBE_CONFIGS)),)),
    "alter-client-quotas": Case(alter_client_quotas, (
        (CLUSTER_DENIED, ("BROKER", AclOperation.ALTER_CONFIGS)),)),
}


def outcome(action: Callable[[Ctx], None], ctx: Ctx) -> int:
    """0 when the action succeeds, else the Kafka error code the client surfaced."""
    try:
        action(ctx)
    except KafkaException as e:
        return int(e.args[0].code())
    except kafka.errors.KafkaError as e:
        return int(e.errno)  # type: ignore[attr-defined]
    except concurrent.futures.TimeoutError:
        return -1
    return 0


def wait_for_outcome(action: Callable[[Ctx], None], ctx: Ctx, expected: int) -> None:
    """ACLs reach the handlers with the cluster metadata, a moment after CreateAcls."""
    seen: list[int] = []

    def reached() -> bool:
        seen.append(outcome(action, ctx))
        return seen[-1] == expected

    wait_until(reached, lambda: f"outcome {expected} (seen {seen})")


@pytest.fixture()
def ctx(secure: Secure, topic_name: str) -> Ctx:
    return Ctx(secure, *new_user(secure), topic_name)


@pytest.mark.parametrize("name", CASES)
def test_each_api_is_refused_until_its_acls_are_granted(ctx: Ctx, name: str) -> None:
    case = CASES[name]
    if case.prepare:
        case.prepare(ctx)
    grant(ctx.secure, [ctx.binding(*g) for g in case.given])
    for error, needed in case.steps:
        wait_for_outcome(case.action, ctx, error)
        grant(ctx.secure, [ctx.binding(*needed)])
    wait_for_outcome(case.action, ctx, case.granted)


# --- what listings show ---------------------------------------------------------------------

def test_listings_show_only_what_the_user_may_describe(ctx: Ctx) -> None:
    a_group_with_offsets(ctx)
    other_group = f"{ctx.group}-other"
    request = ConsumerGroupTopicPartitions(other_group, [TopicPartition(ctx.topic, 0, 1)])
    ctx.secure.admin.alter_consumer_group_offsets([request], request_timeout=TIMEOUT)[
        other_group].result(TIMEOUT)
    a_transaction_on_the_topic(ctx)
    admin = ctx.admin()
    assert ctx.topic in ctx.secure.admin.list_topics(timeout=TIMEOUT).topics

    def requested() -> int:
        error = admin.list_topics(ctx.topic, timeout=TIMEOUT).topics[ctx.topic].error
        return 0 if error is None else error.code()

    def listed_topics() -> set[str]:
        return set(admin.list_topics(timeout=TIMEOUT).topics)

    def listed_groups() -> set[str]:
        return {g.group_id for g in admin.list_consumer_groups(request_timeout=TIMEOUT).result(
            TIMEOUT).valid}

    def listed_transactions() -> set[str]:  # ListTransactions: kafka-python only
        python_admin = ctx.kafka_python_admin()
        try:
            return {t.transactional_id for listings in python_admin.list_transactions().values()
                    for t in listings}
        finally:
            python_admin.close()

    def cluster_operations() -> set[AclOperation]:
        return set(admin.describe_cluster(include_authorized_operations=True,
                                          request_timeout=TIMEOUT).result(
            TIMEOUT).authorized_operations or ())

    assert requested() == TOPIC_DENIED
    # A topic that does not exist is not disclosed as such either.
    missing = f"{ctx.topic}-missing"
    assert admin.list_topics(missing, timeout=TIMEOUT).topics[missing].error.code() == (
        TOPIC_DENIED)
    assert ctx.topic not in listed_topics()
    assert ctx.group not in listed_groups()
    assert ctx.transactional_id not in listed_transactions()
    assert cluster_operations() == set()

    grant(ctx.secure, [ctx.binding("TOPIC", AclOperation.WRITE),
                       ctx.binding("GROUP", AclOperation.DESCRIBE),
                       ctx.binding("TRANSACTIONAL_ID", AclOperation.DESCRIBE)])
    wait_until(lambda: requested() == 0, "the topic described")
    assert listed_topics() == {ctx.topic}
    assert listed_groups() == {ctx.group}
    assert listed_transactions() == {ctx.transactional_id}
    assert cluster_operations() == set()
    # The operations the user may perform, as DescribeTopics and DescribeGroups report them.
    topic = admin.describe_topics(TopicCollection([ctx.topic]),
                                  include_authorized_operations=True,
                                  request_timeout=TIMEOUT)[ctx.topic].result(TIMEOUT)
    assert set(topic.authorized_operations) == {AclOperation.WRITE, AclOperation.DESCRIBE}
    group = admin.describe_consumer_groups([ctx.group], include_authorized_operations=True,
                                           request_timeout=TIMEOUT)[ctx.group].result(TIMEOUT)
    assert set(group.authorized_operations) == {AclOperation.DESCRIBE}

    # DESCRIBE on the cluster lists every group, as Kafka's ListGroups does.
    grant(ctx.secure, [ctx.binding("BROKER", AclOperation.DESCRIBE)])
    wait_until(lambda: cluster_operations() == {AclOperation.DESCRIBE}, "cluster operations")
    assert listed_groups() >= {ctx.group, other_group}
    assert listed_topics() == {ctx.topic}


# --- how bindings combine -------------------------------------------------------------------

def test_deny_beats_allow_prefixed_and_wildcard_principals_and_deleted_acls(
        secure: Secure, topic_name: str) -> None:
    alice = Ctx(secure, *new_user(secure), topic_name)
    bob = Ctx(secure, *new_user(secure), topic_name)
    a_topic(alice)
    assert outcome(produce_one, alice) == outcome(produce_one, bob) == TOPIC_DENIED

    # Everyone may write to the topics starting with the first part of the topic's name.
    everyone = alice.binding("TOPIC", AclOperation.WRITE, name=topic_name[:12],
                             pattern=ResourcePatternType.PREFIXED, principal="User:*")
    grant(secure, [everyone])
    wait_for_outcome(produce_one, alice, 0)
    assert outcome(produce_one, bob) == 0

    # A DENY for alice on the literal topic beats the ALLOW, and bob is still allowed.
    deny = alice.binding("TOPIC", AclOperation.WRITE, AclPermissionType.DENY)
    grant(secure, [deny])
    wait_for_outcome(produce_one, alice, TOPIC_DENIED)
    assert outcome(produce_one, bob) == 0
    # Denied writing, alice still may describe (WRITE implies DESCRIBE, the DENY is WRITE's).
    assert alice.admin().list_topics(topic_name, timeout=TIMEOUT).topics[topic_name].error is None

    # Deleting the DENY lets alice write again; deleting the ALLOW refuses both again.
    revoke(secure, deny)
    wait_for_outcome(produce_one, alice, 0)
    revoke(secure, everyone)
    wait_for_outcome(produce_one, alice, TOPIC_DENIED)
    assert outcome(produce_one, bob) == TOPIC_DENIED



def test_bindings_match_the_clients_host(ctx: Ctx) -> None:
    a_topic(ctx)
    grant(ctx.secure, [ctx.binding("TOPIC", AclOperation.WRITE, host="10.0.0.1")])
    # Another host's ALLOW does not apply (the frontend names the client's address).
    assert outcome(produce_one, ctx) == TOPIC_DENIED
    time.sleep(1)
    assert outcome(produce_one, ctx) == TOPIC_DENIED
    grant(ctx.secure, [ctx.binding("TOPIC", AclOperation.WRITE, host=HOST)])
    wait_for_outcome(produce_one, ctx, 0)
    # A DENY for everyone from this host, on the topics with the name's prefix, beats it.
    grant(ctx.secure, [ctx.binding("TOPIC", AclOperation.ALL, AclPermissionType.DENY,
                                   ResourcePatternType.PREFIXED, name=ctx.topic[:12],
                                   principal="User:*", host=HOST)])
    wait_for_outcome(produce_one, ctx, TOPIC_DENIED)

# --- client quotas --------------------------------------------------------------------------

def set_user_quota(secure: Secure, user: str | None, **values: float | None) -> None:
    response = sasl_request(secure.bootstrap, "admin", ADMIN_PASSWORD,
                            alter_quota_request(user, **values))
    (entry,) = response.entries  # type: ignore[attr-defined]
    assert entry.error_code == 0, entry


def producer_run(ctx: Ctx, client_id: str) -> ProducerRun:
    return ProducerRun(ctx.secure.bootstrap, ctx.topic, client_id,
                       {k: v for k, v in ctx.config.items() if k != "bootstrap.servers"})


def run_together(*runs: tuple[ProducerRun, float | None], seconds: float) -> float:
    started = time.monotonic()
    threads = [threading.Thread(target=run.run, args=(seconds, pace)) for run, pace in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 20)
    return started


def test_a_users_quota_throttles_its_producer_until_removed(secure: Secure,
                                                            topic_name: str) -> None:
    slow = Ctx(secure, *new_user(secure), topic_name)
    free = Ctx(secure, *new_user(secure), topic_name)
    a_topic(slow)
    grant(secure, [slow.binding("TOPIC", AclOperation.WRITE),
                   free.binding("TOPIC", AclOperation.WRITE)])
    wait_for_outcome(produce_one, slow, 0)
    wait_for_outcome(produce_one, free, 0)
    set_user_quota(secure, slow.user, producer_byte_rate=PRODUCE_QUOTA)

    # The quota reaches the frontend with the cluster metadata: wait for the first throttle.
    def throttled() -> bool:
        probe = producer_run(slow, "probe")
        probe.run(1.5)
        return bool(probe.throttle_ms)

    wait_until(throttled, "the user's producer throttled")

    throttled_run, free_run = producer_run(slow, "same-id"), producer_run(free, "same-id")
    pace = 16 * PRODUCE_QUOTA  # the other user paces itself, to spare the shared machine
    started = run_together((throttled_run, None), (free_run, pace), seconds=6.0)
    assert not throttled_run.errors and not free_run.errors
    assert throttled_run.throttle_ms and max(throttled_run.throttle_ms) > 0
    assert not any(free_run.throttle_ms), "another user with the same client id is not throttled"
    slow_rate = throttled_run.rate(started + 2.5, started + 6.0)
    assert 0.4 * PRODUCE_QUOTA < slow_rate < 1.3 * PRODUCE_QUOTA, slow_rate
    assert free_run.rate(started + 2.5, started + 6.0) > 0.8 * pace

    # Removed, the quota no longer applies: the same user runs far above it, unthrottled.
    set_user_quota(secure, slow.user, producer_byte_rate=None)

    def unthrottled() -> bool:
        run = producer_run(slow, "after")
        began = run_together((run, pace), seconds=3.0)
        return not any(run.throttle_ms) and run.rate(began + 1.0, began + 3.0) > 4 * PRODUCE_QUOTA

    wait_until(unthrottled, "the quota lifted", within=20)


def test_the_default_users_quota_applies_to_users_without_their_own(secure: Secure,
                                                                     topic_name: str) -> None:
    plain = Ctx(secure, *new_user(secure), topic_name)
    exempt = Ctx(secure, *new_user(secure), topic_name)
    a_topic(plain)
    grant(secure, [plain.binding("TOPIC", AclOperation.WRITE),
                   exempt.binding("TOPIC", AclOperation.WRITE)])
    set_user_quota(secure, exempt.user, producer_byte_rate=1024 * PRODUCE_QUOTA)
    set_user_quota(secure, None, producer_byte_rate=PRODUCE_QUOTA)
    try:
        def throttled(ctx: Ctx) -> bool:
            probe = producer_run(ctx, "probe")
            probe.run(1.5)
            return bool(probe.throttle_ms)

        wait_until(lambda: throttled(plain), "a user under the default quota throttled")
        free = producer_run(exempt, "probe")
        run_together((free, 16 * PRODUCE_QUOTA), seconds=3.0)
        assert not free.errors and free.delivered
        assert not any(free.throttle_ms), "a user's own quota overrides the default"
    finally:
        set_user_quota(secure, None, producer_byte_rate=None)
