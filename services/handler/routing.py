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
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from services.common.errors import ErrorCode, KafkaError

from .metadata_cache import ClusterMetadata, LogNode, PartitionInfo, TopicInfo

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

# current_leader_epoch / leader_epoch value meaning "no epoch given, do not check".
NO_EPOCH = -1


@dataclass(frozen=True, slots=True)
class Route:
    """Where a partition lives right now."""

    topic: TopicInfo
    partition: PartitionInfo
    leader: LogNode


def locate(metadata: ClusterMetadata, topic: TopicInfo | None, partition: int) -> Route:
    """The route to ``partition`` of ``topic``; raises KafkaError when it cannot be served."""
    if topic is None:
        raise KafkaError(ErrorCode.unknown_topic_or_partition)
    info = topic.partitions.get(partition)
    if info is None:
        raise KafkaError(ErrorCode.unknown_topic_or_partition)
    leader = metadata.live_node(info.leader)
    if leader is None:
        raise KafkaError(
            ErrorCode.not_leader_or_follower,
            f"no live leader for {topic.name}-{partition}",
        )
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


def group_by_leader(items: Iterable[tuple[Route, T]]) -> dict[int, tuple[LogNode, list[T]]]:
    """Items grouped by their leader node id, each group in the items' order."""
    groups: dict[int, tuple[LogNode, list[T]]] = {}
    for route, item in items:
        group = groups.get(route.leader.node_id)
        if group is None:
            groups[route.leader.node_id] = (route.leader, [item])
        else:
            group[1].append(item)
    return groups


async def call_per_node(
    groups: Mapping[int, tuple[LogNode, list[T]]],
    call: Callable[[LogNode, list[T]], Awaitable[R]],
) -> dict[int, R | Exception]:
    """``call(node, items)`` for every group, concurrently; a failed call yields its exception
    instead of a result, so one node's trouble never spoils the other nodes' answers."""

    async def one(node: LogNode, items: list[T]) -> R | Exception:
        try:
            return await call(node, items)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - returned to the caller to map per item
            return exc

    node_ids = list(groups)
    outcomes = await asyncio.gather(*(one(*groups[node_id]) for node_id in node_ids))
    return dict(zip(node_ids, outcomes, strict=True))


def by_partition(results: Sequence[R], key: Callable[[R], tuple[str, int]]) -> dict[
    tuple[str, int], R
]:
    """Results indexed by (topic, partition)."""
    return {key(r): r for r in results}
