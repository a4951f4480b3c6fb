"""What one request may do: its principal and client host checked against the authorizer of
the current metadata snapshot (Kafka's ``AuthHelper`` bound to a request), and the one place
that says which error a denied check is answered with.

API modules check with one call each: ``context.access.check(Operation.WRITE,
ResourceType.TOPIC, name)`` is 0 when allowed, else the error for the resource type
(TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED,
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, DELEGATION_TOKEN_AUTHORIZATION_FAILED: Kafka's
``AclEntry.authorizationError``). The cluster is the default resource, so
``check(Operation.ALTER, ResourceType.CLUSTER)`` is what cluster-wide admin APIs ask (ACLs:
ALTER / DESCRIBE; client quotas: ALTER_CONFIGS / DESCRIBE_CONFIGS; SCRAM credentials: ALTER /
DESCRIBE).

Without an authorizer (``authorizer_enabled`` false) every check passes and authorized
operations are every operation a resource supports, as from a Kafka broker without one.
"""

from __future__ import annotations

from collections.abc import Iterable

from services.common.acls import ANONYMOUS, CLUSTER_NAME, AclBinding, Operation, ResourceType
from services.common.errors import ErrorCode

from .authorizer import SUPPORTED_OPERATIONS, Authorizer, operations_bitfield

# The error a denied check is answered with, by the resource checked.
AUTHORIZATION_ERRORS: dict[ResourceType, int] = {
    ResourceType.TOPIC: ErrorCode.topic_authorization_failed.value,
    ResourceType.GROUP: ErrorCode.group_authorization_failed.value,
    ResourceType.CLUSTER: ErrorCode.cluster_authorization_failed.value,
    ResourceType.TRANSACTIONAL_ID: ErrorCode.transactional_id_authorization_failed.value,
    ResourceType.DELEGATION_TOKEN: ErrorCode.delegation_token_authorization_failed.value,
}


def authorization_error(resource_type: ResourceType) -> int:
    """The Kafka error for a denied operation on a resource of this type."""
    return AUTHORIZATION_ERRORS[resource_type]


class Access:
    """One request's principal and client host, checked against an authorizer (None: no
    authorizer, everything allowed)."""

    __slots__ = ("_authorizer", "host", "principal")

    def __init__(self, authorizer: Authorizer | None, principal: str = ANONYMOUS,
                 host: str = "") -> None:
        self._authorizer = authorizer
        self.principal = principal
        self.host = host

    @property
    def enabled(self) -> bool:
        return self._authorizer is not None

    def allows(self, operation: Operation, resource_type: ResourceType,
               name: str = CLUSTER_NAME) -> bool:
        authorizer = self._authorizer
        return authorizer is None or authorizer.authorize(
            self.principal, self.host, operation, resource_type, name)

    def check(self, operation: Operation, resource_type: ResourceType,
              name: str = CLUSTER_NAME) -> int:
        """0 when allowed, else the error a denied check on this resource is answered with."""
        if self.allows(operation, resource_type, name):
            return 0
        return authorization_error(resource_type)

    def check_any(self, operations: Iterable[Operation], resource_type: ResourceType,
                  name: str = CLUSTER_NAME) -> int:
        """0 when one of ``operations`` is allowed, else the resource type's error."""
        if any(self.allows(op, resource_type, name) for op in operations):
            return 0
        return authorization_error(resource_type)

    def denied(self, operation: Operation, resource_type: ResourceType,
               names: Iterable[str]) -> set[str]:
        """The ``names`` not allowed ``operation`` (Kafka's ``filterByAuthorized``, inverted)."""
        if self._authorizer is None:
            return set()
        return {n for n in set(names) if not self.allows(operation, resource_type, n)}

    def allows_any(self, operation: Operation, resource_type: ResourceType) -> bool:
        """Whether some resource of the type allows ``operation`` (Kafka's
        ``authorizeByResourceType``)."""
        authorizer = self._authorizer
        return authorizer is None or authorizer.authorize_by_resource_type(
            self.principal, self.host, operation, resource_type)

    def operations(self, resource_type: ResourceType, name: str = CLUSTER_NAME) -> int:
        """The resource's authorized-operations bitfield for this principal."""
        authorizer = self._authorizer
        if authorizer is None:
            return operations_bitfield(SUPPORTED_OPERATIONS[resource_type])
        return authorizer.authorized_operations(self.principal, self.host, resource_type, name)


UNRESTRICTED = Access(None)


class Authorization:
    """The handler's authorizer settings, and an :class:`Authorizer` per set of bindings
    (rebuilt only when a snapshot brings different ACLs)."""

    def __init__(self, *, enabled: bool, super_users: Iterable[str] = (),
                 allow_everyone_if_no_acl_found: bool = False) -> None:
        self.enabled = enabled
        self._super_users = frozenset(super_users)
        self._allow_everyone = allow_everyone_if_no_acl_found
        self._authorizer = Authorizer((), super_users=self._super_users,
                                      allow_everyone_if_no_acl_found=self._allow_everyone)

    def authorizer(self, acls: tuple[AclBinding, ...]) -> Authorizer:
        """The authorizer over ``acls`` (a snapshot's)."""
        current = self._authorizer
        if current.bindings is not acls:
            if current.bindings == acls:
                current.bindings = acls  # the same bindings: compared once per snapshot
            else:
                current = self._authorizer = Authorizer(
                    acls, super_users=self._super_users,
                    allow_everyone_if_no_acl_found=self._allow_everyone)
        return current

    def access(self, acls: tuple[AclBinding, ...] | None, principal: str,
               host: str) -> Access:
        """A request's access: unrestricted without an authorizer; with one, checked against
        ``acls`` (None: no snapshot yet, so no bindings)."""
        if not self.enabled:
            return UNRESTRICTED
        return Access(self.authorizer(acls or ()), principal, host)
