"""Kafka's ACL model, shared by the controller (which stores ACLs and deletes them by filter)
and the handlers (which describe them and authorize requests by them).

An ACL binding is a resource pattern (resource type, name, LITERAL or PREFIXED) and an access
control entry (principal, host, operation, ALLOW or DENY). A filter has the same fields, any of
which may match everything (ANY codes, None strings); a filter whose pattern type is MATCH
selects the bindings that would apply to the named resource: the literal ones of that name,
the wildcard ``*`` ones and the prefixed ones the name starts with.

Codes are Kafka's wire codes (``AclResourceType``, ``PatternType``, ``AclOperation``,
``AclPermissionType``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kbroker.replicator.v1 import replicator_pb2 as pb

WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
# The principal of a client that did not authenticate (Kafka's KafkaPrincipal.ANONYMOUS).
ANONYMOUS = "User:ANONYMOUS"


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


# The one cluster resource's name (Kafka's "kafka-cluster").
CLUSTER_NAME = "kafka-cluster"


@dataclass(frozen=True, slots=True)
class AclBinding:
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    @classmethod
    def from_pb(cls, message: pb.AclBinding) -> AclBinding:
        return cls(ResourceType(message.resource_type), message.resource_name,
                   PatternType(message.pattern_type), message.principal, message.host,
                   Operation(message.operation), Permission(message.permission_type))

    def to_pb(self) -> pb.AclBinding:
        return pb.AclBinding(
            resource_type=self.resource_type, resource_name=self.resource_name,
            pattern_type=self.pattern_type, principal=self.principal, host=self.host,
            operation=self.operation, permission_type=self.permission)


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Selects bindings; ANY codes and None strings match every value."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    @classmethod
    def from_pb(cls, message: pb.AclFilter) -> AclFilter:
        """The filter of a message whose codes are all known (unset strings match all).
        Raises ValueError for a code outside the enums."""
        return cls(
            resource_type=ResourceType(message.resource_type),
            resource_name=message.resource_name if message.HasField("resource_name") else None,
            pattern_type=PatternType(message.pattern_type),
            principal=message.principal if message.HasField("principal") else None,
            host=message.host if message.HasField("host") else None,
            operation=Operation(message.operation),
            permission=Permission(message.permission_type))

    def matches(self, binding: AclBinding) -> bool:
        return self.matches_pattern(binding) and self.matches_entry(binding)

    def matches_pattern(self, binding: AclBinding) -> bool:
        if self.resource_type not in (ResourceType.ANY, binding.resource_type):
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH, binding.pattern_type):
            return False
        name = self.resource_name
        if name is None:
            return True
        if self.pattern_type in (PatternType.ANY, binding.pattern_type):
            return name == binding.resource_name
        # MATCH: what would apply to the resource called ``name``.
        if binding.pattern_type == PatternType.LITERAL:
            return binding.resource_name in (name, WILDCARD)
        if binding.pattern_type == PatternType.PREFIXED:
            return name.startswith(binding.resource_name)
        return False

    def matches_entry(self, binding: AclBinding) -> bool:
        return ((self.principal is None or self.principal == binding.principal)
                and (self.host is None or self.host == binding.host)
                and self.operation in (Operation.ANY, binding.operation)
                and self.permission in (Permission.ANY, binding.permission))


def invalid_binding_reason(binding: AclBinding) -> str | None:
    """Why ``binding`` cannot be stored (Kafka's checks in CreateAcls), or None."""
    if binding.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        return f"invalid resource type {binding.resource_type.name}"
    if binding.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return f"invalid pattern type {binding.pattern_type.name}"
    if binding.operation in (Operation.UNKNOWN, Operation.ANY):
        return f"invalid operation {binding.operation.name}"
    if binding.permission not in (Permission.ALLOW, Permission.DENY):
        return f"invalid permission type {binding.permission.name}"
    if not binding.resource_name:
        return "resource name must not be empty"
    if (binding.pattern_type == PatternType.PREFIXED and binding.resource_name == WILDCARD):
        return "a prefixed pattern cannot be the wildcard '*'"
    if binding.resource_type == ResourceType.CLUSTER and binding.resource_name != CLUSTER_NAME:
        return f"the cluster resource is named {CLUSTER_NAME!r}"
    principal_type, sep, _ = binding.principal.partition(":")
    if not sep or not principal_type:
        return f"principal {binding.principal!r} is not of the form Type:name"
    if not binding.host:
        return "host must not be empty"
    return None
