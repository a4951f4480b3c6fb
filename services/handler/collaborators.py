"""What the handler needs from the services it talks to, as interfaces over their generated
messages (``kbroker.log.v1``, ``kbroker.purgatory.v1``, ``kbroker.replicator.v1``).

The API modules and the coordinator runtime depend only on these protocols; ``clients.py``
implements them over gRPC and tests substitute fakes. A method is one RPC, its request in and its
response out (the purgatory's take the request's fields). A failed call raises one of two errors
that say what the caller may assume about its effect:

- :class:`UnreachableError`: the call never reached the service, so nothing happened;
- :class:`OutcomeUnknownError`: the call may or may not have taken effect (timeout, broken
  connection, server error).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Protocol

from kbroker.log.v1 import log_pb2 as log
from kbroker.purgatory.v1 import purgatory_pb2 as purgatory
from kbroker.replicator.v1 import replicator_pb2 as replicator

from .metadata_cache import LogNode


class CallError(Exception):
    """A call to another service failed."""


class UnreachableError(CallError):
    """The service could not be reached; the call had no effect."""


class OutcomeUnknownError(CallError):
    """The call failed after it may have taken effect."""


class RequestOutcomeUnknownError(Exception):
    """A Kafka request failed after part of it may have taken effect, and no answer to it is
    safe: the handler fails the call itself (DEADLINE_EXCEEDED, as for a call that ran out of
    time), which the frontend answers as it answers any request whose outcome it does not
    know."""


class LogNodes(Protocol):
    """The log nodes, each addressed by its metadata entry. A call covers partitions of one
    node and answers one result per requested partition, in any order. An append with
    ``expected_log_end_offset`` is a compare-and-set on the log: a mismatch is the result's
    INVALID_UPDATE_VERSION, and nothing is stored."""

    async def append(self, node: LogNode, request: log.AppendRequest, time_limit: float,
                     records: Sequence[bytes | memoryview | None] | None = None,
                     ) -> log.AppendResponse:
        """``records``: each partition's record batches, in the order of the request's
        partitions, when they travel beside it (the request's own are then left empty); None
        when they are in the request."""
        ...

    async def read(self, node: LogNode, request: log.ReadRequest,
                   time_limit: float) -> log.ReadResponse:
        """The answer reads as a ``ReadResponse`` (its results' records may be views of the
        bytes received rather than ``bytes``)."""
        ...

    async def list_offsets(self, node: LogNode, request: log.ListOffsetsRequest,
                           time_limit: float) -> log.ListOffsetsResponse: ...

    async def delete_records(self, node: LogNode, request: log.DeleteRecordsRequest,
                             time_limit: float) -> log.DeleteRecordsResponse: ...

    async def offset_for_leader_epoch(self, node: LogNode,
                                      request: log.OffsetForLeaderEpochRequest,
                                      time_limit: float) -> log.OffsetForLeaderEpochResponse: ...

    async def write_txn_markers(self, node: LogNode, request: log.WriteTxnMarkersRequest,
                                time_limit: float) -> log.WriteTxnMarkersResponse:
        """COMMIT/ABORT markers on partitions the node leads, answered per marker and
        partition as appends are."""
        ...

    async def describe_producers(self, node: LogNode, request: log.DescribeProducersRequest,
                                 time_limit: float) -> log.DescribeProducersResponse: ...

    async def describe_log_dir(self, node: LogNode, request: log.DescribeLogDirRequest,
                               time_limit: float) -> log.LogDirDescription: ...


class Purgatory(Protocol):
    """Delayed operations (Kafka's DelayedFetch, DelayedProduce, DelayedJoin), its
    CheckAndComplete, and its detached timers (DelayedHeartbeat)."""

    async def wait(self, kind: purgatory.OperationKind.ValueType, thresholds: Mapping[str, int],
                   require_all: bool, timeout_ms: int) -> purgatory.AwaitResponse:
        """Park until the keys' positions reach their thresholds (any or all of them, or a key
        reports an error) or ``timeout_ms`` passes."""
        ...

    async def complete(self, positions: Mapping[str, int]) -> None:
        """Report each key's new position (wakes operations parked on it)."""
        ...

    async def schedule(self, deadlines: Mapping[str, int]) -> None:
        """Arm or re-arm a timer per key, timeouts in ms."""
        ...

    async def unschedule(self, keys: Sequence[str]) -> None: ...

    async def armed(self, keys: Sequence[str]) -> set[str]:
        """The keys that have a timer running now."""
        ...

    def watch_expirations(self) -> AsyncIterator[list[str]]:
        """Keys whose timers ran out; the first item (empty) confirms the subscription. Ends
        or raises when the stream breaks."""
        ...


class Controller(Protocol):
    """The replicator in its controller role: the owner of cluster metadata."""

    async def create_topics(self, request: replicator.CreateTopicsRequest,
                            time_limit: float) -> replicator.CreateTopicsResponse: ...

    async def delete_topics(self, request: replicator.DeleteTopicsRequest,
                            time_limit: float) -> replicator.DeleteTopicsResponse: ...

    async def alter_topic_configs(self, request: replicator.AlterTopicConfigsRequest,
                                  time_limit: float) -> replicator.AlterTopicConfigsResponse: ...

    async def create_partitions(self, request: replicator.CreatePartitionsRequest,
                                time_limit: float) -> replicator.CreatePartitionsResponse: ...

    async def allocate_producer_ids(self, request: replicator.AllocateProducerIdsRequest,
                                    time_limit: float,
                                    ) -> replicator.AllocateProducerIdsResponse: ...

    async def elect_leaders(self, request: replicator.ElectLeadersRequest,
                            time_limit: float) -> replicator.ElectLeadersResponse: ...

    async def alter_config_resources(
            self, request: replicator.AlterConfigResourcesRequest, time_limit: float,
    ) -> replicator.AlterConfigResourcesResponse: ...

    async def alter_partition_reassignments(
            self, request: replicator.AlterPartitionReassignmentsRequest, time_limit: float,
    ) -> replicator.AlterPartitionReassignmentsResponse: ...

    async def create_acls(self, request: replicator.CreateAclsRequest,
                          time_limit: float) -> replicator.CreateAclsResponse: ...

    async def delete_acls(self, request: replicator.DeleteAclsRequest,
                          time_limit: float) -> replicator.DeleteAclsResponse: ...

    async def alter_scram_credentials(self, request: replicator.AlterScramCredentialsRequest,
                                      time_limit: float,
                                      ) -> replicator.AlterScramCredentialsResponse: ...

    async def alter_client_quotas(self, request: replicator.AlterClientQuotasRequest,
                                  time_limit: float) -> replicator.AlterClientQuotasResponse: ...
