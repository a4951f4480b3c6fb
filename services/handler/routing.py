"""Which log node serves a partition, and fanning partition work out to those nodes.

Requests name partitions; the partition's leader log node does the work. A partition that
does not exist is UNKNOWN_TOPIC_OR_PARTITION; one whose leader is not live cannot be served
here (NOT_LEADER_OR_FOLLOWER, as a Kafka broker answers for partitions it does not lead), and
clients refresh their metadata. Work for one node travels in one call, and the calls to
different nodes run concurrently.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from services.common.errors import ErrorCode, KafkaError
from services.common.progress_reports import epoch_key, partition_key

from .collaborators import CallError, UnreachableError
from .metadata_cache import ClusterMetadata, LogNode, PartitionInfo, TopicInfo

log = logging.getLogger(__name__)

T = TypeVar("T")

# current_leader_epoch / leader_epoch value meaning "no epoch given, do not check".
NO_EPOCH = -1


@dataclass(frozen=True, slots=True)
class Route:
    """Where a partition lives right now."""

    topic: TopicInfo
    partition: PartitionInfo
    leader: LogNode


def locate(metadata: ClusterMetadata, topic: TopicInfo | None, partition: int,
           current_leader_epoch: int = NO_EPOCH, broker_id: int | None = None) -> Route:
    """The route to ``partition`` of ``topic``; raises KafkaError when it cannot be served,
    or when the client's ``current_leader_epoch`` is not the leader's
    (:func:`leader_epoch_error`). With ``broker_id`` (the broker the client sent the request
    to), a partition that broker does not lead is NOT_LEADER_OR_FOLLOWER, as a Kafka broker
    answers it, and one it leads is routed to it unless it is fenced, however late its last
    heartbeat: a produce refused there while the next one on the connection is appended would
    skip sequence numbers."""
    if topic is None:
        raise KafkaError(ErrorCode.unknown_topic_or_partition)
    info = topic.partitions.get(partition)
    if info is None:
        raise KafkaError(ErrorCode.unknown_topic_or_partition)
    # The broker the client chose answers for its partitions while it is a broker at all
    # (not fenced), as a Kafka leader does whatever the controller thinks of its heartbeats:
    # a node slow to answer them is asked anyway, and the call decides.
    leader = (metadata.live_node(info.leader) if broker_id is None
              else metadata.unfenced_node(info.leader))
    if leader is None:
        raise KafkaError(
            ErrorCode.not_leader_or_follower,
            f"no live leader for {topic.name}-{partition}",
        )
    if broker_id is not None and info.leader != broker_id:
        raise KafkaError(
            ErrorCode.not_leader_or_follower,
            f"broker {broker_id} is not the leader of {topic.name}-{partition} "
            f"(broker {info.leader} is)",
        )
    epoch_error = leader_epoch_error(current_leader_epoch, info.leader_epoch)
    if epoch_error is not None:
        raise KafkaError(epoch_error)
    return Route(topic, info, leader)


def leader_epoch_error(requested: int, current: int) -> ErrorCode | None:
    """Kafka's check of a client's current_leader_epoch against the leader's epoch.

    A client ahead of this metadata (it saw a newer leader) gets UNKNOWN_LEADER_EPOCH and
    retries; a client behind it gets FENCED_LEADER_EPOCH and refreshes its metadata.
    """
    if requested in (NO_EPOCH, current):
        return None
    if requested > current:
        return ErrorCode.unknown_leader_epoch
    return ErrorCode.fenced_leader_epoch


def leader_error(code: int) -> int:
    """A leader's error for a partition, as the client must see it. A leader that does not
    know a partition the metadata says it leads is not (yet, or any more) its leader: Kafka
    answers NOT_LEADER_OR_FOLLOWER there, which sends clients to refresh their metadata."""
    if code == ErrorCode.unknown_topic_or_partition.value:
        return ErrorCode.not_leader_or_follower.value
    return code


def replication_key(topic: str, partition: int, leader_epoch: int, topic_id: str) -> str:
    """The purgatory key a write waits on until the high watermark covers it (acks=all): the
    partition's at the leader epoch that stored it (and the topic id the leader named), so
    that only that leader's high watermark (never a later leader's, whose log may lack the
    write) completes the wait, and the end of that epoch fails it, however late the wait is
    parked; the partition's own key for a replica without an epoch (-1)."""
    if leader_epoch < 0:
        return partition_key(topic, partition)
    return epoch_key(topic, partition, leader_epoch, topic_id)


async def call_leaders(
    routed: Iterable[tuple[Route, T]],
    call: Callable[[LogNode, list[T]], Awaitable[Sequence[Any]]],
    *,
    effect: bool,
) -> list[tuple[T, int, Any]]:
    """``call(leader, items)`` once per leader node, the nodes concurrently, so one node's
    trouble never spoils the others' answers. Returns every item (grouped by node) as
    ``(item, code, detail)``: code 0 and the node's result for the item's partition (results
    carry ``topic`` and ``partition``), or the error to answer with and what caused it.

    - a result with an error: :func:`leader_error` of its code; detail: the result;
    - no result for the partition: UNKNOWN_SERVER_ERROR; detail: None;
    - a failed call (detail: the exception): NOT_LEADER_OR_FOLLOWER when it never reached the
      node, or for a call without ``effect`` (a read: clients refresh their metadata and
      retry); REQUEST_TIMED_OUT when a write may have happened; UNKNOWN_SERVER_ERROR for a
      failure that is not a :class:`~.collaborators.CallError` (a bug, logged).
    """
    groups: dict[int, tuple[LogNode, list[tuple[Route, T]]]] = {}
    for route, item in routed:
        groups.setdefault(route.leader.node_id, (route.leader, []))[1].append((route, item))

    async def one(node: LogNode, pairs: list[tuple[Route, T]]) -> list[tuple[T, int, Any]]:
        try:
            results = await call(node, [item for _, item in pairs])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - answered per item
            code = _failed_call_error(exc, effect)
            return [(item, code, exc) for _, item in pairs]
        by_partition = {(r.topic, r.partition): r for r in results}
        out = []
        for route, item in pairs:
            result = by_partition.get((route.topic.name, route.partition.partition))
            code = (ErrorCode.unknown_server_error.value if result is None
                    else leader_error(result.error_code))
            out.append((item, code, result))
        return out

    if len(groups) == 1:
        # One leader, the common case: no task to run it beside nothing.
        (group,) = groups.values()
        return await one(*group)
    answers = await asyncio.gather(*(one(*group) for group in groups.values()))
    return [answer for node_answers in answers for answer in node_answers]


def _failed_call_error(exc: Exception, effect: bool) -> int:
    if not isinstance(exc, CallError):
        log.error("a call to a log node failed unexpectedly", exc_info=exc)
        return (ErrorCode.unknown_server_error if effect
                else ErrorCode.not_leader_or_follower).value
    log.info("a call to a log node failed: %s", exc)
    if isinstance(exc, UnreachableError) or not effect:
        return ErrorCode.not_leader_or_follower.value
    return ErrorCode.request_timed_out.value
