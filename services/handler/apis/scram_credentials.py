"""DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554; Kafka's
``ScramImage.describe`` and ``ControllerApis`` in front of ``ScramControlManager``).

    DescribeUserScramCredentials Request => [users => name]
    DescribeUserScramCredentials Response => throttle_time_ms error_code error_message [results]
      results => user error_code error_message [credential_infos => mechanism iterations]
    AlterUserScramCredentials Request => [deletions] [upsertions]
      deletions => name mechanism
      upsertions => name mechanism iterations salt salted_password
    AlterUserScramCredentials Response => throttle_time_ms [results]
      results => user error_code error_message

Describe reads this handler's snapshot: no (or a null) user list describes every user with a
credential; a user named twice is DUPLICATE_RESOURCE, one without any credential
RESOURCE_NOT_FOUND, with Kafka's messages. Alter: the client sends SaltedPassword (RFC 5802
``Hi(password, salt, i)``); the handler derives what a server keeps, ``StoredKey =
H(HMAC(SaltedPassword, "Client Key"))`` and ``ServerKey = HMAC(SaltedPassword, "Server
Key")``, with SHA-256 or SHA-512 by mechanism, so the salted password goes no further. The
replicator checks the request as Kafka's controller does (names, mechanisms, iterations
4096..16384, duplicates, deleting what does not exist) and stores it in one commit; the
snapshot is then reloaded so this handler's next Describe shows it. A replicator that cannot
be reached leaves every user REQUEST_TIMED_OUT.

Authorization (Kafka: DESCRIBE, resp. ALTER, on the CLUSTER resource, else
CLUSTER_AUTHORIZATION_FAILED) is the authorizer's: each API names it in
``cluster_operation``, checked first (CLUSTER_AUTHORIZATION_FAILED, Kafka's error answer).
"""

from __future__ import annotations

import hashlib
import hmac
import logging

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.replicator.v1 import replicator_pb2
from services.common.acls import Operation, ResourceType
from services.common.errors import ErrorCode

from ..collaborators import CallError, Controller
from ..metadata_cache import MetadataCache
from ..request_context import RequestContext
from .acls import DENIED
from .topics import DEFAULT_CONTROLLER_TIMEOUT_S

log = logging.getLogger(__name__)

# Kafka's ScramMechanism codes and their hash functions.
HASHES = {1: "sha256", 2: "sha512"}

DESCRIBE_DUPLICATE_USER = ("Cannot describe SCRAM credentials for the same user twice in a "
                           "single request: ")
DESCRIBE_UNKNOWN_USER = "Attempt to describe a user credential that does not exist: "

DescribeResult = k.DescribeUserScramCredentialsResponse.DescribeUserScramCredentialsResult
CredentialInfo = k.DescribeUserScramCredentialsResponse.CredentialInfo
AlterResult = k.AlterUserScramCredentialsResponse.AlterUserScramCredentialsResult


def server_keys(mechanism: int, salted_password: bytes) -> tuple[bytes, bytes]:
    """(StoredKey, ServerKey) of RFC 5802 for ``salted_password`` under ``mechanism``
    (1 SCRAM-SHA-256, 2 SCRAM-SHA-512). Raises KeyError for another mechanism."""
    digest = HASHES[mechanism]
    client_key = hmac.new(salted_password, b"Client Key", digest).digest()
    stored_key = hashlib.new(digest, client_key).digest()
    server_key = hmac.new(salted_password, b"Server Key", digest).digest()
    return stored_key, server_key


class DescribeUserScramCredentialsApi:
    cluster_operation = Operation.DESCRIBE

    def __init__(self, cache: MetadataCache) -> None:
        self._cache = cache

    async def handle(self, request: k.DescribeUserScramCredentialsRequest,
                     context: RequestContext) -> k.DescribeUserScramCredentialsResponse:
        denied = context.access.check(self.cluster_operation, ResourceType.CLUSTER)
        if denied:
            # Kafka's error answer: the code at the top and once per user asked about.
            return k.DescribeUserScramCredentialsResponse(
                error_code=denied, error_message=DENIED, results=[
                    DescribeResult(error_code=denied, error_message=DENIED)
                    for _ in request.users])
        credentials = (await self._cache.current()).scram_credentials
        if request.users_is_null or not request.users:
            users = {user: False for user in sorted(credentials)}
        else:
            users = {}
            for entry in request.users:
                users[entry.name] = entry.name in users
        results = []
        for user, duplicate in users.items():
            if duplicate:
                results.append(DescribeResult(
                    user=user, error_code=ErrorCode.duplicate_resource.value,
                    error_message=DESCRIBE_DUPLICATE_USER + user))
            elif user not in credentials:
                results.append(DescribeResult(
                    user=user, error_code=ErrorCode.resource_not_found.value,
                    error_message=DESCRIBE_UNKNOWN_USER + user))
            else:
                results.append(DescribeResult(user=user, error_code=0, credential_infos=[
                    CredentialInfo(mechanism=c.mechanism, iterations=c.iterations)
                    for c in credentials[user]]))
        return k.DescribeUserScramCredentialsResponse(error_code=0, results=results)


class AlterUserScramCredentialsApi:
    cluster_operation = Operation.ALTER

    def __init__(self, cache: MetadataCache, controller: Controller) -> None:
        self._cache = cache
        self._controller = controller

    async def handle(self, request: k.AlterUserScramCredentialsRequest,
                     context: RequestContext) -> k.AlterUserScramCredentialsResponse:
        denied = context.access.check(self.cluster_operation, ResourceType.CLUSTER)
        if denied:
            users = dict.fromkeys([*(d.name for d in request.deletions),
                                   *(u.name for u in request.upsertions)])
            return k.AlterUserScramCredentialsResponse(results=[
                AlterResult(user=user, error_code=denied, error_message=DENIED)
                for user in users])
        upsertions = []
        for upsertion in request.upsertions:
            stored_key = server_key = b""
            if upsertion.mechanism in HASHES:  # else the replicator refuses it
                stored_key, server_key = server_keys(upsertion.mechanism,
                                                     upsertion.salted_password)
            upsertions.append(replicator_pb2.ScramCredentialUpsertion(
                user=upsertion.name, mechanism=upsertion.mechanism, salt=upsertion.salt,
                stored_key=stored_key, server_key=server_key,
                iterations=upsertion.iterations))
        alteration = replicator_pb2.AlterScramCredentialsRequest(
            deletions=[replicator_pb2.ScramCredentialDeletion(user=d.name, mechanism=d.mechanism)
                       for d in request.deletions],
            upsertions=upsertions)
        if not request.deletions and not request.upsertions:
            return k.AlterUserScramCredentialsResponse(results=[])
        try:
            answer = await self._controller.alter_scram_credentials(
                alteration, DEFAULT_CONTROLLER_TIMEOUT_S)
        except CallError as exc:
            log.warning("altering SCRAM credentials failed: %s", exc)
            users = dict.fromkeys([*(d.name for d in request.deletions),
                                   *(u.name for u in request.upsertions)])
            return k.AlterUserScramCredentialsResponse(results=[AlterResult(
                user=user, error_code=ErrorCode.request_timed_out.value,
                error_message=f"the controller did not answer: {exc}") for user in users])
        if any(not r.error_code for r in answer.results):
            await self._cache.reload()
        return k.AlterUserScramCredentialsResponse(results=[AlterResult(
            user=r.user, error_code=r.error_code, error_message=r.error_message or None)
            for r in answer.results])
