"""Kafka's authorization decisions over ACL bindings (StandardAuthorizer's semantics): which
bindings apply to a resource, principal and host matching, DENY first, the operations an
ALLOW implies, super users, the no-ACL default, authorized-operations bitfields,
authorizeByResourceType, and what a check costs."""

from __future__ import annotations

import time

import pytest

from services.common.acls import (
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from services.handler.security.authorizer import (
    Authorizer,
    operations_bitfield,
    parse_super_users,
)

T, G, C, X = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER,
              ResourceType.TRANSACTIONAL_ID)
O = Operation
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALICE, BOB = "User:alice", "User:bob"
HOST = "10.0.0.1"


def acl(resource_type: ResourceType, name: str, operation: Operation, *,
        pattern: PatternType = LIT, principal: str = ALICE, host: str = "*",
        deny: bool = False) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, host, operation,
                      Permission.DENY if deny else Permission.ALLOW)


def allowed(authorizer: Authorizer, operation: Operation, name: str, *,
            resource_type: ResourceType = T, principal: str = ALICE, host: str = HOST) -> bool:
    return authorizer.authorize(principal, host, operation, resource_type, name)


def test_a_literal_binding_applies_to_its_name_only():
    a = Authorizer([acl(T, "orders", O.READ)])
    assert allowed(a, O.READ, "orders")
    assert not allowed(a, O.READ, "orders2")
    assert not allowed(a, O.READ, "order")
    assert not allowed(a, O.WRITE, "orders")
    # Another resource type with the same name has no binding.
    assert not allowed(a, O.READ, "orders", resource_type=G)


def test_the_literal_wildcard_applies_to_every_name_of_its_type():
    a = Authorizer([acl(T, "*", O.WRITE)])
    assert allowed(a, O.WRITE, "anything") and allowed(a, O.WRITE, "*")
    assert not allowed(a, O.WRITE, "anything", resource_type=G)


def test_a_prefixed_binding_applies_to_the_names_it_starts():
    a = Authorizer([acl(T, "team-", O.READ, pattern=PRE), acl(T, "t", O.WRITE, pattern=PRE)])
    assert allowed(a, O.READ, "team-a") and allowed(a, O.READ, "team-")
    assert not allowed(a, O.READ, "team") and not allowed(a, O.READ, "xteam-a")
    assert allowed(a, O.WRITE, "team-a") and allowed(a, O.WRITE, "t")
    assert not allowed(a, O.WRITE, "other")


def test_principal_matches_exactly_or_by_the_user_wildcard():
    a = Authorizer([acl(T, "orders", O.READ), acl(T, "public", O.READ, principal="User:*")])
    assert allowed(a, O.READ, "orders", principal=ALICE)
    assert not allowed(a, O.READ, "orders", principal=BOB)
    assert not allowed(a, O.READ, "orders", principal="User:Alice")
    assert allowed(a, O.READ, "public", principal=BOB)
    assert allowed(a, O.READ, "public", principal="User:ANONYMOUS")


def test_host_matches_exactly_or_by_the_wildcard():
    a = Authorizer([acl(T, "orders", O.READ, host="10.0.0.1"), acl(T, "any", O.READ)])
    assert allowed(a, O.READ, "orders", host="10.0.0.1")
    assert not allowed(a, O.READ, "orders", host="10.0.0.2")
    assert allowed(a, O.READ, "any", host="192.168.1.1")


def test_deny_wins_over_any_allow_whatever_pattern_carries_it():
    a = Authorizer([
        acl(T, "*", O.ALL),
        acl(T, "secret-", O.READ, pattern=PRE, deny=True),
        acl(T, "orders", O.WRITE, principal="User:*", deny=True),
        acl(T, "audit", O.ALL, deny=True, host=HOST),
    ])
    assert allowed(a, O.READ, "public")
    assert not allowed(a, O.READ, "secret-plans")
    assert allowed(a, O.WRITE, "secret-plans")  # the DENY names READ only
    assert not allowed(a, O.WRITE, "orders") and allowed(a, O.READ, "orders")
    assert not allowed(a, O.DESCRIBE, "audit")
    assert allowed(a, O.DESCRIBE, "audit", host="10.0.0.9")  # the DENY is for one host


def test_allows_imply_describe_and_describe_configs_but_denies_imply_nothing():
    for implying in (O.READ, O.WRITE, O.DELETE, O.ALTER):
        a = Authorizer([acl(T, "t", implying)])
        assert allowed(a, O.DESCRIBE, "t"), implying
    for other in (O.CREATE, O.ALTER_CONFIGS, O.DESCRIBE_CONFIGS, O.CLUSTER_ACTION):
        assert not allowed(Authorizer([acl(T, "t", other)]), O.DESCRIBE, "t"), other
    assert allowed(Authorizer([acl(T, "t", O.ALTER_CONFIGS)]), O.DESCRIBE_CONFIGS, "t")
    assert not allowed(Authorizer([acl(T, "t", O.ALTER)]), O.DESCRIBE_CONFIGS, "t")
    # READ does not imply WRITE, nor DESCRIBE imply READ.
    assert not allowed(Authorizer([acl(T, "t", O.READ)]), O.WRITE, "t")
    assert not allowed(Authorizer([acl(T, "t", O.DESCRIBE)]), O.READ, "t")
    # A DENY of READ leaves DESCRIBE to the allows.
    a = Authorizer([acl(T, "t", O.READ, deny=True), acl(T, "t", O.WRITE)])
    assert allowed(a, O.DESCRIBE, "t") and not allowed(a, O.READ, "t")
    # ALL allows (and denies) every operation.
    assert all(allowed(Authorizer([acl(C, "kafka-cluster", O.ALL)]), op, "kafka-cluster",
                       resource_type=C) for op in (O.CLUSTER_ACTION, O.IDEMPOTENT_WRITE, O.ALTER))


def test_super_users_are_allowed_everything_even_against_denies():
    a = Authorizer([acl(T, "*", O.ALL, principal="User:*", deny=True)],
                   super_users=parse_super_users("User:admin; User:ops;"))
    assert a.super_users == {"User:admin", "User:ops"}
    assert allowed(a, O.DELETE, "orders", principal="User:admin")
    assert allowed(a, O.CLUSTER_ACTION, "kafka-cluster", resource_type=C, principal="User:ops")
    assert not allowed(a, O.READ, "orders", principal=ALICE)
    assert a.authorize_by_resource_type("User:admin", HOST, O.WRITE, T)


def test_no_binding_for_the_resource_falls_to_allow_everyone_if_no_acl_found():
    bindings = [acl(T, "orders", O.READ)]
    strict = Authorizer(bindings)
    lenient = Authorizer(bindings, allow_everyone_if_no_acl_found=True)
    assert not allowed(strict, O.WRITE, "unprotected")
    assert allowed(lenient, O.WRITE, "unprotected", principal=BOB)
    # A resource with bindings, none allowing this principal: denied either way.
    assert not allowed(lenient, O.READ, "orders", principal=BOB)
    assert not allowed(lenient, O.WRITE, "orders")
    # The default is off.
    assert not allowed(Authorizer([]), O.DESCRIBE, "t")
    assert allowed(Authorizer([], allow_everyone_if_no_acl_found=True), O.DESCRIBE, "t")


def test_authorized_operations_are_the_supported_operations_allowed():
    a = Authorizer([acl(T, "t", O.WRITE), acl(T, "t", O.ALTER_CONFIGS),
                    acl(G, "g", O.READ), acl(C, "kafka-cluster", O.DESCRIBE)])
    assert a.authorized_operations(ALICE, HOST, T, "t") == operations_bitfield(
        [O.WRITE, O.DESCRIBE, O.ALTER_CONFIGS, O.DESCRIBE_CONFIGS])
    assert a.authorized_operations(ALICE, HOST, G, "g") == operations_bitfield(
        [O.READ, O.DESCRIBE])
    assert a.authorized_operations(ALICE, HOST, C, "kafka-cluster") == 1 << O.DESCRIBE
    assert a.authorized_operations(BOB, HOST, T, "t") == 0


def test_authorize_by_resource_type_as_kafka_for_idempotent_producers():
    def any_write(*bindings: AclBinding, **options: bool) -> bool:
        return Authorizer(bindings, **options).authorize_by_resource_type(ALICE, HOST, O.WRITE,
                                                                          T)

    assert not any_write()
    assert any_write(allow_everyone_if_no_acl_found=True)
    assert any_write(acl(T, "orders", O.WRITE))
    assert any_write(acl(T, "team-", O.ALL, pattern=PRE))
    assert not any_write(acl(T, "orders", O.READ))  # no implications here
    assert not any_write(acl(T, "orders", O.WRITE, principal=BOB))
    assert not any_write(acl(T, "orders", O.WRITE, host="10.9.9.9"))
    # Dominated allows do not count; an undominated one does.
    assert not any_write(acl(T, "orders", O.WRITE), acl(T, "orders", O.WRITE, deny=True))
    assert not any_write(acl(T, "team-a", O.WRITE), acl(T, "team-", O.WRITE, pattern=PRE,
                                                        deny=True))
    assert any_write(acl(T, "team-a", O.WRITE), acl(T, "team-b", O.WRITE, deny=True))
    # A wildcard deny denies all; a wildcard allow allows unless so denied.
    assert not any_write(acl(T, "*", O.WRITE), acl(T, "*", O.WRITE, deny=True))
    assert any_write(acl(T, "*", O.WRITE), acl(T, "x", O.WRITE, deny=True))


@pytest.mark.parametrize("count", [10_000])
def test_a_check_costs_microseconds_with_many_bindings(count: int):
    bindings = [acl(T, f"topic-{i}", O.READ, principal=f"User:u{i % 100}") for i in range(count)]
    bindings += [acl(T, f"prefix-{i}-", O.WRITE, pattern=PRE) for i in range(100)]
    bindings.append(acl(T, "*", O.DESCRIBE, principal="User:*"))
    started = time.perf_counter()
    a = Authorizer(bindings)
    built = time.perf_counter() - started
    names = [f"topic-{i}" for i in range(1000)]
    started = time.perf_counter()
    results = [a.authorize(f"User:u{i % 100}", HOST, O.READ, T, n) for i, n in enumerate(names)]
    first = (time.perf_counter() - started) / len(names)
    started = time.perf_counter()
    for i, n in enumerate(names):
        a.authorize(f"User:u{i % 100}", HOST, O.READ, T, n)
    again = (time.perf_counter() - started) / len(names)
    assert all(results)
    print(f"index {count} bindings: {built * 1e3:.1f} ms; check: {first * 1e6:.1f} us first, "
          f"{again * 1e6:.2f} us remembered")
    # Generous bounds (a loaded shared machine); typical: a few us and under 1 us.
    assert first < 200e-6 and again < 50e-6
