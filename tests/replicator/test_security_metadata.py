"""ACLs, SCRAM credentials and client quotas in the cluster metadata: the control managers'
image changes with Kafka's checks, the JSON round trip, the initial ACLs of a new cluster, and
the Replicator RPCs (one commit per request, published, kept across a restart)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kbroker.replicator.v1 import replicator_pb2 as pb
from services.common.acls import AclBinding, Operation, PatternType, Permission, ResourceType
from services.common.errors import ErrorCode
from services.replicator.controller.acls import create_acls, delete_acls, load_initial_acls
from services.replicator.controller.client_quotas import alter_client_quotas
from services.replicator.controller.scram import alter_credentials
from services.replicator.metadata import MetadataImage, ScramCredential, quota_entity
from services.replicator.metadata_store import decode_image, encode_image

from .harness import cluster, wait_for

EMPTY = MetadataImage(cluster_id="c", version=1)


def binding(name: str = "orders", *, resource_type: int = ResourceType.TOPIC,
            pattern_type: int = PatternType.LITERAL, principal: str = "User:alice",
            host: str = "*", operation: int = Operation.WRITE,
            permission: int = Permission.ALLOW) -> pb.AclBinding:
    return pb.AclBinding(resource_type=resource_type, resource_name=name,
                         pattern_type=pattern_type, principal=principal, host=host,
                         operation=operation, permission_type=permission)


def acl_filter(**fields: object) -> pb.AclFilter:
    values: dict[str, object] = {"resource_type": ResourceType.ANY,
                                 "pattern_type": PatternType.ANY, "operation": Operation.ANY,
                                 "permission_type": Permission.ANY}
    values.update(fields)
    return pb.AclFilter(**values)  # type: ignore[arg-type]


# --- ACLs ----------------------------------------------------------------------------------


def test_created_acls_are_stored_once_in_order() -> None:
    image, outcomes = create_acls(EMPTY, [binding("a"), binding("b"), binding("a")])
    assert outcomes == [None, None, None]
    assert [b.resource_name for b in image.acls] == ["a", "b"]
    assert image.acls[0] == AclBinding(ResourceType.TOPIC, "a", PatternType.LITERAL,
                                       "User:alice", "*", Operation.WRITE, Permission.ALLOW)
    # Creating what exists changes nothing: the very same image comes back.
    again, outcomes = create_acls(image, [binding("b")])
    assert again is image and outcomes == [None]


@pytest.mark.parametrize(("invalid", "message"), [
    (binding(resource_type=ResourceType.ANY), "Invalid resourceType ANY"),
    (binding(resource_type=0), "Invalid resourceType UNKNOWN"),
    (binding(resource_type=99), "Invalid resourceType UNKNOWN"),
    (binding(pattern_type=PatternType.MATCH), "Invalid patternType MATCH"),
    (binding(pattern_type=PatternType.ANY), "Invalid patternType ANY"),
    (binding(operation=Operation.ANY), "Invalid operation ANY"),
    (binding(permission=Permission.ANY), "Invalid permissionType ANY"),
    (binding(""), "Resource name should not be empty"),
])
def test_invalid_acls_are_refused_with_kafkas_messages(invalid: pb.AclBinding,
                                                       message: str) -> None:
    image, outcomes = create_acls(EMPTY, [invalid, binding("ok")])
    assert outcomes == [(ErrorCode.invalid_request, message), None]
    assert [b.resource_name for b in image.acls] == ["ok"]


def test_filters_delete_what_they_match() -> None:
    image, _ = create_acls(EMPTY, [
        binding("orders"), binding("ord", pattern_type=PatternType.PREFIXED),
        binding("*"), binding("payments", principal="User:bob"),
        binding("g", resource_type=ResourceType.GROUP, operation=Operation.READ),
    ])
    # MATCH: what applies to the topic "orders" (literal, wildcard, prefixed).
    _, outcomes = delete_acls(image, [acl_filter(resource_type=ResourceType.TOPIC,
                                                 resource_name="orders",
                                                 pattern_type=PatternType.MATCH)])
    assert [b.resource_name for b in outcomes[0]] == ["orders", "ord", "*"]  # type: ignore[union-attr]
    # Several filters in one request: each lists its matches, all are gone together.
    after, outcomes = delete_acls(image, [
        acl_filter(principal="User:bob"),
        acl_filter(resource_type=ResourceType.GROUP),
        acl_filter(resource_name="ord", pattern_type=PatternType.LITERAL),
        acl_filter(operation=0),
        acl_filter(pattern_type=0),
    ])
    assert [[b.resource_name for b in o] for o in outcomes[:3]] == [  # type: ignore[union-attr]
        ["payments"], ["g"], []]
    assert outcomes[3:] == [(ErrorCode.invalid_request, "Unknown entryFilter."),
                            (ErrorCode.invalid_request, "Unknown patternFilter.")]
    assert [b.resource_name for b in after.acls] == ["orders", "ord", "*"]
    # A filter matching nothing commits nothing.
    same, outcomes = delete_acls(image, [acl_filter(principal="User:nobody")])
    assert same is image and outcomes == [[]]


def test_initial_acls_file(tmp_path: Path) -> None:
    path = tmp_path / "acls.json"
    path.write_text(json.dumps([
        {"resource_type": "TOPIC", "resource_name": "orders", "pattern_type": "LITERAL",
         "principal": "User:alice", "host": "*", "operation": "WRITE", "permission": "ALLOW"},
        {"resource_type": "cluster", "resource_name": "kafka-cluster",
         "pattern_type": "literal", "principal": "User:admin", "operation": "all",
         "permission": "allow"},
    ]))
    first, second = load_initial_acls(path)
    assert first == AclBinding(ResourceType.TOPIC, "orders", PatternType.LITERAL,
                               "User:alice", "*", Operation.WRITE, Permission.ALLOW)
    assert (second.resource_type, second.host, second.operation) == (
        ResourceType.CLUSTER, "*", Operation.ALL)
    good = json.loads(path.read_text())[0]
    for bad, problem in [
        ({"nope": 1}, "expected a JSON list"),
        ([{"nope": 1}], "binding 0: 'resource_type'"),
        ([good, {**good, "operation": "FLY"}], "binding 1: operation 'FLY'"),
        ([{**good, "pattern_type": "MATCH"}], "Invalid patternType MATCH"),
    ]:
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=problem.replace("'", ".")):
            load_initial_acls(path)


# --- SCRAM credentials ---------------------------------------------------------------------


def upsertion(user: str, mechanism: int = 1, iterations: int = 4096) -> pb.ScramCredentialUpsertion:
    return pb.ScramCredentialUpsertion(user=user, mechanism=mechanism, salt=b"salt",
                                       stored_key=b"stored-" + user.encode(),
                                       server_key=b"server", iterations=iterations)


def test_scram_credentials_are_upserted_and_deleted() -> None:
    image, outcomes = alter_credentials(EMPTY, [], [upsertion("alice"),
                                                    upsertion("bob", 2, 8192)])
    assert outcomes == [("alice", None), ("bob", None)]
    assert image.scram_credentials[("bob", 2)] == ScramCredential(
        salt=b"salt", stored_key=b"stored-bob", server_key=b"server", iterations=8192)
    image, outcomes = alter_credentials(
        image, [pb.ScramCredentialDeletion(user="alice", mechanism=1)], [upsertion("bob", 1)])
    assert outcomes == [("alice", None), ("bob", None)]
    assert sorted(image.scram_credentials) == [("bob", 1), ("bob", 2)]
    # Keys stay out of logs.
    assert "server" not in repr(image.scram_credentials[("bob", 1)])


def test_scram_checks_are_kafkas() -> None:
    image, _ = alter_credentials(EMPTY, [], [upsertion("carol")])
    after, outcomes = alter_credentials(image, [
        pb.ScramCredentialDeletion(user="dave", mechanism=1),
        pb.ScramCredentialDeletion(user="carol", mechanism=2),
        pb.ScramCredentialDeletion(user="twice", mechanism=1),
    ], [
        upsertion(""), upsertion("odd", mechanism=3), upsertion("few", iterations=4095),
        upsertion("many", iterations=16385), upsertion("twice"), upsertion("ok", 2, 16384),
    ])
    assert outcomes == [
        ("dave", (ErrorCode.resource_not_found,
                  "Attempt to delete a user credential that does not exist")),
        ("carol", (ErrorCode.resource_not_found,
                   "Attempt to delete a user credential that does not exist")),
        ("twice", (ErrorCode.resource_not_found,
                   "Attempt to delete a user credential that does not exist")),
        ("", (ErrorCode.unacceptable_credential, "Username must not be empty")),
        ("odd", (ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism")),
        ("few", (ErrorCode.unacceptable_credential, "Too few iterations")),
        ("many", (ErrorCode.unacceptable_credential, "Too many iterations")),
        ("ok", None),
    ]
    assert sorted(after.scram_credentials) == [("carol", 1), ("ok", 2)]
    # A user changed twice in one request: DUPLICATE_RESOURCE, and neither change applies.
    again, outcomes = alter_credentials(
        after, [pb.ScramCredentialDeletion(user="ok", mechanism=2)], [upsertion("ok", 1)])
    assert outcomes == [("ok", (ErrorCode.duplicate_resource,
                                "A user credential cannot be altered twice in the same "
                                "request"))]
    assert again is after


# --- client quotas -------------------------------------------------------------------------


def part(entity_type: str, name: str | None) -> pb.QuotaEntityPart:
    return pb.QuotaEntityPart(entity_type=entity_type, name=name or "", is_default=name is None)


def alteration(parts: list[pb.QuotaEntityPart], **ops: float | None) -> pb.ClientQuotaAlteration:
    return pb.ClientQuotaAlteration(entity=parts, ops=[
        pb.ClientQuotaOp(key=k, value=v or 0.0, remove=v is None) for k, v in ops.items()])


def test_quotas_are_set_changed_and_removed() -> None:
    alice = [part("user", "alice"), part("client-id", None)]
    image, outcomes = alter_client_quotas(EMPTY, [
        alteration(alice, producer_byte_rate=1024, request_percentage=12.5),
        alteration([part("ip", "10.0.0.1")], connection_creation_rate=5),
        alteration([part("user", None)], consumer_byte_rate=2048),
    ])
    assert [o[1] for o in outcomes] == [None, None, None]
    assert image.client_quotas == {
        quota_entity({"user": "alice", "client-id": None}): {
            "producer_byte_rate": 1024.0, "request_percentage": 12.5},
        quota_entity({"ip": "10.0.0.1"}): {"connection_creation_rate": 5.0},
        quota_entity({"user": None}): {"consumer_byte_rate": 2048.0},
    }
    # validate_only checks, but stores nothing.
    same, outcomes = alter_client_quotas(image, [alteration(alice, producer_byte_rate=1)],
                                         validate_only=True)
    assert same is image and outcomes[0][1] is None
    # Removing the last value removes the entity; removing an absent key does nothing.
    image, _ = alter_client_quotas(image, [
        alteration(alice, producer_byte_rate=None, request_percentage=None,
                   consumer_byte_rate=None),
        alteration([part("user", None)], consumer_byte_rate=4096),
    ])
    assert quota_entity({"user": "alice", "client-id": None}) not in image.client_quotas
    assert image.client_quotas[quota_entity({"user": None})] == {"consumer_byte_rate": 4096.0}


@pytest.mark.parametrize(("entity", "ops", "message"), [
    ([], {"producer_byte_rate": 1}, "Invalid empty client quota entity"),
    ([part("group", "g")], {"producer_byte_rate": 1},
     "Unhandled client quota entity type: group"),
    ([part("user", "")], {"producer_byte_rate": 1}, "Empty user not supported"),
    ([part("user", "a"), part("user", "b")], {"producer_byte_rate": 1},
     "Invalid client quota entity, duplicate entity entry user"),
    ([part("ip", "1.2.3.4"), part("user", "a")], {"connection_creation_rate": 1},
     "Invalid quota entity combination, IP entity shouldnot be combined with User or ClientId"),
    ([part("ip", "no such host")], {"connection_creation_rate": 1},
     "no such host is not a valid IP or resolvable host."),
    ([part("user", "a")], {"connection_creation_rate": 1},
     "Invalid configuration key connection_creation_rate"),
    ([part("ip", None)], {"producer_byte_rate": 1},
     "Invalid configuration key producer_byte_rate"),
    ([part("user", "a")], {"request_percentage": 0},
     "Quota request_percentage must be greater than 0"),
    ([part("user", "a")], {"producer_byte_rate": -5},
     "Quota producer_byte_rate must be greater than 0"),
    ([part("user", "a")], {"producer_byte_rate": 1.5},
     "producer_byte_rate cannot be a fractional value."),
    ([part("ip", None)], {"connection_creation_rate": 2.0**31},
     "Proposed value for connection_creation_rate is too large for an INT."),
    ([part("user", "a")], {"producer_byte_rate": 2.0**64},
     "Proposed value for producer_byte_rate is too large for a LONG."),
])
def test_invalid_quotas_are_refused_with_kafkas_messages(
        entity: list[pb.QuotaEntityPart], ops: dict[str, float], message: str) -> None:
    image, outcomes = alter_client_quotas(EMPTY, [
        alteration(entity, **ops), alteration([part("client-id", "fine")], producer_byte_rate=1)])
    assert [o[1] for o in outcomes] == [(ErrorCode.invalid_request, message), None]
    assert list(image.client_quotas) == [quota_entity({"client-id": "fine"})]


def test_an_entity_given_twice_is_refused_whole() -> None:
    bob = [part("user", "bob")]
    image, outcomes = alter_client_quotas(EMPTY, [
        alteration(bob, producer_byte_rate=10), alteration(bob, consumer_byte_rate=10),
        pb.ClientQuotaAlteration(entity=[part("user", "eve")], ops=[
            pb.ClientQuotaOp(key="producer_byte_rate", value=1),
            pb.ClientQuotaOp(key="producer_byte_rate", value=2)]),
    ])
    assert [o[1] for o in outcomes] == [
        (ErrorCode.invalid_request,
         "Ignoring duplicate entity ClientQuotaEntity(entries={user=bob})"),
        (ErrorCode.invalid_request, "Duplicate quota key producer_byte_rate not updating quota "
                                    "for this entity ClientQuotaEntity(entries={user=eve})"),
    ]
    assert image is EMPTY


# --- JSON ----------------------------------------------------------------------------------

names = st.text("abcé*-_.:", min_size=1, max_size=8)


@st.composite
def security_images(draw: st.DrawFn) -> MetadataImage:
    acls = draw(st.lists(st.builds(
        AclBinding, st.sampled_from(list(ResourceType)[2:]), names,
        st.sampled_from([PatternType.LITERAL, PatternType.PREFIXED]),
        names.map(lambda n: "User:" + n), names, st.sampled_from(list(Operation)[2:]),
        st.sampled_from([Permission.ALLOW, Permission.DENY])), max_size=5, unique=True))
    credentials = draw(st.dictionaries(
        st.tuples(names, st.sampled_from([1, 2])),
        st.builds(ScramCredential, salt=st.binary(max_size=8), stored_key=st.binary(max_size=8),
                  server_key=st.binary(max_size=8), iterations=st.integers(4096, 16384)),
        max_size=4))
    quotas = draw(st.dictionaries(
        st.dictionaries(st.sampled_from(["user", "client-id", "ip"]), st.none() | names,
                        min_size=1).map(quota_entity),
        st.dictionaries(st.sampled_from(["producer_byte_rate", "request_percentage"]),
                        st.floats(0.001, 1e12), min_size=1), max_size=4))
    return EMPTY.replace(acls=tuple(acls), scram_credentials=credentials, client_quotas=quotas)


@given(security_images())
def test_security_metadata_survives_the_json_round_trip(image: MetadataImage) -> None:
    document = json.loads(json.dumps(encode_image(image)))
    assert decode_image(document) == image


def test_an_older_document_has_no_security_metadata() -> None:
    document = encode_image(EMPTY)
    for key in ("acls", "scram_credentials", "client_quotas"):
        del document[key]
    image = decode_image(document)
    assert (image.acls, dict(image.scram_credentials), dict(image.client_quotas)) == ((), {}, {})


# --- the service ---------------------------------------------------------------------------


def test_rpcs_commit_publish_and_survive_a_restart(tmp_path: Path) -> None:
    acls_file = tmp_path / "acls.json"
    acls_file.write_text(json.dumps([
        {"resource_type": "CLUSTER", "resource_name": "kafka-cluster",
         "pattern_type": "LITERAL", "principal": "User:admin", "host": "*",
         "operation": "ALL", "permission": "ALLOW"}]))

    async def scenario() -> None:
        async with cluster(tmp_path, nodes=1, initial_acls_file=str(acls_file)) as c:
            first = await c.metadata()
            assert [(a.principal, a.operation) for a in first.acls] == [
                ("User:admin", Operation.ALL)]
            watch = c.stub.WatchMetadata(pb.WatchMetadataRequest())
            assert (await watch.read()).version == first.version

            created = await c.stub.CreateAcls(pb.CreateAclsRequest(
                bindings=[binding("orders"), binding("")]))
            assert [r.error_code for r in created.results] == [0, 42]
            published = await watch.read()
            assert published.version == first.version + 1
            assert [a.resource_name for a in published.acls] == ["kafka-cluster", "orders"]

            altered = await c.stub.AlterScramCredentials(pb.AlterScramCredentialsRequest(
                upsertions=[upsertion("alice", 2, 8192)]))
            assert [(r.user, r.error_code) for r in altered.results] == [("alice", 0)]
            quotas = await c.stub.AlterClientQuotas(pb.AlterClientQuotasRequest(entries=[
                alteration([part("user", "alice")], producer_byte_rate=1024)]))
            assert [r.error_code for r in quotas.results] == [0]
            assert quotas.results[0].entity[0].name == "alice"
            deleted = await c.stub.DeleteAcls(pb.DeleteAclsRequest(
                filters=[acl_filter(resource_name="orders")]))
            assert [[m.resource_name for m in r.matching] for r in deleted.results] == [
                ["orders"]]

            async def caught_up() -> bool:
                return (await c.metadata()).version == first.version + 4
            await wait_for(caught_up)
            watch.cancel()

            # Another file at a restart changes nothing: initial ACLs are for new clusters.
            acls_file.write_text("[]")
            await c.stop_replicator()
            await c.start_replicator()
            after = await c.metadata()
            assert after.version >= first.version + 4
            assert [a.resource_name for a in after.acls] == ["kafka-cluster"]
            (credential,) = after.scram_credentials
            assert (credential.user, credential.mechanism, credential.iterations,
                    credential.stored_key) == ("alice", 2, 8192, b"stored-alice")
            (quota,) = after.client_quotas
            assert ([(p.entity_type, p.name, p.is_default) for p in quota.entity],
                    dict(quota.values)) == ([("user", "alice", False)],
                                            {"producer_byte_rate": 1024.0})

    asyncio.run(scenario())


def test_a_broken_initial_acls_file_stops_the_start(tmp_path: Path) -> None:
    acls_file = tmp_path / "acls.json"
    acls_file.write_text('[{"resource_type": "TOPIC"}]')

    async def scenario() -> None:
        with pytest.raises(ValueError, match="binding 0"):
            async with cluster(tmp_path, nodes=1, initial_acls_file=str(acls_file)):
                pass

    asyncio.run(scenario())


def test_a_failed_save_changes_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with cluster(tmp_path, nodes=1) as c:
            await c.stub.CreateAcls(pb.CreateAclsRequest(bindings=[binding("kept")]))
            before = await c.metadata()
            assert c.service is not None
            store = c.service.controller._store  # fault injection

            async def broken_save(image: object) -> None:
                raise OSError("disk full")

            saved = store.save
            store.save = broken_save  # type: ignore[method-assign]
            try:
                created = await c.stub.CreateAcls(pb.CreateAclsRequest(
                    bindings=[binding("a"), binding("")]))
                deleted = await c.stub.DeleteAcls(pb.DeleteAclsRequest(filters=[
                    acl_filter(), acl_filter(principal="User:nobody"), acl_filter(operation=0)]))
                scram = await c.stub.AlterScramCredentials(pb.AlterScramCredentialsRequest(
                    upsertions=[upsertion("alice"), upsertion("bob")]))
                quotas = await c.stub.AlterClientQuotas(pb.AlterClientQuotasRequest(entries=[
                    alteration([part("user", "alice")], producer_byte_rate=1)]))
            finally:
                store.save = saved  # type: ignore[method-assign]
            # A filter matching nothing changes nothing, so nothing can fail.
            assert [r.error_code for r in deleted.results] == [
                ErrorCode.unknown_server_error.value, 0, ErrorCode.invalid_request.value]
            assert [list(r.matching) for r in deleted.results] == [[], [], []]
            # Valid changes were not saved; invalid ones keep their own error.
            assert [r.error_code for r in created.results] == [
                ErrorCode.unknown_server_error.value, ErrorCode.invalid_request.value]
            for results in (created.results[:1], scram.results, quotas.results):
                assert {r.error_code for r in results} == {ErrorCode.unknown_server_error.value}
                assert all("disk full" in r.error_message for r in results)
            assert [r.user for r in scram.results] == ["alice", "bob"]
            after = await c.metadata()
            assert after.version == before.version
            assert ([a.resource_name for a in after.acls], list(after.scram_credentials),
                    list(after.client_quotas)) == (["kept"], [], [])

    asyncio.run(scenario())
