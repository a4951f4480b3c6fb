"""DescribeClientQuotas and AlterClientQuotas (KIP-546; Kafka's ``ClientQuotasImage.describe``
and ``ControllerApis`` in front of ``ClientQuotaControlManager``).

    DescribeClientQuotas Request => [components] strict
      components => entity_type match_type match
    DescribeClientQuotas Response => throttle_time_ms error_code error_message [entries]
      entries => [entity => entity_type entity_name] [values => key value]
    AlterClientQuotas Request => [entries] validate_only
      entries => [entity => entity_type entity_name] [ops => key value remove]
    AlterClientQuotas Response => throttle_time_ms [entries]
      entries => error_code error_message [entity => entity_type entity_name]

An entity is (entity type, name) parts, ``user`` and/or ``client-id``, or ``ip``; a null
name (an unset field) is the default entity of the type. Describe reads this handler's
snapshot, filtered as Kafka filters: per entity type one component, matching a name (EXACT,
0), the default entity (DEFAULT, 1) or any entity having that type (SPECIFIED, 2); with
``strict`` an entity must have no other types. A bad filter fails the whole request
(INVALID_REQUEST, an unknown entity type UNSUPPORTED_VERSION; entries null) with Kafka's
messages. Alter goes to the replicator, which checks entities, keys and values as Kafka's
controller does and applies the request in one commit; the snapshot is then reloaded so this
handler's next Describe shows it. A replicator that cannot be reached leaves every entity
REQUEST_TIMED_OUT.

Authorization (Kafka: DESCRIBE_CONFIGS, resp. ALTER_CONFIGS, on the CLUSTER resource, else
CLUSTER_AUTHORIZATION_FAILED) is the authorizer's: each API names it in
``cluster_operation``, checked first (CLUSTER_AUTHORIZATION_FAILED, Kafka's error answer).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.replicator.v1 import replicator_pb2
from services.common.acls import Operation, ResourceType
from services.common.errors import ErrorCode, KafkaError

from ..collaborators import CallError, Controller
from ..metadata_cache import MetadataCache, QuotaEntity
from ..request_context import RequestContext
from .acls import DENIED
from .topics import DEFAULT_CONTROLLER_TIMEOUT_S

log = logging.getLogger(__name__)

USER = "user"
CLIENT_ID = "client-id"
IP = "ip"

MATCH_EXACT = 0
MATCH_DEFAULT = 1
MATCH_SPECIFIED = 2

Component = k.DescribeClientQuotasRequest.ComponentData
DescribedEntry = k.DescribeClientQuotasResponse.EntryData
AlteredEntry = k.AlterClientQuotasResponse.EntryData


def quota_filter(components: Sequence[Component]
                 ) -> tuple[dict[str, str | None], set[str]]:
    """The exact matches (type: name, None for the default) and the types that must be
    present, of a DescribeClientQuotas filter. Raises KafkaError with Kafka's code and
    message for a filter Kafka refuses."""
    exact: dict[str, str | None] = {}
    specified: set[str] = set()
    for component in components:
        kind = component.entity_type
        if not kind:
            raise KafkaError(ErrorCode.invalid_request, "Invalid empty entity type.")
        if kind in exact or kind in specified:
            raise KafkaError(ErrorCode.invalid_request,
                             f"Entity type {kind} cannot appear more than once in the filter.")
        if kind not in (IP, USER, CLIENT_ID):
            raise KafkaError(ErrorCode.unsupported_version, f"Unsupported entity type {kind}")
        match = component.match if component.HasField("match") else None
        if component.match_type == MATCH_EXACT:
            if match is None:
                raise KafkaError(ErrorCode.invalid_request, "Request specified "
                                 "MATCH_TYPE_EXACT, but set match string to null.")
            exact[kind] = match
        elif component.match_type == MATCH_DEFAULT:
            if match is not None:
                raise KafkaError(ErrorCode.invalid_request, "Request specified "
                                 "MATCH_TYPE_DEFAULT, but also specified a match string.")
            exact[kind] = None
        elif component.match_type == MATCH_SPECIFIED:
            if match is not None:
                raise KafkaError(ErrorCode.invalid_request, "Request specified "
                                 "MATCH_TYPE_SPECIFIED, but also specified a match string.")
            specified.add(kind)
        else:
            raise KafkaError(ErrorCode.invalid_request,
                             f"Unknown match type {component.match_type}")
    types = exact.keys() | specified
    if IP in types and (USER in types or CLIENT_ID in types):
        raise KafkaError(ErrorCode.invalid_request, "Invalid entity filter component "
                         "combination. IP filter component should not be used with user or "
                         "clientId filter component.")
    return exact, specified


def matches(entity: QuotaEntity, exact: Mapping[str, str | None], specified: set[str],
            strict: bool) -> bool:
    parts = dict(entity)
    if strict and len(parts) != len(exact) + len(specified):
        return False
    return (all(kind in parts and parts[kind] == name for kind, name in exact.items())
            and all(kind in parts for kind in specified))


class DescribeClientQuotasApi:
    cluster_operation = Operation.DESCRIBE_CONFIGS

    def __init__(self, cache: MetadataCache) -> None:
        self._cache = cache

    async def handle(self, request: k.DescribeClientQuotasRequest,
                     context: RequestContext) -> k.DescribeClientQuotasResponse:
        denied = context.access.check(self.cluster_operation, ResourceType.CLUSTER)
        if denied:
            return k.DescribeClientQuotasResponse(error_code=denied, error_message=DENIED,
                                                  entries_is_null=True)
        try:
            exact, specified = quota_filter(request.components)
        except KafkaError as exc:
            return k.DescribeClientQuotasResponse(error_code=exc.errno,
                                                  error_message=exc.message,
                                                  entries_is_null=True)
        quotas = (await self._cache.current()).client_quotas
        entries = [
            DescribedEntry(
                entity=[k.DescribeClientQuotasResponse.EntityData(entity_type=kind,
                                                                  entity_name=name)
                        for kind, name in entity],
                values=[k.DescribeClientQuotasResponse.ValueData(key=key, value=value)
                        for key, value in sorted(values.items())])
            for entity, values in quotas.items()
            if matches(entity, exact, specified, request.strict)
        ]
        # An empty list is sent as such, not as null (``entries_is_null`` set to false).
        return k.DescribeClientQuotasResponse(error_code=0, entries=entries,
                                              entries_is_null=False)


def _parts(entity: Sequence[k.AlterClientQuotasRequest.EntityData]
           ) -> list[replicator_pb2.QuotaEntityPart]:
    return [replicator_pb2.QuotaEntityPart(
        entity_type=e.entity_type, name=e.entity_name if e.HasField("entity_name") else "",
        is_default=not e.HasField("entity_name")) for e in entity]


def _entity(parts: Sequence[replicator_pb2.QuotaEntityPart]
            ) -> list[k.AlterClientQuotasResponse.EntityData]:
    return [k.AlterClientQuotasResponse.EntityData(
        entity_type=p.entity_type, entity_name=None if p.is_default else p.name) for p in parts]


class AlterClientQuotasApi:
    cluster_operation = Operation.ALTER_CONFIGS

    def __init__(self, cache: MetadataCache, controller: Controller) -> None:
        self._cache = cache
        self._controller = controller

    async def handle(self, request: k.AlterClientQuotasRequest,
                     context: RequestContext) -> k.AlterClientQuotasResponse:
        denied = context.access.check(self.cluster_operation, ResourceType.CLUSTER)
        if denied:
            return k.AlterClientQuotasResponse(entries=[AlteredEntry(
                entity=_entity(_parts(entry.entity)), error_code=denied, error_message=DENIED)
                for entry in request.entries])
        if not request.entries:
            return k.AlterClientQuotasResponse(entries=[])
        alteration = replicator_pb2.AlterClientQuotasRequest(
            validate_only=request.validate_only,
            entries=[replicator_pb2.ClientQuotaAlteration(
                entity=_parts(entry.entity),
                ops=[replicator_pb2.ClientQuotaOp(key=op.key, value=op.value, remove=op.remove)
                     for op in entry.ops])
                for entry in request.entries])
        try:
            answer = await self._controller.alter_client_quotas(
                alteration, DEFAULT_CONTROLLER_TIMEOUT_S)
        except CallError as exc:
            log.warning("altering client quotas failed: %s", exc)
            return k.AlterClientQuotasResponse(entries=[AlteredEntry(
                entity=_entity(a.entity), error_code=ErrorCode.request_timed_out.value,
                error_message=f"the controller did not answer: {exc}")
                for a in alteration.entries])
        if not request.validate_only and any(not r.error_code for r in answer.results):
            await self._cache.reload()
        return k.AlterClientQuotasResponse(entries=[AlteredEntry(
            entity=_entity(r.entity), error_code=r.error_code,
            error_message=r.error_message or None) for r in answer.results])
