"""Replica placement for new topics (the rack-unaware part of Kafka's replica assignment).

Partition p of a topic whose round-robin starts at index s is led by ``nodes[(s + p) % n]`` and
followed by the next ``replication_factor - 1`` nodes in ring order, so leaders spread evenly
over the nodes and every replica set has distinct nodes. The controller advances ``s`` by one
per topic, so partition 0 of successive topics lands on successive nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

from .metadata import NodeId


def assign_replicas(
    *,
    num_partitions: int,
    replication_factor: int,
    nodes: Sequence[NodeId],
    start_index: int,
) -> list[tuple[NodeId, ...]]:
    """Replica lists for partitions 0..num_partitions-1, leader first.

    ``nodes`` are the candidate nodes (order defines the ring; callers pass them sorted).
    Raises ValueError when the factor is not in 1..len(nodes) or num_partitions < 1.
    """
    n = len(nodes)
    if num_partitions < 1:
        raise ValueError("num_partitions must be positive")
    if not 1 <= replication_factor <= n:
        raise ValueError(f"replication factor {replication_factor} with {n} node(s)")
    return [
        tuple(nodes[(start_index + p + j) % n] for j in range(replication_factor))
        for p in range(num_partitions)
    ]
