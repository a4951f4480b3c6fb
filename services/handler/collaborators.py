"""What the handler needs from the services it talks to, as domain interfaces.

The API modules depend only on these protocols and value types; ``clients.py`` implements them
over gRPC and tests substitute fakes. A failed call raises one of two errors that say what the
caller may assume about its effect:

- :class:`UnreachableError`: the call never reached the service, so nothing happened;
- :class:`OutcomeUnknownError`: the call may or may not have taken effect (timeout, broken
  connection, server error).
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .metadata_cache import ClusterMetadata, LogNode


class CallError(Exception):
    """A call to another service failed."""


class UnreachableError(CallError):
    """The service could not be reached; the call had no effect."""


class OutcomeUnknownError(CallError):
    """The call failed after it may have taken effect."""


class ReadLimit(enum.IntEnum):
    """How far a read may go: consumers see up to the high watermark, followers to the end."""

    HIGH_WATERMARK = 0
    LOG_END = 1


class WaitKind(enum.Enum):
    """The kind of a delayed operation (Kafka's DelayedFetch, DelayedProduce, DelayedJoin)."""

    FETCH = "fetch"
    PRODUCE = "produce"
    JOIN = "join"


# --- log nodes ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionAppend:
    topic: str
    partition: int
    # One or more v2 record batches, concatenated, exactly as the client sent them.
    records: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendResult:
    topic: str
    partition: int
    error_code: int = 0
    error_message: str | None = None
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    log_end_offset: int = -1
    high_watermark: int = -1
    # The epoch of the leader that stored the batches; -1 for a replica without one.
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionRead:
    topic: str
    partition: int
    offset: int
    # The first batch is returned whole even if larger.
    max_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadResult:
    topic: str
    partition: int
    error_code: int = 0
    error_message: str | None = None
    records: bytes = b""
    high_watermark: int = -1
    log_start_offset: int = -1
    log_end_offset: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetQuery:
    topic: str
    partition: int
    # -1 latest, -2 earliest, -3 max timestamp, else a time in ms.
    timestamp: int


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetResult:
    topic: str
    partition: int
    error_code: int = 0
    offset: int = -1
    timestamp: int = -1
    leader_epoch: int = -1


class LogNodes(Protocol):
    """The log nodes, each addressed by its metadata entry. Every call covers the partitions
    of one node and returns one result per requested partition, in any order."""

    async def append(
        self, node: LogNode, appends: Sequence[PartitionAppend], time_limit: float
    ) -> list[AppendResult]: ...

    async def read(
        self,
        node: LogNode,
        reads: Sequence[PartitionRead],
        max_bytes: int,
        limit: ReadLimit,
        time_limit: float,
    ) -> list[ReadResult]: ...

    async def list_offsets(
        self, node: LogNode, queries: Sequence[OffsetQuery], limit: ReadLimit, time_limit: float
    ) -> list[OffsetResult]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordDeletion:
    topic: str
    partition: int
    # The new log start offset; -1: the high watermark.
    offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LowWatermark:
    topic: str
    partition: int
    error_code: int = 0
    low_watermark: int = -1


class RecordDeleter(Protocol):
    """Log nodes that move log start offsets (DeleteRecords), one call per node."""

    async def delete_records(
        self, node: LogNode, deletions: Sequence[RecordDeletion], time_limit: float
    ) -> list[LowWatermark]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class EpochQuery:
    topic: str
    partition: int
    leader_epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class EpochEndOffset:
    topic: str
    partition: int
    error_code: int = 0
    leader_epoch: int = -1
    end_offset: int = -1


class EpochEndOffsets(Protocol):
    """Log nodes that tell where leader epochs end in their logs (OffsetForLeaderEpoch), one
    call per node."""

    async def end_offsets_for_epochs(
        self, node: LogNode, queries: Sequence[EpochQuery], time_limit: float
    ) -> list[EpochEndOffset]: ...


# --- purgatory ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyState:
    """The last position reported for a key, and a Kafka error reported for it (0: none)."""

    position: int = -1
    error_code: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitResult:
    """How a parked operation ended: completed by its condition, or expired."""

    completed: bool
    keys: Mapping[str, KeyState] = field(default_factory=dict)


class Purgatory(Protocol):
    async def wait(
        self,
        kind: WaitKind,
        thresholds: Mapping[str, int],
        require_all: bool,
        timeout_ms: int,
    ) -> WaitResult:
        """Park until the keys' positions reach their thresholds (any or all of them, or a key
        reports an error) or ``timeout_ms`` passes."""
        ...


class ConditionalAppender(Protocol):
    """Log nodes that append only if a partition's log end offset is as expected (a
    compare-and-set); a mismatch is the result's INVALID_UPDATE_VERSION, nothing stored."""

    async def append_if_end(
        self, node: LogNode, append: PartitionAppend, expected_log_end_offset: int,
        time_limit: float,
    ) -> AppendResult: ...


class SessionTimers(Protocol):
    """The purgatory's detached session timers (DelayedHeartbeat) and its CheckAndComplete,
    as the group coordinator uses them."""

    async def complete(self, positions: Mapping[str, int]) -> None:
        """Report each key's new position (wakes operations parked on it); best effort."""
        ...

    async def schedule(self, deadlines: Mapping[str, int]) -> None:
        """Arm or re-arm a timer per key, timeouts in ms; best effort."""
        ...

    async def unschedule(self, keys: Sequence[str]) -> None:
        """Disarm timers; best effort."""
        ...

    async def armed(self, keys: Sequence[str]) -> set[str]:
        """The keys that have a timer running now."""
        ...

    def watch_expirations(self) -> AsyncIterator[list[str]]:
        """Keys whose timers ran out; the first item (empty) confirms the subscription. Ends
        or raises when the stream breaks."""
        ...


# --- replicator (the controller) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class NewTopic:
    name: str
    # -1: the broker default.
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, str] = field(default_factory=dict)
    # Explicit replica assignment per partition index.
    assignments: Mapping[int, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicResult:
    name: str
    topic_id: str | None = None
    error_code: int = 0
    error_message: str | None = None
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, str] = field(default_factory=dict)


class Controller(Protocol):
    """The replicator in its controller role: the owner of cluster metadata."""

    async def load_metadata(self) -> ClusterMetadata: ...

    async def create_topics(
        self, topics: Sequence[NewTopic], validate_only: bool, time_limit: float
    ) -> list[TopicResult]: ...

    async def delete_topics(
        self, names: Sequence[str], topic_ids: Sequence[str], time_limit: float
    ) -> list[TopicResult]: ...


class ConfigOperation(enum.IntEnum):
    """How a config change applies (IncrementalAlterConfigs' codes; AlterConfigs sets)."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicConfigChanges:
    topic: str
    # (name, operation, value) in request order.
    changes: Sequence[tuple[str, ConfigOperation, str]] = ()
    # True: the SETs become the topic's whole config set.
    replace: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionIncrease:
    topic: str
    # The new total partition count.
    count: int
    # Replicas of each new partition in order; empty: placed by the controller.
    assignments: Sequence[tuple[int, ...]] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerIdBlock:
    """Producer ids ``first_id`` .. ``first_id + size - 1``, this handler's alone."""

    first_id: int
    size: int

    @property
    def last_id(self) -> int:
        return self.first_id + self.size - 1


class ProducerIdSource(Protocol):
    """The controller's producer id blocks (KIP-730)."""

    async def allocate_producer_ids(self, requester: str, time_limit: float) -> ProducerIdBlock:
        """The next block; raises :class:`CallError` when none can be had."""
        ...


class TopicAdmin(Protocol):
    """The controller's operations on existing topics: configs and partition counts. Results
    are :class:`TopicResult`s, one per entry, in order."""

    async def alter_topic_configs(
        self, topics: Sequence[TopicConfigChanges], validate_only: bool, time_limit: float
    ) -> list[TopicResult]: ...

    async def create_partitions(
        self, topics: Sequence[PartitionIncrease], validate_only: bool, time_limit: float
    ) -> list[TopicResult]: ...
