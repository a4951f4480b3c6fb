"""Kafka's authorization decisions over ACL bindings (StandardAuthorizer's semantics): which
bindings apply to a resource, principal and host matching, DENY first, the operations an
ALLOW implies, super users, the no-ACL default, authorized-operations bitfields,
authorizeByResourceType, and what a check costs."""

from __future__ import annotations

import time

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
Op = Operation
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
    a = Authorizer([acl(T, "orders", Op.READ)])
    assert allowed(a, Op.READ, "orders")
    assert not allowed(a, Op.READ, "orders2")
    assert not allowed(a, Op.READ, "order")
    assert not allowed(a, Op.WRITE, "orders")
    # Another resource type with the same name has no binding.
    assert not allowed(a, Op.READ, "orders", resource_type=G)


def test_the_literal_wildcard_applies_to_every_name_of_its_type():
    a = Authorizer([acl(T, "*", Op.WRITE)])
    assert allowed(a, Op.WRITE, "anything") and allowed(a, Op.WRITE, "*")
    assert not allowed(a, Op.WRITE, "anything", resource_type=G)


def test_a_prefixed_binding_applies_to_the_names_it_starts():
    a = Authorizer([acl(T, "team-", Op.READ, pattern=PRE), acl(T, "t", Op.WRITE, pattern=PRE)])
    assert allowed(a, Op.READ, "team-a") and allowed(a, Op.READ, "team-")
    assert not allowed(a, Op.READ, "team") and not allowed(a, Op.READ, "xteam-a")
    assert allowed(a, Op.WRITE, "team-a") and allowed(a, Op.WRITE, "t")
    assert not allowed(a, Op.WRITE, "other")


def test_principal_matches_exactly_or_by_the_user_wildcard():
    a = Authorizer([acl(T, "orders", Op.READ), acl(T, "public", Op.READ, principal="User:*")])
    assert allowed(a, Op.READ, "orders", principal=ALICE)
    assert not allowed(a, Op.READ, "orders", principal=BOB)
    assert not allowed(a, Op.READ, "orders", principal="User:Alice")
    assert allowed(a, Op.READ, "public", principal=BOB)
    assert allowed(a, Op.READ, "public", principal="User:ANONYMOUS")


def test_host_matches_exactly_or_by_the_wildcard():
    a = Authorizer([acl(T, "orders", Op.READ, host="10.0.0.1"), acl(T, "any", Op.READ)])
    assert allowed(a, Op.READ, "orders", host="10.0.0.1")
    assert not allowed(a, Op.READ, "orders", host="10.0.0.2")
    assert allowed(a, Op.READ, "any", host="192.168.1.1")


def test_deny_wins_over_any_allow_whatever_pattern_carries_it():
    a = Authorizer([
        acl(T, "*", Op.ALL),
        acl(T, "secret-", Op.READ, pattern=PRE, deny=True),
        acl(T, "orders", Op.WRITE, principal="User:*", deny=True),
        acl(T, "audit", Op.ALL, deny=True, host=HOST),
    ])
    assert allowed(a, Op.READ, "public")
    assert not allowed(a, Op.READ, "secret-plans")
    assert allowed(a, Op.WRITE, "secret-plans")  # the DENY names READ only
    assert not allowed(a, Op.WRITE, "orders") and allowed(a, Op.READ, "orders")
    assert not allowed(a, Op.DESCRIBE, "audit")
    assert allowed(a, Op.DESCRIBE, "audit", host="10.0.0.9")  # the DENY is for one host


def test_allows_imply_describe_and_describe_configs_but_denies_imply_nothing():
    for implying in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
        a = Authorizer([acl(T, "t", implying)])
        assert allowed(a, Op.DESCRIBE, "t"), implying
    for other in (Op.CREATE, Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS, Op.CLUSTER_ACTION):
        assert not allowed(Authorizer([acl(T, "t", other)]), Op.DESCRIBE, "t"), other
    assert allowed(Authorizer([acl(T, "t", Op.ALTER_CONFIGS)]), Op.DESCRIBE_CONFIGS, "t")
    assert not allowed(Authorizer([acl(T, "t", Op.ALTER)]), Op.DESCRIBE_CONFIGS, "t")
    # READ does not imply WRITE, nor DESCRIBE imply READ.
    assert not allowed(Authorizer([acl(T, "t", Op.READ)]), Op.WRITE, "t")
    assert not allowed(Authorizer([acl(T, "t", Op.DESCRIBE)]), Op.READ, "t")
    # A DENY of READ leaves DESCRIBE to the allows.
    a = Authorizer([acl(T, "t", Op.READ, deny=True), acl(T, "t", Op.WRITE)])
    assert allowed(a, Op.DESCRIBE, "t") and not allowed(a, Op.READ, "t")
    # ALL allows (and denies) every operation.
    everything = Authorizer([acl(C, "kafka-cluster", Op.ALL)])
    assert all(allowed(everything, op, "kafka-cluster", resource_type=C)
               for op in (Op.CLUSTER_ACTION, Op.IDEMPOTENT_WRITE, Op.ALTER))


def test_super_users_are_allowed_everything_even_against_denies():
    a = Authorizer([acl(T, "*", Op.ALL, principal="User:*", deny=True)],
                   super_users=parse_super_users("User:admin; User:ops;"))
    assert a.super_users == {"User:admin", "User:ops"}
    assert allowed(a, Op.DELETE, "orders", principal="User:admin")
    assert allowed(a, Op.CLUSTER_ACTION, "kafka-cluster", resource_type=C, principal="User:ops")
    assert not allowed(a, Op.READ, "orders", principal=ALICE)
    assert a.authorize_by_resource_type("User:admin", HOST, Op.WRITE, T)


def test_no_binding_for_the_resource_falls_to_allow_everyone_if_no_acl_found():
    bindings = [acl(T, "orders", Op.READ)]
    strict = Authorizer(bindings)
    lenient = Authorizer(bindings, allow_everyone_if_no_acl_found=True)
    assert not allowed(strict, Op.WRITE, "unprotected")
    assert allowed(lenient, Op.WRITE, "unprotected", principal=BOB)
    # A resource with bindings, none allowing this principal: denied either way.
    assert not allowed(lenient, Op.READ, "orders", principal=BOB)
    assert not allowed(lenient, Op.WRITE, "orders")
    # The default is off.
    assert not allowed(Authorizer([]), Op.DESCRIBE, "t")
    assert allowed(Authorizer([], allow_everyone_if_no_acl_found=True), Op.DESCRIBE, "t")


def test_authorized_operations_are_the_supported_operations_allowed():
    a = Authorizer([acl(T, "t", Op.WRITE), acl(T, "t", Op.ALTER_CONFIGS),
                    acl(G, "g", Op.READ), acl(C, "kafka-cluster", Op.DESCRIBE)])
    assert a.authorized_operations(ALICE, HOST, T, "t") == operations_bitfield(
        [Op.WRITE, Op.DESCRIBE, Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS])
    assert a.authorized_operations(ALICE, HOST, G, "g") == operations_bitfield(
        [Op.READ, Op.DESCRIBE])
    assert a.authorized_operations(ALICE, HOST, C, "kafka-cluster") == 1 << Op.DESCRIBE
    assert a.authorized_operations(BOB, HOST, T, "t") == 0


def test_authorize_by_resource_type_as_kafka_for_idempotent_producers():
    def any_write(*bindings: AclBinding, **options: bool) -> bool:
        return Authorizer(bindings, **options).authorize_by_resource_type(ALICE, HOST, Op.WRITE,
                                                                          T)

    assert not any_write()
    assert any_write(allow_everyone_if_no_acl_found=True)
    assert any_write(acl(T, "orders", Op.WRITE))
    assert any_write(acl(T, "team-", Op.ALL, pattern=PRE))
    assert not any_write(acl(T, "orders", Op.READ))  # no implications here
    assert not any_write(acl(T, "orders", Op.WRITE, principal=BOB))
    assert not any_write(acl(T, "orders", Op.WRITE, host="10.9.9.9"))
    # Dominated allows do not count; an undominated one does.
    assert not any_write(acl(T, "orders", Op.WRITE), acl(T, "orders", Op.WRITE, deny=True))
    assert not any_write(acl(T, "team-a", Op.WRITE), acl(T, "team-", Op.WRITE, pattern=PRE,
                                                        deny=True))
    assert any_write(acl(T, "team-a", Op.WRITE), acl(T, "team-b", Op.WRITE, deny=True))
    # A wildcard deny denies all; a wildcard allow allows unless so denied.
    assert not any_write(acl(T, "*", Op.WRITE), acl(T, "*", Op.WRITE, deny=True))
    assert any_write(acl(T, "*", Op.WRITE), acl(T, "x", Op.WRITE, deny=True))


def test_many_bindings_answer_the_same_first_and_remembered():
    # What a check costs is measured, not asserted (a timed test fails on a loaded machine):
    # the printout gives the index build and per-check times.
    count = 10_000
    bindings = [acl(T, f"topic-{i}", Op.READ, principal=f"User:u{i % 100}") for i in range(count)]
    bindings += [acl(T, f"prefix-{i}-", Op.WRITE, pattern=PRE) for i in range(100)]
    bindings.append(acl(T, "*", Op.DESCRIBE, principal="User:*"))
    started = time.perf_counter()
    a = Authorizer(bindings)
    built = time.perf_counter() - started
    asks = [(f"User:u{i % 100}", f"topic-{i}") for i in range(1000)]
    started = time.perf_counter()
    first = [a.authorize(user, HOST, Op.READ, T, name) for user, name in asks]
    first_each = (time.perf_counter() - started) / len(asks)
    started = time.perf_counter()
    again = [a.authorize(user, HOST, Op.READ, T, name) for user, name in asks]
    again_each = (time.perf_counter() - started) / len(asks)
    print(f"index {count} bindings: {built * 1e3:.1f} ms; check: {first_each * 1e6:.1f} us "
          f"first, {again_each * 1e6:.2f} us remembered")
    assert all(first) and again == first
    # Another user's READ on the same topics is refused (the bindings name u0..u99 only).
    assert not any(a.authorize("User:other", HOST, Op.READ, T, name) for _, name in asks[:50])
