"""ACL bindings (Kafka's ``AclControlManager``): CreateAcls and DeleteAcls, and the bindings a
new cluster starts with (``--initial-acls-file``).

- Create: each binding is checked as Kafka's controller checks a new ACL (INVALID_REQUEST with
  Kafka's messages); a binding stored already succeeds without being stored twice.
- Delete: each filter removes every binding it matches (Kafka's ``AclBindingFilter``
  semantics, :class:`~services.common.acls.AclFilter`) and lists them; a filter with an UNKNOWN
  code is INVALID_REQUEST. A binding matched by several filters is listed by each.

Each request is one commit: every valid change of it is saved and published together, or,
when the save fails, none (each item then fails with UNKNOWN_SERVER_ERROR).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

from kbroker.replicator.v1 import replicator_pb2 as pb
from services.common.acls import (
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from services.common.errors import ErrorCode

from ..metadata import MetadataImage
from ..metadata_store import decode_acl
from .core import ControllerCore

log = logging.getLogger(__name__)

# An item's outcome: None for success, else (error code, message).
Failure = tuple[ErrorCode, str] | None


def _name(enum: type[ResourceType | PatternType | Operation | Permission], code: int) -> str:
    try:
        return enum(code).name
    except ValueError:
        return "UNKNOWN"


def new_acl_error(binding: pb.AclBinding) -> Failure:
    """Why ``binding`` cannot be stored, with Kafka's code and message (the controller's
    ``validateNewAcl``), or None."""
    resource_type = _name(ResourceType, binding.resource_type)
    if resource_type in ("UNKNOWN", "ANY"):
        return ErrorCode.invalid_request, f"Invalid resourceType {resource_type}"
    pattern_type = _name(PatternType, binding.pattern_type)
    if pattern_type not in ("LITERAL", "PREFIXED"):
        return ErrorCode.invalid_request, f"Invalid patternType {pattern_type}"
    operation = _name(Operation, binding.operation)
    if operation in ("UNKNOWN", "ANY"):
        return ErrorCode.invalid_request, f"Invalid operation {operation}"
    permission = _name(Permission, binding.permission_type)
    if permission not in ("ALLOW", "DENY"):
        return ErrorCode.invalid_request, f"Invalid permissionType {permission}"
    if not binding.resource_name:
        return ErrorCode.invalid_request, "Resource name should not be empty"
    return None


def filter_error(acl_filter: pb.AclFilter) -> Failure:
    """Why ``acl_filter`` cannot be used (a code Kafka reads as UNKNOWN), or None."""
    if (_name(ResourceType, acl_filter.resource_type) == "UNKNOWN"
            or _name(PatternType, acl_filter.pattern_type) == "UNKNOWN"):
        return ErrorCode.invalid_request, "Unknown patternFilter."
    if (_name(Operation, acl_filter.operation) == "UNKNOWN"
            or _name(Permission, acl_filter.permission_type) == "UNKNOWN"):
        return ErrorCode.invalid_request, "Unknown entryFilter."
    return None


def create_acls(image: MetadataImage, bindings: Sequence[pb.AclBinding]
                ) -> tuple[MetadataImage, list[Failure]]:
    """The image with the valid ``bindings`` added (each once), and each one's outcome."""
    acls = list(image.acls)
    present = set(acls)
    outcomes: list[Failure] = []
    for message in bindings:
        failure = new_acl_error(message)
        outcomes.append(failure)
        if failure is not None:
            continue
        binding = AclBinding.from_pb(message)
        if binding not in present:
            present.add(binding)
            acls.append(binding)
    if len(acls) == len(image.acls):
        return image, outcomes
    return image.replace(acls=tuple(acls)), outcomes


def delete_acls(image: MetadataImage, filters: Sequence[pb.AclFilter]
                ) -> tuple[MetadataImage, list[Failure | list[AclBinding]]]:
    """The image without the bindings ``filters`` match, and for each filter the bindings it
    matched (or why it could not be used)."""
    outcomes: list[Failure | list[AclBinding]] = []
    removed: set[AclBinding] = set()
    for message in filters:
        failure = filter_error(message)
        if failure is not None:
            outcomes.append(failure)
            continue
        selector = AclFilter.from_pb(message)
        matched = [b for b in image.acls if selector.matches(b)]
        removed.update(matched)
        outcomes.append(matched)
    if not removed:
        return image, outcomes
    return image.replace(acls=tuple(b for b in image.acls if b not in removed)), outcomes


def with_initial_acls(image: MetadataImage, bindings: Iterable[AclBinding]) -> MetadataImage:
    """A new cluster's image with ``bindings`` (checked already) stored."""
    updated, outcomes = create_acls(image, [b.to_pb() for b in bindings])
    for outcome in outcomes:
        if outcome is not None:
            raise ValueError(outcome[1])
    return updated


def load_initial_acls(path: str | Path) -> list[AclBinding]:
    """The bindings of an ``--initial-acls-file``: a JSON list of objects such as
    ``{"resource_type": "TOPIC", "resource_name": "orders", "pattern_type": "LITERAL",
    "principal": "User:alice", "host": "*", "operation": "WRITE", "permission": "ALLOW"}``.
    Raises ValueError (naming the entry) when the file is not such a list or a binding could
    not be stored, OSError when it cannot be read."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON: {e}") from None
    if not isinstance(document, list):
        raise ValueError(f"{path}: expected a JSON list of ACL bindings")
    bindings = []
    for index, entry in enumerate(document):
        try:
            binding = decode_acl(entry)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: binding {index}: {e}") from None
        failure = new_acl_error(binding.to_pb())
        if failure is not None:
            raise ValueError(f"{path}: binding {index}: {failure[1]}")
        bindings.append(binding)
    return bindings


def _result(failure: Failure) -> pb.AclResult:
    if failure is None:
        return pb.AclResult()
    return pb.AclResult(error_code=failure[0].value, error_message=failure[1])


class AclControlManager:
    def __init__(self, core: ControllerCore) -> None:
        self._core = core

    async def create(self, request: pb.CreateAclsRequest) -> pb.CreateAclsResponse:
        """Store the request's bindings; one result per binding, in order."""
        try:
            outcomes = await self._core.commit(
                lambda image: create_acls(image, request.bindings))
        except OSError as e:
            log.error("could not save new ACLs: %s", e)
            # Invalid bindings keep their error; the valid ones were not saved.
            _, checked = create_acls(self._core.image, request.bindings)
            outcomes = [o if o is not None else not_saved(e) for o in checked]
        else:
            for message, outcome in zip(request.bindings, outcomes, strict=True):
                if outcome is None:
                    log.info("ACL stored: %s", AclBinding.from_pb(message))
        return pb.CreateAclsResponse(results=[_result(o) for o in outcomes])

    async def delete(self, request: pb.DeleteAclsRequest) -> pb.DeleteAclsResponse:
        """Remove what the request's filters match; one result per filter, in order."""
        outcomes: list[Failure | list[AclBinding]]
        try:
            outcomes = await self._core.commit(
                lambda image: delete_acls(image, request.filters))
        except OSError as e:
            log.error("could not save ACL deletions: %s", e)
            _, checked = delete_acls(self._core.image, request.filters)
            outcomes = [not_saved(e) if isinstance(o, list) and o else o for o in checked]
        results = []
        for outcome in outcomes:
            if isinstance(outcome, list):
                for binding in outcome:
                    log.info("ACL removed: %s", binding)
                results.append(pb.AclFilterResult(matching=[b.to_pb() for b in outcome]))
            else:
                failure = _result(outcome)
                results.append(pb.AclFilterResult(error_code=failure.error_code,
                                                  error_message=failure.error_message))
        return pb.DeleteAclsResponse(results=results)


def not_saved(error: OSError) -> tuple[ErrorCode, str]:
    """The outcome of a valid change whose commit failed."""
    return ErrorCode.unknown_server_error, f"the cluster metadata could not be saved: {error}"
