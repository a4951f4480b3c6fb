"""DescribeAcls, CreateAcls and DeleteAcls (Kafka's ``AclApis`` in front of the controller's
``AclControlManager``).

    DescribeAcls Request => resource_type_filter resource_name_filter pattern_type_filter
                            principal_filter host_filter operation permission_type
    DescribeAcls Response => throttle_time_ms error_code error_message [resources]
      resources => resource_type resource_name pattern_type [acls]
        acls => principal host operation permission_type
    CreateAcls Request => [creations]
      creations => resource_type resource_name resource_pattern_type principal host operation
                   permission_type
    CreateAcls Response => throttle_time_ms [results => error_code error_message]
    DeleteAcls Request => [filters]
      filters => resource_type_filter resource_name_filter pattern_type_filter
                 principal_filter host_filter operation permission_type
    DeleteAcls Response => throttle_time_ms [filter_results]
      filter_results => error_code error_message [matching_acls]
        matching_acls => error_code error_message resource_type resource_name pattern_type
                         principal host operation permission_type

The ACLs live in the cluster metadata: DescribeAcls reads this handler's snapshot; CreateAcls
and DeleteAcls go to the replicator (one commit per request), after which the snapshot is
reloaded, so this handler's next DescribeAcls shows the change. They work whether or not an
authorizer enforces the ACLs (Kafka answers SECURITY_DISABLED without one; here the ACLs are
always stored). Null strings are unset fields; in a hand-made request (grpcurl) an unset code
of a filter matches anything, as ANY (1) does. A code Kafka reads as UNKNOWN (0, or one it
does not know) in a filter is INVALID_REQUEST (Kafka refuses such a request as malformed).

Authorization (Kafka: DESCRIBE on the CLUSTER resource for DescribeAcls, ALTER for the others,
else CLUSTER_AUTHORIZATION_FAILED) is the authorizer's: each API names what it needs in
``cluster_operation``, checked first (CLUSTER_AUTHORIZATION_FAILED, Kafka's error answer).
"""

from __future__ import annotations

import logging
from typing import Any

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.replicator.v1 import replicator_pb2
from services.common.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from services.common.errors import ErrorCode

from ..collaborators import CallError, Controller
from ..metadata_cache import MetadataCache
from ..request_context import RequestContext
from .topics import DEFAULT_CONTROLLER_TIMEOUT_S

log = logging.getLogger(__name__)

# Kafka's message for CLUSTER_AUTHORIZATION_FAILED, which the admin APIs of security answer.
DENIED = "Cluster authorization failed."

_ENUMS: dict[str, type[ResourceType | PatternType | Operation | Permission]] = {
    "resource_type": ResourceType, "pattern_type": PatternType, "operation": Operation,
    "permission_type": Permission,
}


def _code(message: Any, field: str, kind: str) -> int:
    """A filter's code: ANY when a hand-made request left it unset, UNKNOWN (0) for codes
    Kafka does not know."""
    if not message.HasField(field):
        return 1
    value = getattr(message, field)
    try:
        return int(_ENUMS[kind](value))
    except ValueError:
        return 0


def _text(message: Any, field: str) -> str | None:
    return getattr(message, field) if message.HasField(field) else None


def filter_message(request: Any) -> replicator_pb2.AclFilter:
    """The replicator's filter of a DescribeAcls request or DeleteAcls filter."""
    return replicator_pb2.AclFilter(
        resource_type=_code(request, "resource_type_filter", "resource_type"),
        resource_name=_text(request, "resource_name_filter"),
        pattern_type=_code(request, "pattern_type_filter", "pattern_type"),
        principal=_text(request, "principal_filter"),
        host=_text(request, "host_filter"),
        operation=_code(request, "operation", "operation"),
        permission_type=_code(request, "permission_type", "permission_type"))


def has_unknown_code(message: replicator_pb2.AclFilter) -> bool:
    return 0 in (message.resource_type, message.pattern_type, message.operation,
                 message.permission_type)


def describe(acls: tuple[AclBinding, ...], selector: AclFilter
             ) -> list[k.DescribeAclsResponse.DescribeAclsResource]:
    """The bindings ``selector`` matches, grouped by resource pattern in the order the
    patterns were first stored (Kafka's ``DescribeAclsResponse.aclsResources``)."""
    resources: dict[tuple[int, str, int], k.DescribeAclsResponse.DescribeAclsResource] = {}
    for binding in acls:
        if not selector.matches(binding):
            continue
        key = (binding.resource_type, binding.resource_name, binding.pattern_type)
        resource = resources.get(key)
        if resource is None:
            resource = resources[key] = k.DescribeAclsResponse.DescribeAclsResource(
                resource_type=binding.resource_type, resource_name=binding.resource_name,
                pattern_type=binding.pattern_type)
        resource.acls.add(principal=binding.principal, host=binding.host,
                          operation=binding.operation, permission_type=binding.permission)
    return list(resources.values())


class DescribeAclsApi:
    cluster_operation = Operation.DESCRIBE

    def __init__(self, cache: MetadataCache) -> None:
        self._cache = cache

    async def handle(self, request: k.DescribeAclsRequest,
                     context: RequestContext) -> k.DescribeAclsResponse:
        denied = context.access.check(self.cluster_operation, ResourceType.CLUSTER)
        if denied:
            return k.DescribeAclsResponse(error_code=denied, error_message=DENIED)
        message = filter_message(request)
        if has_unknown_code(message):
            return k.DescribeAclsResponse(
                error_code=ErrorCode.invalid_request.value,
                error_message="DescribeAclsRequest contains UNKNOWN elements")
        snapshot = await self._cache.current()
        return k.DescribeAclsResponse(error_code=0,
                                      resources=describe(snapshot.acls, AclFilter.from_pb(message)))


def creation_error(creation: k.CreateAclsRequest.AclCreation) -> str | None:
    """What Kafka's broker refuses before the controller sees a creation (AclApis)."""
    if (creation.resource_type == ResourceType.CLUSTER
            and creation.resource_name != CLUSTER_NAME):
        return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
    if not creation.resource_name:
        return "Invalid empty resource name"
    return None


CreationResult = k.CreateAclsResponse.AclCreationResult
FilterResult = k.DeleteAclsResponse.DeleteAclsFilterResult
MatchingAcl = k.DeleteAclsResponse.DeleteAclsMatchingAcl


class CreateAclsApi:
    cluster_operation = Operation.ALTER

    def __init__(self, cache: MetadataCache, controller: Controller) -> None:
        self._cache = cache
        self._controller = controller

    async def handle(self, request: k.CreateAclsRequest,
                     context: RequestContext) -> k.CreateAclsResponse:
        denied = context.access.check(self.cluster_operation, ResourceType.CLUSTER)
        if denied:
            return k.CreateAclsResponse(results=[
                CreationResult(error_code=denied, error_message=DENIED)
                for _ in request.creations])
        results: list[Any] = []
        pending: list[tuple[int, replicator_pb2.AclBinding]] = []
        for index, creation in enumerate(request.creations):
            problem = creation_error(creation)
            if problem is not None:
                results.append(CreationResult(error_code=ErrorCode.invalid_request.value,
                                      error_message=problem))
                continue
            results.append(None)
            pending.append((index, replicator_pb2.AclBinding(
                resource_type=creation.resource_type, resource_name=creation.resource_name,
                pattern_type=creation.resource_pattern_type, principal=creation.principal,
                host=creation.host, operation=creation.operation,
                permission_type=creation.permission_type)))
        if pending:
            try:
                answer = await self._controller.create_acls(
                    replicator_pb2.CreateAclsRequest(bindings=[b for _, b in pending]),
                    DEFAULT_CONTROLLER_TIMEOUT_S)
                outcomes = [(r.error_code, r.error_message) for r in answer.results]
                if len(outcomes) != len(pending):
                    raise CallError("the controller answered for other bindings")
            except CallError as exc:
                log.warning("creating ACLs failed: %s", exc)
                outcomes = [(ErrorCode.request_timed_out.value,
                             f"the controller did not answer: {exc}")] * len(pending)
            for (index, _), (code, text) in zip(pending, outcomes, strict=True):
                results[index] = CreationResult(error_code=code, error_message=text or None)
            if any(code == 0 for code, _ in outcomes):
                await self._cache.reload()
        return k.CreateAclsResponse(results=results)


class DeleteAclsApi:
    cluster_operation = Operation.ALTER

    def __init__(self, cache: MetadataCache, controller: Controller) -> None:
        self._cache = cache
        self._controller = controller

    async def handle(self, request: k.DeleteAclsRequest,
                     context: RequestContext) -> k.DeleteAclsResponse:
        denied = context.access.check(self.cluster_operation, ResourceType.CLUSTER)
        if denied:
            return k.DeleteAclsResponse(filter_results=[
                FilterResult(error_code=denied, error_message=DENIED) for _ in request.filters])
        if not request.filters:
            return k.DeleteAclsResponse(filter_results=[])
        filters = [filter_message(f) for f in request.filters]
        try:
            answer = await self._controller.delete_acls(
                replicator_pb2.DeleteAclsRequest(filters=filters), DEFAULT_CONTROLLER_TIMEOUT_S)
            if len(answer.results) != len(filters):
                raise CallError("the controller answered for other filters")
        except CallError as exc:
            log.warning("deleting ACLs failed: %s", exc)
            return k.DeleteAclsResponse(filter_results=[FilterResult(
                error_code=ErrorCode.request_timed_out.value,
                error_message=f"the controller did not answer: {exc}") for _ in filters])
        results = []
        for outcome in answer.results:
            if outcome.error_code:
                results.append(FilterResult(error_code=outcome.error_code,
                                      error_message=outcome.error_message or None))
                continue
            results.append(FilterResult(error_code=0, matching_acls=[MatchingAcl(
                error_code=0, resource_type=b.resource_type, resource_name=b.resource_name,
                pattern_type=b.pattern_type, principal=b.principal, host=b.host,
                operation=b.operation, permission_type=b.permission_type)
                for b in outcome.matching]))
        if any(r.matching for r in answer.results):
            await self._cache.reload()
        return k.DeleteAclsResponse(filter_results=results)
