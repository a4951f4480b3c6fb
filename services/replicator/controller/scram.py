"""SCRAM credentials (Kafka's ``ScramControlManager``): AlterUserScramCredentials.

The handler has already turned each upsertion's salted password into the stored and server
keys (RFC 5802); the image keeps those, the salt and the iteration count, by user and
mechanism (never a password). Checks, codes and messages are Kafka's:

- a user named twice in one request (deletion or upsertion, any mechanism):
  DUPLICATE_RESOURCE for that user, nothing of it applied;
- an empty user name: UNACCEPTABLE_CREDENTIAL; an unknown mechanism:
  UNSUPPORTED_SASL_MECHANISM;
- iterations outside 4096..16384: UNACCEPTABLE_CREDENTIAL;
- deleting a credential that does not exist: RESOURCE_NOT_FOUND.

One result per user, in the order users first appear in the request. Each request is one
commit; when the save fails every user's result is UNKNOWN_SERVER_ERROR.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence

from kbroker.replicator.v1 import replicator_pb2 as pb
from services.common.errors import ErrorCode

from ..metadata import MetadataImage, ScramCredential, ScramKey
from .acls import not_saved
from .core import ControllerCore

log = logging.getLogger(__name__)


class ScramMechanism(enum.IntEnum):
    """Kafka's ``ScramMechanism`` codes, with the names SASL uses."""

    SCRAM_SHA_256 = 1
    SCRAM_SHA_512 = 2

    @property
    def mechanism_name(self) -> str:
        return self.name.replace("_", "-")


# Kafka's ScramMechanism.minIterations (both mechanisms) and ScramControlManager's maximum.
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384

DUPLICATE = "A user credential cannot be altered twice in the same request"

# A user's outcome: None for success, else (error code, message).
Failure = tuple[ErrorCode, str] | None


def _name_and_mechanism_error(user: str, mechanism: int) -> Failure:
    if not user:
        return ErrorCode.unacceptable_credential, "Username must not be empty"
    if mechanism not in ScramMechanism.__members__.values():
        return ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
    return None


def upsertion_error(upsertion: pb.ScramCredentialUpsertion) -> Failure:
    """Why ``upsertion`` cannot be stored, whatever is stored already, or None."""
    failure = _name_and_mechanism_error(upsertion.user, upsertion.mechanism)
    if failure is not None:
        return failure
    if upsertion.iterations < MIN_ITERATIONS:
        return ErrorCode.unacceptable_credential, "Too few iterations"
    if upsertion.iterations > MAX_ITERATIONS:
        return ErrorCode.unacceptable_credential, "Too many iterations"
    return None


def alter_credentials(
    image: MetadataImage,
    deletions: Sequence[pb.ScramCredentialDeletion],
    upsertions: Sequence[pb.ScramCredentialUpsertion],
) -> tuple[MetadataImage, list[tuple[str, Failure]]]:
    """The image with the valid changes applied, and each user's outcome."""
    changes: dict[str, pb.ScramCredentialDeletion | pb.ScramCredentialUpsertion] = {}
    failures: dict[str, Failure] = {}
    order: dict[str, None] = {}
    for change in [*deletions, *upsertions]:
        user = change.user
        order.setdefault(user)
        if user in failures:
            continue
        if user in changes:
            del changes[user]
            failures[user] = (ErrorCode.duplicate_resource, DUPLICATE)
            continue
        if isinstance(change, pb.ScramCredentialDeletion):
            failure = _name_and_mechanism_error(user, change.mechanism)
            if failure is None and (user, change.mechanism) not in image.scram_credentials:
                failure = (ErrorCode.resource_not_found,
                           "Attempt to delete a user credential that does not exist")
        else:
            failure = upsertion_error(change)
        if failure is not None:
            failures[user] = failure
        else:
            changes[user] = change
    credentials: dict[ScramKey, ScramCredential] = dict(image.scram_credentials)
    for user, change in changes.items():
        if isinstance(change, pb.ScramCredentialDeletion):
            del credentials[(user, change.mechanism)]
        else:
            credentials[(user, change.mechanism)] = ScramCredential(
                salt=change.salt, stored_key=change.stored_key, server_key=change.server_key,
                iterations=change.iterations)
    outcomes = [(user, failures.get(user)) for user in order]
    if not changes:
        return image, outcomes
    return image.replace(scram_credentials=credentials), outcomes


class ScramControlManager:
    def __init__(self, core: ControllerCore) -> None:
        self._core = core

    async def alter(self, request: pb.AlterScramCredentialsRequest
                    ) -> pb.AlterScramCredentialsResponse:
        try:
            outcomes = await self._core.commit(lambda image: alter_credentials(
                image, request.deletions, request.upsertions))
        except OSError as e:
            log.error("could not save SCRAM credentials: %s", e)
            # Refused changes keep their error; the valid ones were not saved.
            _, checked = alter_credentials(self._core.image, request.deletions,
                                           request.upsertions)
            outcomes = [(user, failure or not_saved(e)) for user, failure in checked]
        results = []
        for user, failure in outcomes:
            if failure is None:
                log.info("SCRAM credentials of user %r changed", user)
                results.append(pb.ScramCredentialResult(user=user))
            else:
                results.append(pb.ScramCredentialResult(
                    user=user, error_code=failure[0].value, error_message=failure[1]))
        return pb.AlterScramCredentialsResponse(results=results)
