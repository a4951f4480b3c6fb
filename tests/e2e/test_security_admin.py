"""ACLs, SCRAM credentials and client quotas through real admin clients against a local cluster
of its own: librdkafka's AdminClient (create/describe/delete ACLs, alter/describe user SCRAM
credentials), kafka-python's ACL admin, and raw DescribeClientQuotas/AlterClientQuotas
requests (no installed client speaks them). The cluster starts with ACLs from
``--initial-acls-file``, and everything survives a replicator killed and started again."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import time
from collections.abc import Iterator
from itertools import count

import grpc
import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePattern,
    ResourcePatternFilter,
)
from kafka.admin import ResourceType as KResourceType
from kio.schema.alter_client_quotas.v1 import request as alter_quotas
from kio.schema.describe_client_quotas.v1 import request as describe_quotas
from kio.static.primitive import f64, i8

from kbroker.replicator.v1 import replicator_pb2, replicator_pb2_grpc
from services.local_cluster import ClusterSpec, LocalCluster

from .wire import encode_request, read_response

TIMEOUT = 20


@pytest.fixture(scope="module")
def security_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    data = tmp_path_factory.mktemp("security")
    acls_file = data / "initial-acls.json"
    acls_file.write_text(json.dumps([
        {"resource_type": "CLUSTER", "resource_name": "kafka-cluster",
         "pattern_type": "LITERAL", "principal": "User:admin", "host": "*",
         "operation": "ALL", "permission": "ALLOW"}]))
    spec = ClusterSpec(
        data_dir=data, kafka_port=0, base_port=0, handlers=1, log_nodes=1, num_partitions=1,
        log_level=os.environ.get("KBROKER_TEST_LOG_LEVEL", "INFO"),
        service_flags={"replicator": {"initial_acls_file": str(acls_file)}})
    cluster = LocalCluster(spec)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def replicator_metadata(cluster: LocalCluster) -> replicator_pb2.ClusterMetadata:
    with grpc.insecure_channel(cluster.services["replicator"].grpc_address) as channel:
        return replicator_pb2_grpc.ReplicatorStub(channel).GetMetadata(
            replicator_pb2.GetMetadataRequest(), timeout=10)


def admin_for(cluster: LocalCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


def everything() -> AclBindingFilter:
    return AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                            AclOperation.ANY, AclPermissionType.ANY)


def described(admin: AdminClient, acl_filter: AclBindingFilter) -> set[tuple[object, ...]]:
    bindings = admin.describe_acls(acl_filter, request_timeout=15).result(timeout=TIMEOUT)
    return {(b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
             b.permission_type) for b in bindings}


def test_acls_with_librdkafka(security_cluster: LocalCluster, topic_name: str) -> None:
    admin = admin_for(security_cluster)
    # The initial ACLs of the new cluster.
    assert (ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:admin",
            "*", AclOperation.ALL, AclPermissionType.ALLOW) in described(admin, everything())

    write = AclBinding(ResourceType.TOPIC, topic_name, ResourcePatternType.LITERAL,
                       "User:alice", "*", AclOperation.WRITE, AclPermissionType.ALLOW)
    prefixed = AclBinding(ResourceType.TOPIC, topic_name[:10], ResourcePatternType.PREFIXED,
                          "User:bob", "*", AclOperation.READ, AclPermissionType.DENY)
    group = AclBinding(ResourceType.GROUP, f"{topic_name}-g", ResourcePatternType.LITERAL,
                       "User:alice", "10.0.0.1", AclOperation.READ, AclPermissionType.ALLOW)
    futures = admin.create_acls([write, prefixed, group], request_timeout=15)
    for future in futures.values():
        assert future.result(timeout=TIMEOUT) is None
    # An invalid binding fails alone, with Kafka's error.
    bad = AclBinding(ResourceType.BROKER, "not-the-cluster", ResourcePatternType.LITERAL,
                     "User:alice", "*", AclOperation.ALTER, AclPermissionType.ALLOW)
    with pytest.raises(KafkaException) as info:
        admin.create_acls([bad], request_timeout=15)[bad].result(timeout=TIMEOUT)
    assert info.value.args[0].code() == KafkaError.INVALID_REQUEST

    # MATCH: every binding that applies to the topic.
    applying = AclBindingFilter(ResourceType.TOPIC, topic_name, ResourcePatternType.MATCH,
                                None, None, AclOperation.ANY, AclPermissionType.ANY)
    assert {(name, principal) for _, name, _, principal, *_ in described(admin, applying)} == {
        (topic_name, "User:alice"), (topic_name[:10], "User:bob")}
    only_alice = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY,
                                  "User:alice", None, AclOperation.ANY, AclPermissionType.ANY)
    assert {name for _, name, *_ in described(admin, only_alice)} >= {
        topic_name, f"{topic_name}-g"}

    topic_filter = AclBindingFilter(ResourceType.TOPIC, None, ResourcePatternType.ANY, None,
                                    None, AclOperation.ANY, AclPermissionType.ANY)
    deleted = admin.delete_acls([topic_filter], request_timeout=15)[topic_filter].result(
        timeout=TIMEOUT)
    assert {b.name for b in deleted} >= {topic_name, topic_name[:10]}
    remaining = described(admin, everything())
    assert not any(r[0] == ResourceType.TOPIC for r in remaining)
    assert any(r[1] == f"{topic_name}-g" for r in remaining)


def test_acls_with_kafka_python(security_cluster: LocalCluster, topic_name: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=security_cluster.bootstrap,
                             request_timeout_ms=15000)
    try:
        acl = ACL(principal="User:carol", host="*", operation=ACLOperation.DESCRIBE,
                  permission_type=ACLPermissionType.ALLOW,
                  resource_pattern=ResourcePattern(KResourceType.TOPIC, topic_name,
                                                   ACLResourcePatternType.LITERAL))
        result = admin.create_acls([acl])
        assert result["failed"] == [] and len(result["succeeded"]) == 1
        carol = ACLFilter(principal="User:carol", host=None, operation=ACLOperation.ANY,
                          permission_type=ACLPermissionType.ANY,
                          resource_pattern=ResourcePatternFilter(
                              KResourceType.ANY, None, ACLResourcePatternType.ANY))
        found, error = admin.describe_acls(carol)
        assert error.errno == 0
        assert [(a.principal, a.resource_pattern.resource_name) for a in found] == [
            ("User:carol", topic_name)]
        ((_, matched, error),) = admin.delete_acls([carol])
        assert error.errno == 0 and [a.principal for a in matched] == ["User:carol"]
        assert admin.describe_acls(carol)[0] == []
    finally:
        admin.close()


def test_scram_credentials_with_librdkafka(security_cluster: LocalCluster) -> None:
    admin = admin_for(security_cluster)
    futures = admin.alter_user_scram_credentials([
        UserScramCredentialUpsertion("alice", ScramCredentialInfo(
            ScramMechanism.SCRAM_SHA_512, 8192), b"alice-secret", b"salt-of-alice"),
        UserScramCredentialUpsertion("bob", ScramCredentialInfo(
            ScramMechanism.SCRAM_SHA_256, 4096), b"bob-secret"),
        UserScramCredentialDeletion("nobody", ScramMechanism.SCRAM_SHA_256),
    ], request_timeout=15)
    assert futures["alice"].result(timeout=TIMEOUT) is None
    assert futures["bob"].result(timeout=TIMEOUT) is None
    with pytest.raises(KafkaException) as info:
        futures["nobody"].result(timeout=TIMEOUT)
    assert info.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND

    # What the replicator keeps is RFC 5802's, from the password the client salted.
    stored = {(c.user, c.mechanism): c for c in replicator_metadata(security_cluster)
              .scram_credentials}
    alice_keys = stored[("alice", 2)]
    assert (alice_keys.salt, alice_keys.iterations) == (b"salt-of-alice", 8192)
    salted = hashlib.pbkdf2_hmac("sha512", b"alice-secret", b"salt-of-alice", 8192)
    client_key = hmac.new(salted, b"Client Key", "sha512").digest()
    assert alice_keys.stored_key == hashlib.sha512(client_key).digest()
    assert alice_keys.server_key == hmac.new(salted, b"Server Key", "sha512").digest()
    bob_keys = stored[("bob", 1)]
    assert len(bob_keys.salt) > 0 and len(bob_keys.stored_key) == 32  # a salt of the client's

    described = admin.describe_user_scram_credentials(["alice", "bob"],
                                                      request_timeout=15)
    alice = described["alice"].result(timeout=TIMEOUT)
    assert [(c.mechanism, c.iterations) for c in alice.scram_credential_infos] == [
        (ScramMechanism.SCRAM_SHA_512, 8192)]
    bob = described["bob"].result(timeout=TIMEOUT)
    assert [(c.mechanism, c.iterations) for c in bob.scram_credential_infos] == [
        (ScramMechanism.SCRAM_SHA_256, 4096)]
    with pytest.raises(KafkaException) as info:
        admin.describe_user_scram_credentials(["ghost"], request_timeout=15)["ghost"].result(
            timeout=TIMEOUT)
    assert info.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND
    # Too few iterations: UNACCEPTABLE_CREDENTIAL.
    weak = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "weak", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 1000), b"pw")],
        request_timeout=15)["weak"]
    with pytest.raises(KafkaException) as info:
        weak.result(timeout=TIMEOUT)
    assert info.value.args[0].code() == KafkaError.UNACCEPTABLE_CREDENTIAL


# --- client quotas, as raw requests ---------------------------------------------------------

_correlation = count(1)


def send(cluster: LocalCluster, request: object) -> object:
    host, port = cluster.bootstrap.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock:
        sock.sendall(encode_request(request, next(_correlation)))
        _, response = read_response(sock, type(request))
    return response


def alter(cluster: LocalCluster, entity: dict[str, str | None], validate_only: bool = False,
          **ops: float | None) -> tuple[int, str | None]:
    response = send(cluster, alter_quotas.AlterClientQuotasRequest(validate_only=validate_only,
        entries=(alter_quotas.EntryData(
            entity=tuple(alter_quotas.EntityData(entity_type=t, entity_name=n)
                         for t, n in entity.items()),
            ops=tuple(alter_quotas.OpData(key=key, value=f64(float(value or 0.0)),
                                          remove=value is None)
                      for key, value in ops.items())),)))
    (entry,) = response.entries  # type: ignore[attr-defined]
    return int(entry.error_code), entry.error_message


def describe(cluster: LocalCluster, strict: bool = False,
             **components: tuple[int, str | None]) -> dict[tuple[object, ...], dict[str, float]]:
    response = send(cluster, describe_quotas.DescribeClientQuotasRequest(strict=strict,
        components=tuple(describe_quotas.ComponentData(entity_type=t.replace("_", "-"),
                                                       match_type=i8(m), match=match)
                         for t, (m, match) in components.items())))
    assert response.error_code == 0, response  # type: ignore[attr-defined]
    return {tuple(sorted((e.entity_type, e.entity_name) for e in entry.entity)):
            {v.key: float(v.value) for v in entry.values}
            for entry in response.entries}  # type: ignore[attr-defined]


def test_client_quotas_over_the_wire(security_cluster: LocalCluster) -> None:
    cluster = security_cluster
    assert alter(cluster, {"user": "alice"}, producer_byte_rate=1048576,
                 request_percentage=50) == (0, None)
    assert alter(cluster, {"user": "alice", "client-id": None},
                 consumer_byte_rate=2048) == (0, None)
    assert alter(cluster, {"client-id": None}, producer_byte_rate=4096) == (0, None)
    assert alter(cluster, {"user": "alice"}, producer_byte_rate=1.5) == (
        42, "producer_byte_rate cannot be a fractional value.")
    assert alter(cluster, {"user": "x"}, validate_only=True, nope=1) == (
        42, "Invalid configuration key nope")

    assert describe(cluster, user=(0, "alice"), strict=True) == {
        (("user", "alice"),): {"producer_byte_rate": 1048576.0, "request_percentage": 50.0}}
    assert describe(cluster, user=(0, "alice")) == {
        (("user", "alice"),): {"producer_byte_rate": 1048576.0, "request_percentage": 50.0},
        (("client-id", None), ("user", "alice")): {"consumer_byte_rate": 2048.0}}
    assert describe(cluster, client_id=(1, None), strict=True) == {
        (("client-id", None),): {"producer_byte_rate": 4096.0}}
    assert len(describe(cluster, client_id=(2, None))) == 2

    bad = send(cluster, describe_quotas.DescribeClientQuotasRequest(strict=False, components=(
        describe_quotas.ComponentData(entity_type="user", match_type=i8(0), match=None),)))
    assert (bad.error_code, bad.error_message) == (  # type: ignore[attr-defined]
        42, "Request specified MATCH_TYPE_EXACT, but set match string to null.")

    assert alter(cluster, {"client-id": None}, producer_byte_rate=None) == (0, None)
    assert describe(cluster, client_id=(1, None), strict=True) == {}


# --- across a restart -------------------------------------------------------------------------


def wait_until(condition, within: float = 60.0, message: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while True:
        try:
            if condition():
                return
        except (KafkaException, OSError):
            pass
        assert time.monotonic() < deadline, f"{message} not reached within {within}s"
        time.sleep(0.3)


def test_security_metadata_survives_a_replicator_restart(security_cluster: LocalCluster,
                                                         topic_name: str) -> None:
    cluster = security_cluster
    admin = admin_for(cluster)
    binding = AclBinding(ResourceType.TOPIC, topic_name, ResourcePatternType.PREFIXED,
                         "User:dave", "*", AclOperation.CREATE, AclPermissionType.ALLOW)
    admin.create_acls([binding], request_timeout=15)[binding].result(timeout=TIMEOUT)
    admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"pw")],
        request_timeout=15)["dave"].result(timeout=TIMEOUT)
    assert alter(cluster, {"user": "dave"}, consumer_byte_rate=999) == (0, None)

    cluster.kill("replicator")
    cluster.start_service("replicator", wait=True, timeout=90)

    dave = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:dave",
                            None, AclOperation.ANY, AclPermissionType.ANY)
    expected = {(ResourceType.TOPIC, topic_name, ResourcePatternType.PREFIXED, "User:dave",
                 "*", AclOperation.CREATE, AclPermissionType.ALLOW)}
    # The new replicator read them back from the metadata log...
    stored = replicator_metadata(cluster)
    assert [(a.principal, a.resource_name) for a in stored.acls
            if a.principal == "User:dave"] == [("User:dave", topic_name)]
    assert [(c.user, c.mechanism) for c in stored.scram_credentials if c.user == "dave"] == [
        ("dave", 1)]
    # ... and the handler follows it.
    wait_until(lambda: described(admin, dave) == expected, message="the ACL after a restart")

    # A new change after the restart is stored and shown too.
    admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 5000), b"pw")],
        request_timeout=15)["dave"].result(timeout=TIMEOUT)
    infos = admin.describe_user_scram_credentials(["dave"], request_timeout=15)["dave"].result(
        timeout=TIMEOUT).scram_credential_infos
    assert sorted((c.mechanism, c.iterations) for c in infos) == [
        (ScramMechanism.SCRAM_SHA_256, 4096), (ScramMechanism.SCRAM_SHA_512, 5000)]
    assert describe(cluster, user=(0, "dave")) == {
        (("user", "dave"),): {"consumer_byte_rate": 999.0}}
