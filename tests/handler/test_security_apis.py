"""The ACL, SCRAM credential and client quota APIs of the handler, over a controller that
changes a replicator metadata image with the replicator's own control managers and hands it
out as the replicator's ClusterMetadata (the handler's real conversion)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from typing import Any

import pytest

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.replicator.v1 import replicator_pb2 as pb
from services.common.acls import Operation, PatternType, Permission, ResourceType
from services.handler.apis.acls import CreateAclsApi, DeleteAclsApi, DescribeAclsApi
from services.handler.apis.client_quotas import AlterClientQuotasApi, DescribeClientQuotasApi
from services.handler.apis.scram_credentials import (
    AlterUserScramCredentialsApi,
    DescribeUserScramCredentialsApi,
    server_keys,
)
from services.handler.clients import metadata_from_proto
from services.handler.collaborators import OutcomeUnknownError
from services.handler.metadata_cache import ClusterMetadata, MetadataCache
from services.handler.request_context import RequestContext
from services.replicator.controller.acls import create_acls, delete_acls
from services.replicator.controller.client_quotas import alter_client_quotas
from services.replicator.controller.scram import alter_credentials
from services.replicator.metadata import MetadataImage
from services.replicator.servicer import to_cluster_metadata

CONTEXT = RequestContext(advertised_host="localhost", advertised_port=9092)


class ImageController:
    """The replicator's security RPCs on an in-memory image (each call one change)."""

    def __init__(self) -> None:
        self.image = MetadataImage(cluster_id="c", version=1)
        self.calls: list[Any] = []
        self.failure: Exception | None = None
        self.loads = 0

    async def load_metadata(self) -> ClusterMetadata:
        self.loads += 1
        return metadata_from_proto(to_cluster_metadata(self.image, ()))

    def _apply(self, request: Any, change: Any) -> Any:
        self.calls.append(request)
        if self.failure is not None:
            raise self.failure
        image, result = change(self.image)
        if image is not self.image:
            self.image = image.replace(version=self.image.version + 1)
        return result

    async def create_acls(self, request: pb.CreateAclsRequest, time_limit: float
                          ) -> pb.CreateAclsResponse:
        outcomes = self._apply(request, lambda i: create_acls(i, request.bindings))
        return pb.CreateAclsResponse(results=[
            pb.AclResult() if o is None else pb.AclResult(error_code=o[0].value,
                                                          error_message=o[1])
            for o in outcomes])

    async def delete_acls(self, request: pb.DeleteAclsRequest, time_limit: float
                          ) -> pb.DeleteAclsResponse:
        outcomes = self._apply(request, lambda i: delete_acls(i, request.filters))
        return pb.DeleteAclsResponse(results=[
            pb.AclFilterResult(matching=[b.to_pb() for b in o]) if isinstance(o, list)
            else pb.AclFilterResult(error_code=o[0].value, error_message=o[1])
            for o in outcomes])

    async def alter_scram_credentials(self, request: pb.AlterScramCredentialsRequest,
                                      time_limit: float) -> pb.AlterScramCredentialsResponse:
        outcomes = self._apply(request, lambda i: alter_credentials(
            i, request.deletions, request.upsertions))
        return pb.AlterScramCredentialsResponse(results=[
            pb.ScramCredentialResult(user=u) if o is None else pb.ScramCredentialResult(
                user=u, error_code=o[0].value, error_message=o[1]) for u, o in outcomes])

    async def alter_client_quotas(self, request: pb.AlterClientQuotasRequest,
                                  time_limit: float) -> pb.AlterClientQuotasResponse:
        outcomes = self._apply(request, lambda i: alter_client_quotas(
            i, request.entries, validate_only=request.validate_only))
        return pb.AlterClientQuotasResponse(results=[
            pb.ClientQuotaResult(entity=e) if o is None else pb.ClientQuotaResult(
                entity=e, error_code=o[0].value, error_message=o[1]) for e, o in outcomes])


def setup() -> tuple[MetadataCache, ImageController]:
    controller = ImageController()
    cache = MetadataCache(controller.load_metadata)
    return cache, controller


def run(api: Any, request: Any) -> Any:
    return asyncio.run(api.handle(request, CONTEXT))


def creation(name: str = "orders", *, resource_type: int = ResourceType.TOPIC,
             pattern: int = PatternType.LITERAL, principal: str = "User:alice",
             operation: int = Operation.WRITE,
             permission: int = Permission.ALLOW) -> k.CreateAclsRequest.AclCreation:
    return k.CreateAclsRequest.AclCreation(
        resource_type=resource_type, resource_name=name, resource_pattern_type=pattern,
        principal=principal, host="*", operation=operation, permission_type=permission)


# Every field of a filter set, as a client sends it; ANY everywhere unless given.
def describe_request(**fields: object) -> k.DescribeAclsRequest:
    values: dict[str, object] = {"resource_type_filter": 1, "pattern_type_filter": 1,
                                 "operation": 1, "permission_type": 1}
    values.update(fields)
    return k.DescribeAclsRequest(**values)  # type: ignore[arg-type]


def described(response: k.DescribeAclsResponse) -> list[tuple[Any, ...]]:
    return [(r.resource_type, r.resource_name, r.pattern_type, a.principal, a.operation)
            for r in response.resources for a in r.acls]


# --- ACLs ----------------------------------------------------------------------------------


def test_acls_are_created_described_and_deleted() -> None:
    cache, controller = setup()
    response = run(CreateAclsApi(cache, controller), k.CreateAclsRequest(creations=[
        creation("orders"), creation("orders", operation=Operation.READ),
        creation("ord", pattern=PatternType.PREFIXED, principal="User:bob"),
        creation("kafka-cluster", resource_type=ResourceType.CLUSTER,
                 operation=Operation.ALTER),
        creation("wrong", resource_type=ResourceType.CLUSTER),
        creation(""),
        creation("x", operation=Operation.ANY),
    ]))
    assert [(r.error_code, r.error_message if r.HasField("error_message") else None)
            for r in response.results] == [
        (0, None), (0, None), (0, None), (0, None),
        (42, "The only valid name for the CLUSTER resource is kafka-cluster"),
        (42, "Invalid empty resource name"),
        (42, "Invalid operation ANY"),
    ]
    # This handler's next answer shows the change (its cache was reloaded).
    assert controller.loads == 1
    describe = DescribeAclsApi(cache)
    everything = run(describe, describe_request())
    assert everything.error_code == 0
    assert described(everything) == [
        (2, "orders", 3, "User:alice", Operation.WRITE),
        (2, "orders", 3, "User:alice", Operation.READ),
        (2, "ord", 4, "User:bob", Operation.WRITE),
        (4, "kafka-cluster", 3, "User:alice", Operation.ALTER),
    ]
    # The grouping is by resource pattern: both ACLs of "orders" under one resource.
    assert [len(r.acls) for r in everything.resources] == [2, 1, 1]
    matched = run(describe, describe_request(resource_type_filter=2,
                                             resource_name_filter="orders",
                                             pattern_type_filter=PatternType.MATCH))
    assert [name for _, name, *_ in described(matched)] == ["orders", "orders", "ord"]
    only_bob = run(describe, describe_request(principal_filter="User:bob"))
    assert described(only_bob) == [(2, "ord", 4, "User:bob", Operation.WRITE)]
    # A hand-made request leaving codes unset matches anything.
    assert len(described(run(describe, k.DescribeAclsRequest()))) == 4

    deleted = run(DeleteAclsApi(cache, controller), k.DeleteAclsRequest(filters=[
        k.DeleteAclsRequest.DeleteAclsFilter(resource_type_filter=2, pattern_type_filter=1,
                                             resource_name_filter="orders", operation=3,
                                             permission_type=1),
        k.DeleteAclsRequest.DeleteAclsFilter(resource_type_filter=1, pattern_type_filter=1,
                                             principal_filter="User:nobody", operation=1,
                                             permission_type=1),
        k.DeleteAclsRequest.DeleteAclsFilter(resource_type_filter=0, pattern_type_filter=1,
                                             operation=1, permission_type=1),
    ]))
    first, second, third = deleted.filter_results
    assert (first.error_code, [(m.resource_name, m.operation, m.error_code)
                               for m in first.matching_acls]) == (0, [("orders", 3, 0)])
    assert (second.error_code, list(second.matching_acls)) == (0, [])
    assert (third.error_code, third.error_message) == (42, "Unknown patternFilter.")
    assert [name for _, name, *_ in described(run(describe, describe_request()))] == [
        "orders", "ord", "kafka-cluster"]


def test_describe_refuses_unknown_codes() -> None:
    cache, controller = setup()
    response = run(DescribeAclsApi(cache), describe_request(operation=0))
    assert (response.error_code, response.error_message, list(response.resources)) == (
        42, "DescribeAclsRequest contains UNKNOWN elements", [])
    response = run(DescribeAclsApi(cache), describe_request(resource_type_filter=77))
    assert response.error_code == 42


def test_acl_changes_time_out_when_the_controller_does_not_answer() -> None:
    cache, controller = setup()
    controller.failure = OutcomeUnknownError("replicator: DEADLINE_EXCEEDED")
    created = run(CreateAclsApi(cache, controller),
                  k.CreateAclsRequest(creations=[creation(), creation("")]))
    assert [r.error_code for r in created.results] == [7, 42]
    deleted = run(DeleteAclsApi(cache, controller), k.DeleteAclsRequest(filters=[
        k.DeleteAclsRequest.DeleteAclsFilter()]))
    assert [r.error_code for r in deleted.filter_results] == [7]
    assert controller.loads == 0


# --- SCRAM credentials ---------------------------------------------------------------------

Upsertion = k.AlterUserScramCredentialsRequest.ScramCredentialUpsertion
Deletion = k.AlterUserScramCredentialsRequest.ScramCredentialDeletion
UserName = k.DescribeUserScramCredentialsRequest.UserName


def test_stored_and_server_keys_are_rfc_5802s() -> None:
    # RFC 7677's SCRAM-SHA-256 example: password "pencil".
    salt = bytes.fromhex("5b6d99683f9b3a0c22e3b1b4a0bd12e5")  # any salt will do here
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", salt, 4096)
    stored, server = server_keys(1, salted)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    assert stored == hashlib.sha256(client_key).digest()
    assert server == hmac.new(salted, b"Server Key", "sha256").digest()
    assert len(server_keys(2, salted)[0]) == 64
    with pytest.raises(KeyError):
        server_keys(3, salted)


def test_credentials_are_altered_and_described() -> None:
    cache, controller = setup()
    salted = hashlib.pbkdf2_hmac("sha512", b"secret", b"salt", 8192)
    response = run(AlterUserScramCredentialsApi(cache, controller),
                   k.AlterUserScramCredentialsRequest(upsertions=[
                       Upsertion(name="alice", mechanism=2, iterations=8192, salt=b"salt",
                                 salted_password=salted),
                       Upsertion(name="bob", mechanism=1, iterations=4096, salt=b"s",
                                 salted_password=b"x" * 32),
                       Upsertion(name="weak", mechanism=1, iterations=100, salt=b"s",
                                 salted_password=b"x"),
                       Upsertion(name="odd", mechanism=9, iterations=4096, salt=b"s",
                                 salted_password=b"x"),
                   ], deletions=[Deletion(name="ghost", mechanism=1)]))
    assert [(r.user, r.error_code) for r in response.results] == [
        ("ghost", 91), ("alice", 0), ("bob", 0), ("weak", 93), ("odd", 33)]
    # Only the derived keys reach the replicator, never the salted password.
    (sent,) = controller.calls
    alice = sent.upsertions[0]
    assert (alice.stored_key, alice.server_key) == server_keys(2, salted)
    assert salted not in sent.SerializeToString()
    assert controller.image.scram_credentials[("alice", 2)].stored_key == alice.stored_key

    describe = DescribeUserScramCredentialsApi(cache)
    everyone = run(describe, k.DescribeUserScramCredentialsRequest(users_is_null=True))
    assert [(r.user, r.error_code, [(c.mechanism, c.iterations) for c in r.credential_infos])
            for r in everyone.results] == [("alice", 0, [(2, 8192)]), ("bob", 0, [(1, 4096)])]
    named = run(describe, k.DescribeUserScramCredentialsRequest(users=[
        UserName(name="bob"), UserName(name="nobody"), UserName(name="alice"),
        UserName(name="alice")]))
    assert [(r.user, r.error_code, r.error_message) for r in named.results] == [
        ("bob", 0, ""),
        ("nobody", 91, "Attempt to describe a user credential that does not exist: nobody"),
        ("alice", 92, "Cannot describe SCRAM credentials for the same user twice in a single "
                      "request: alice"),
    ]

    # Deleting a mechanism of a user keeps the other ones.
    run(AlterUserScramCredentialsApi(cache, controller), k.AlterUserScramCredentialsRequest(
        upsertions=[Upsertion(name="alice", mechanism=1, iterations=4096, salt=b"t",
                              salted_password=b"y")]))
    run(AlterUserScramCredentialsApi(cache, controller), k.AlterUserScramCredentialsRequest(
        deletions=[Deletion(name="alice", mechanism=2), Deletion(name="bob", mechanism=1)]))
    after = run(describe, k.DescribeUserScramCredentialsRequest(users=[]))
    assert [(r.user, [c.mechanism for c in r.credential_infos]) for r in after.results] == [
        ("alice", [1])]


# --- client quotas -------------------------------------------------------------------------

AlterEntry = k.AlterClientQuotasRequest.EntryData
AlterEntity = k.AlterClientQuotasRequest.EntityData
Op = k.AlterClientQuotasRequest.OpData
Component = k.DescribeClientQuotasRequest.ComponentData


def entity(**parts: str | None) -> list[AlterEntity]:
    return [AlterEntity(entity_type=kind.replace("_", "-"), entity_name=name)
            for kind, name in parts.items()]


def quotas(response: k.DescribeClientQuotasResponse) -> list[tuple[Any, ...]]:
    return [(tuple((e.entity_type, e.entity_name if e.HasField("entity_name") else None)
                   for e in entry.entity), {v.key: v.value for v in entry.values})
            for entry in response.entries]


def test_quotas_are_altered_and_described() -> None:
    cache, controller = setup()
    alter = AlterClientQuotasApi(cache, controller)
    response = run(alter, k.AlterClientQuotasRequest(entries=[
        AlterEntry(entity=entity(user="alice"), ops=[Op(key="producer_byte_rate", value=1024)]),
        AlterEntry(entity=entity(user="alice", client_id=None),
                   ops=[Op(key="consumer_byte_rate", value=2048)]),
        AlterEntry(entity=entity(user=None), ops=[Op(key="request_percentage", value=50)]),
        AlterEntry(entity=entity(client_id="app"), ops=[Op(key="producer_byte_rate", value=1)]),
        AlterEntry(entity=entity(ip="10.1.2.3"),
                   ops=[Op(key="connection_creation_rate", value=10)]),
        AlterEntry(entity=entity(user="bad"), ops=[Op(key="nope", value=1)]),
    ]))
    assert [(r.error_code, r.error_message) for r in response.entries][-1] == (
        42, "Invalid configuration key nope")
    assert [r.error_code for r in response.entries] == [0, 0, 0, 0, 0, 42]
    # Null names come back null (the default entity).
    assert not response.entries[2].entity[0].HasField("entity_name")
    assert controller.loads == 1

    describe = DescribeClientQuotasApi(cache)

    def find(*components: Component, strict: bool = False) -> list[tuple[Any, ...]]:
        answer = run(describe, k.DescribeClientQuotasRequest(components=list(components),
                                                             strict=strict))
        assert answer.error_code == 0
        return quotas(answer)

    assert sorted(find(Component(entity_type="user", match_type=0, match="alice")),
                  key=repr) == [
        ((("client-id", None), ("user", "alice")), {"consumer_byte_rate": 2048.0}),
        ((("user", "alice"),), {"producer_byte_rate": 1024.0}),
    ]
    assert find(Component(entity_type="user", match_type=0, match="alice"), strict=True) == [
        ((("user", "alice"),), {"producer_byte_rate": 1024.0})]
    assert find(Component(entity_type="user", match_type=1)) == [
        ((("user", None),), {"request_percentage": 50.0})]
    assert sorted(repr(e) for e, _ in find(Component(entity_type="user", match_type=2),
                                           strict=True)) == [
        repr((("user", "alice"),)), repr((("user", None),))]
    assert len(find(Component(entity_type="user", match_type=2))) == 3
    assert len(find(Component(entity_type="client-id", match_type=2))) == 2
    assert find(Component(entity_type="ip", match_type=2)) == [
        ((("ip", "10.1.2.3"),), {"connection_creation_rate": 10.0})]
    assert len(find()) == 5

    # validate_only: checked, nothing stored, nothing reloaded.
    checked = run(alter, k.AlterClientQuotasRequest(validate_only=True, entries=[
        AlterEntry(entity=entity(user="alice"), ops=[Op(key="producer_byte_rate", remove=True)])]))
    assert [r.error_code for r in checked.entries] == [0]
    assert controller.loads == 1 and len(find()) == 5
    removed = run(alter, k.AlterClientQuotasRequest(entries=[
        AlterEntry(entity=entity(user="alice"), ops=[Op(key="producer_byte_rate", remove=True)])]))
    assert [r.error_code for r in removed.entries] == [0]
    assert len(find()) == 4
    # An empty answer is an empty list, not null.
    nothing = run(describe, k.DescribeClientQuotasRequest(components=[
        Component(entity_type="user", match_type=0, match="nobody")]))
    assert (list(nothing.entries), nothing.HasField("entries_is_null"),
            nothing.entries_is_null) == ([], True, False)


@pytest.mark.parametrize(("components", "code", "message"), [
    ([Component(entity_type="", match_type=2)], 42, "Invalid empty entity type."),
    ([Component(entity_type="user", match_type=2), Component(entity_type="user", match_type=1)],
     42, "Entity type user cannot appear more than once in the filter."),
    ([Component(entity_type="group", match_type=2)], 35, "Unsupported entity type group"),
    ([Component(entity_type="user", match_type=0)], 42,
     "Request specified MATCH_TYPE_EXACT, but set match string to null."),
    ([Component(entity_type="user", match_type=1, match="a")], 42,
     "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."),
    ([Component(entity_type="user", match_type=2, match="a")], 42,
     "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string."),
    ([Component(entity_type="user", match_type=5)], 42, "Unknown match type 5"),
    ([Component(entity_type="ip", match_type=2), Component(entity_type="user", match_type=2)],
     42, "Invalid entity filter component combination. IP filter component should not be "
         "used with user or clientId filter component."),
])
def test_bad_quota_filters_fail_the_request(components: list[Component], code: int,
                                            message: str) -> None:
    cache, _ = setup()
    response = run(DescribeClientQuotasApi(cache),
                   k.DescribeClientQuotasRequest(components=components))
    assert (response.error_code, response.error_message, response.entries_is_null) == (
        code, message, True)


def test_quota_changes_time_out_when_the_controller_does_not_answer() -> None:
    cache, controller = setup()
    controller.failure = OutcomeUnknownError("replicator: UNAVAILABLE")
    response = run(AlterClientQuotasApi(cache, controller), k.AlterClientQuotasRequest(entries=[
        AlterEntry(entity=entity(user="a"), ops=[Op(key="producer_byte_rate", value=1)])]))
    assert [(r.error_code, r.entity[0].entity_name) for r in response.entries] == [(7, "a")]
    altered = run(AlterUserScramCredentialsApi(cache, controller),
                  k.AlterUserScramCredentialsRequest(deletions=[Deletion(name="a", mechanism=1)]))
    assert [(r.user, r.error_code) for r in altered.results] == [("a", 7)]
