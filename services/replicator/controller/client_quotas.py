"""Client quotas (Kafka's ``ClientQuotaControlManager``): AlterClientQuotas.

An entity is a set of (entity type, name) parts: ``user`` and/or ``client-id``, or ``ip``
alone; a part without a name is the default entity of its type. Each entity has quota values
by key (Kafka's ``QuotaConfig``): ``producer_byte_rate``, ``consumer_byte_rate`` (whole
numbers), ``request_percentage``, ``controller_mutation_rate`` for users and client ids;
``connection_creation_rate`` (a whole number) for IPs. Checks, codes and messages are Kafka's
(all INVALID_REQUEST): unknown entity types, an empty entity or name, ``ip`` combined with
another type, an IP that is neither an address nor a resolvable host, a key the entity cannot
have, a value not above 0, a fractional or too large value for a whole-number key, a key or
an entity given twice. Removing a key needs no check (removing an absent one does nothing).
An entity left without values is gone.

One result per entity, in the order entities first appear. Each request is one commit (the
entities that pass are applied together, unless ``validate_only``); when the save fails every
entity's result is UNKNOWN_SERVER_ERROR.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Collection, Sequence

from kbroker.replicator.v1 import replicator_pb2 as pb
from services.common.errors import ErrorCode

from ..metadata import MetadataImage, QuotaEntity, quota_entity
from .acls import not_saved
from .core import ControllerCore

log = logging.getLogger(__name__)

USER = "user"
CLIENT_ID = "client-id"
IP = "ip"
ENTITY_TYPES = (USER, CLIENT_ID, IP)

# Quota keys by the entity types that have them, and whether their values are whole numbers
# (and then their largest value): Kafka's QuotaConfig types LONG, INT and DOUBLE.
_LONG_MAX = float(2**63 - 1)
_INT_MAX = float(2**31 - 1)
USER_AND_CLIENT_KEYS: dict[str, tuple[str, float] | None] = {
    "producer_byte_rate": ("a LONG", _LONG_MAX),
    "consumer_byte_rate": ("a LONG", _LONG_MAX),
    "request_percentage": None,
    "controller_mutation_rate": None,
}
IP_KEYS: dict[str, tuple[str, float] | None] = {"connection_creation_rate": ("an INT", _INT_MAX)}

# An entity's outcome: None for success, else (error code, message).
Failure = tuple[ErrorCode, str] | None


def entity_text(parts: Sequence[pb.QuotaEntityPart]) -> str:
    """Kafka's text of an entity, ``ClientQuotaEntity(entries={user=alice})``."""
    entries = ", ".join(f"{p.entity_type}={'null' if p.is_default else p.name}" for p in parts)
    return f"ClientQuotaEntity(entries={{{entries}}})"


def entity_of(parts: Sequence[pb.QuotaEntityPart]) -> QuotaEntity:
    return quota_entity({p.entity_type: None if p.is_default else p.name for p in parts})


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _entity_error(parts: Sequence[pb.QuotaEntityPart], resolvable: Collection[str]
                  ) -> tuple[Failure, dict[str, tuple[str, float] | None]]:
    """Why the entity cannot have quotas (Kafka's validateEntity and configKeysForEntityType),
    else the keys it may have."""
    if not parts:
        return (ErrorCode.invalid_request, "Invalid empty client quota entity"), {}
    seen: dict[str, str | None] = {}
    for part in parts:
        if part.entity_type in seen:
            return (ErrorCode.invalid_request, "Invalid client quota entity, duplicate entity "
                    f"entry {part.entity_type}"), {}
        if part.entity_type not in ENTITY_TYPES:
            return (ErrorCode.invalid_request,
                    f"Unhandled client quota entity type: {part.entity_type}"), {}
        seen[part.entity_type] = None if part.is_default else part.name
        if not part.is_default and not part.name:
            return (ErrorCode.invalid_request, f"Empty {part.entity_type} not supported"), {}
    if IP in seen:
        if USER in seen or CLIENT_ID in seen:
            return (ErrorCode.invalid_request, "Invalid quota entity combination, IP entity "
                    "shouldnot be combined with User or ClientId"), {}
        ip = seen[IP]
        if ip is not None and not is_ip_literal(ip) and ip not in resolvable:
            return (ErrorCode.invalid_request, f"{ip} is not a valid IP or resolvable host."), {}
        return None, IP_KEYS
    return None, USER_AND_CLIENT_KEYS


def _value_error(keys: dict[str, tuple[str, float] | None], key: str, value: float) -> Failure:
    """Kafka's validateQuotaKeyValue."""
    if key not in keys:
        return ErrorCode.invalid_request, f"Invalid configuration key {key}"
    if not value > 0.0:
        return ErrorCode.invalid_request, f"Quota {key} must be greater than 0"
    whole = keys[key]
    if whole is not None:
        kind, largest = whole
        if value > largest:
            return (ErrorCode.invalid_request,
                    f"Proposed value for {key} is too large for {kind}.")
        if abs(value % 1.0) > 1e-6:
            return ErrorCode.invalid_request, f"{key} cannot be a fractional value."
    return None


def alter_client_quotas(
    image: MetadataImage,
    alterations: Sequence[pb.ClientQuotaAlteration],
    *,
    validate_only: bool = False,
    resolvable: Collection[str] = (),
) -> tuple[MetadataImage, list[tuple[Sequence[pb.QuotaEntityPart], Failure]]]:
    """The image with the valid alterations applied (none with ``validate_only``), and each
    entity's outcome. ``resolvable``: IP entity names known to resolve (host names)."""
    quotas = {entity: dict(values) for entity, values in image.client_quotas.items()}
    results: dict[QuotaEntity, tuple[Sequence[pb.QuotaEntityPart], Failure]] = {}
    changed = False
    for alteration in alterations:
        entity = entity_of(alteration.entity)
        if entity in results:
            results[entity] = (results[entity][0], (
                ErrorCode.invalid_request,
                f"Ignoring duplicate entity {entity_text(alteration.entity)}"))
            continue
        failure, keys = _entity_error(alteration.entity, resolvable)
        ops: dict[str, float | None] = {}
        for op in alteration.ops if failure is None else ():
            if op.key in ops:
                failure = (ErrorCode.invalid_request, f"Duplicate quota key {op.key} not "
                           f"updating quota for this entity {entity_text(alteration.entity)}")
                break
            ops[op.key] = None if op.remove else op.value
            if not op.remove:
                failure = _value_error(keys, op.key, op.value)
                if failure is not None:
                    break
        results[entity] = (alteration.entity, failure)
        if failure is not None or validate_only:
            continue
        values = quotas.get(entity, {})
        for key, value in ops.items():
            if value is None:
                changed |= values.pop(key, None) is not None
            elif values.get(key) != value:
                values[key] = value
                changed = True
        if values:
            quotas[entity] = values
        else:
            quotas.pop(entity, None)
    # A later duplicate cancels an entity that passed: put its values back.
    for entity, (_, failure) in results.items():
        if failure is not None:
            if entity in image.client_quotas:
                quotas[entity] = dict(image.client_quotas[entity])
            else:
                quotas.pop(entity, None)
    outcomes = list(results.values())
    if not changed or quotas == {e: dict(v) for e, v in image.client_quotas.items()}:
        return image, outcomes
    return image.replace(client_quotas=quotas), outcomes


async def resolvable_hosts(alterations: Sequence[pb.ClientQuotaAlteration]) -> set[str]:
    """The IP entity names that are host names resolving to an address (looked up in
    threads, before the commit)."""
    names = {p.name for a in alterations for p in a.entity
             if p.entity_type == IP and not p.is_default and p.name and not is_ip_literal(p.name)}

    async def resolves(name: str) -> bool:
        try:
            await asyncio.to_thread(socket.getaddrinfo, name, None)
        except (OSError, UnicodeError):
            return False
        return True

    found = await asyncio.gather(*(resolves(n) for n in names))
    return {name for name, ok in zip(names, found, strict=True) if ok}


class ClientQuotaControlManager:
    def __init__(self, core: ControllerCore) -> None:
        self._core = core

    async def alter(self, request: pb.AlterClientQuotasRequest) -> pb.AlterClientQuotasResponse:
        resolvable = await resolvable_hosts(request.entries)
        try:
            outcomes = await self._core.commit(lambda image: alter_client_quotas(
                image, request.entries, validate_only=request.validate_only,
                resolvable=resolvable))
        except OSError as e:
            log.error("could not save client quotas: %s", e)
            # Refused entities keep their error; the valid ones were not saved.
            _, checked = alter_client_quotas(
                self._core.image, request.entries, validate_only=request.validate_only,
                resolvable=resolvable)
            outcomes = [(parts, failure or not_saved(e)) for parts, failure in checked]
        results = []
        for parts, failure in outcomes:
            if failure is None:
                if not request.validate_only:
                    log.info("client quotas of %s changed", entity_text(parts))
                results.append(pb.ClientQuotaResult(entity=parts))
            else:
                results.append(pb.ClientQuotaResult(
                    entity=parts, error_code=failure[0].value, error_message=failure[1]))
        return pb.AlterClientQuotasResponse(results=results)
