"""Kafka's ACL authorization (the ``StandardAuthorizer`` of a KRaft broker), over the ACL
bindings of one cluster metadata snapshot. Pure: no I/O, no clock.

A check asks whether ``principal`` connecting from ``host`` may do ``operation`` on the
resource ``(resource_type, name)``:

- super users (``super.users``) may do everything;
- the bindings that apply to the resource are the LITERAL ones of that name, the LITERAL
  wildcard ``*`` ones and the PREFIXED ones the name starts with; a binding matches the
  request when its principal is the request's or ``User:*`` and its host the request's or
  ``*``;
- a matching DENY for the operation or ALL denies (DENY first, whatever allows);
- else a matching ALLOW for the operation or ALL allows, and so does an ALLOW that implies the
  operation: READ, WRITE, DELETE and ALTER imply DESCRIBE, ALTER_CONFIGS implies
  DESCRIBE_CONFIGS (ALLOW only: denying READ does not deny DESCRIBE);
- a resource no binding applies to at all is allowed only with
  ``allow.everyone.if.no.acl.found``; one that has bindings, none allowing, is denied.

:meth:`Authorizer.authorize_by_resource_type` is Kafka's ``authorizeByResourceType``
(KIP-679): whether some resource of the type may be used, as the idempotent producer's
InitProducerId asks for WRITE on any topic.

Bindings are indexed by resource type and name when the authorizer is built (once per
snapshot), so a check looks up the literal name, the wildcard and one entry per distinct prefix
length, and results are remembered per (principal, host, operation, resource) for the
snapshot's life. Not thread-safe; used from one event loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from services.common.acls import (
    CLUSTER_NAME,
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

# The operations each concrete resource type supports (Kafka's
# ``AclEntry.supportedOperations``): the bits of an authorized-operations field.
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[Operation, ...]] = {
    ResourceType.TOPIC: (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE,
                         Operation.DELETE, Operation.ALTER, Operation.DESCRIBE_CONFIGS,
                         Operation.ALTER_CONFIGS),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE,
                         Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
    ResourceType.CLUSTER: (Operation.CREATE, Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS,
                           Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE, Operation.ALTER,
                           Operation.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (Operation.DESCRIBE, Operation.WRITE),
    ResourceType.DELEGATION_TOKEN: (Operation.DESCRIBE,),
    ResourceType.USER: (Operation.CREATE_TOKENS, Operation.DESCRIBE_TOKENS),
}

# What an ALLOW of an operation allows besides itself.
_IMPLIED_BY: dict[Operation, frozenset[Operation]] = {
    Operation.DESCRIBE: frozenset({Operation.READ, Operation.WRITE, Operation.DELETE,
                                   Operation.ALTER}),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.ALTER_CONFIGS}),
}
# The name Kafka's authorizeByResourceType checks first, so that super users and
# allow.everyone.if.no.acl.found pass whatever the bindings of the type say.
_HARDCODED_NAME = "hardcode"
# Remembered results per authorizer (a snapshot's): forgotten all at once past this many.
_MEMO_LIMIT = 65536


def operations_bitfield(operations: Iterable[Operation]) -> int:
    """Kafka's authorized-operations field: bit ``code`` set for each operation."""
    bits = 0
    for operation in operations:
        bits |= 1 << int(operation)
    return bits


def parse_super_users(value: str) -> frozenset[str]:
    """``super.users``: principals separated by ';' (``User:admin;User:ops``)."""
    return frozenset(p.strip() for p in value.split(";") if p.strip())


@dataclass(frozen=True, slots=True)
class _Entry:
    """A binding's access control entry, for matching."""

    principal: str
    host: str
    operation: Operation
    allow: bool

    def matches(self, principal: str, host: str, operation: Operation) -> bool:
        if self.principal != principal and self.principal != WILDCARD_PRINCIPAL:
            return False
        if self.host != WILDCARD and self.host != host:
            return False
        if self.operation == Operation.ALL or self.operation == operation:
            return True
        # Implications apply to ALLOW entries only.
        return self.allow and self.operation in _IMPLIED_BY.get(operation, ())


class _TypeIndex:
    """The bindings of one resource type: literal by name (the wildcard among them) and
    prefixed by prefix, with the prefix lengths present."""

    __slots__ = ("literal", "prefix_lengths", "prefixed")

    def __init__(self) -> None:
        self.literal: dict[str, list[_Entry]] = {}
        self.prefixed: dict[str, list[_Entry]] = {}
        self.prefix_lengths: tuple[int, ...] = ()

    def applicable(self, name: str) -> list[_Entry]:
        entries: list[_Entry] = []
        entries += self.literal.get(name, ())
        if name != WILDCARD:
            entries += self.literal.get(WILDCARD, ())
        for length in self.prefix_lengths:
            if length > len(name):
                break
            entries += self.prefixed.get(name[:length], ())
        return entries


class Authorizer:
    """Kafka's authorization decisions over one set of bindings (see the module doc)."""

    def __init__(self, bindings: Iterable[AclBinding], *,
                 super_users: Iterable[str] = (),
                 allow_everyone_if_no_acl_found: bool = False) -> None:
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self.bindings = tuple(bindings)
        self._types: dict[ResourceType, _TypeIndex] = {}
        for binding in self.bindings:
            if binding.permission not in (Permission.ALLOW, Permission.DENY):
                continue
            index = self._types.setdefault(binding.resource_type, _TypeIndex())
            entry = _Entry(binding.principal, binding.host, binding.operation,
                           binding.permission == Permission.ALLOW)
            if binding.pattern_type == PatternType.LITERAL:
                index.literal.setdefault(binding.resource_name, []).append(entry)
            elif binding.pattern_type == PatternType.PREFIXED:
                index.prefixed.setdefault(binding.resource_name, []).append(entry)
        for index in self._types.values():
            index.prefix_lengths = tuple(sorted({len(p) for p in index.prefixed}))
        self._memo: dict[tuple[str, str, Operation, ResourceType, str], bool] = {}

    def authorize(self, principal: str, host: str, operation: Operation,
                  resource_type: ResourceType, name: str = CLUSTER_NAME) -> bool:
        """Whether ``principal`` from ``host`` may do ``operation`` on the resource."""
        if principal in self.super_users:
            return True
        key = (principal, host, operation, resource_type, name)
        known = self._memo.get(key)
        if known is not None:
            return known
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        result = self._memo[key] = self._decide(principal, host, operation, resource_type, name)
        return result

    def _decide(self, principal: str, host: str, operation: Operation,
                resource_type: ResourceType, name: str) -> bool:
        index = self._types.get(resource_type)
        entries = index.applicable(name) if index is not None else []
        if not entries:
            return self.allow_everyone_if_no_acl_found
        allowed = False
        for entry in entries:
            if entry.matches(principal, host, operation):
                if not entry.allow:
                    return False
                allowed = True
        return allowed

    def authorized_operations(self, principal: str, host: str, resource_type: ResourceType,
                              name: str) -> int:
        """The authorized-operations bitfield of the resource: each operation its type
        supports that the principal may do (Kafka's ``AuthHelper.authorizedOperations``)."""
        return operations_bitfield(
            op for op in SUPPORTED_OPERATIONS.get(resource_type, ())
            if self.authorize(principal, host, op, resource_type, name))

    def authorize_by_resource_type(self, principal: str, host: str, operation: Operation,
                                   resource_type: ResourceType) -> bool:
        """Whether some resource of ``resource_type`` may be used for ``operation`` (Kafka's
        default ``Authorizer.authorizeByResourceType``): an ALLOW of the operation (or ALL)
        for the principal and host on a pattern no DENY dominates (a wildcard DENY, a
        LITERAL DENY of the same name, or a PREFIXED DENY of a prefix of it). Implications do
        not apply here."""
        if self.authorize(principal, host, operation, resource_type, _HARDCODED_NAME):
            return True
        deny_literal: set[str] = set()
        deny_prefixed: set[str] = set()
        allow: list[tuple[PatternType, str]] = []
        wildcard_allow = False
        for b in self.bindings:
            if b.resource_type != resource_type:
                continue
            if b.host not in (host, WILDCARD) or b.principal not in (principal,
                                                                    WILDCARD_PRINCIPAL):
                continue
            if b.operation not in (operation, Operation.ALL):
                continue
            if b.permission == Permission.DENY:
                if b.pattern_type == PatternType.LITERAL:
                    if b.resource_name == WILDCARD:
                        return False
                    deny_literal.add(b.resource_name)
                elif b.pattern_type == PatternType.PREFIXED:
                    deny_prefixed.add(b.resource_name)
            elif b.permission == Permission.ALLOW:
                if b.pattern_type == PatternType.LITERAL and b.resource_name == WILDCARD:
                    wildcard_allow = True
                elif b.pattern_type in (PatternType.LITERAL, PatternType.PREFIXED):
                    allow.append((b.pattern_type, b.resource_name))
        if wildcard_allow:
            return True
        for pattern_type, name in allow:
            if pattern_type == PatternType.LITERAL and name in deny_literal:
                continue
            if not any(name[:i] in deny_prefixed for i in range(1, len(name) + 1)):
                return True
        return False
