"""Replica placement for new topics (Kafka's replica assignment).

Partition p of a topic whose round-robin starts at index s is led by ``ring[(s + p) % n]`` and
followed by the next ``replication_factor - 1`` nodes in ring order, so leaders spread evenly
over the nodes and every replica set has distinct nodes. The controller advances ``s`` by one
per topic, so partition 0 of successive topics lands on successive nodes.

Rack awareness (when any node has a rack): the ring alternates racks (the first node of each
rack in rack order, then the second of each, ...), as Kafka's rack-aware assignment does, and
a partition's followers are taken along the ring skipping nodes of racks it already has until
every rack holds one of its replicas; so a partition spans min(replication factor, racks)
racks and a rack's loss leaves it a replica elsewhere. Without racks the ring is the nodes in
the order given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .metadata import NodeId


def assign_replicas(
    *,
    num_partitions: int,
    replication_factor: int,
    nodes: Sequence[NodeId],
    start_index: int,
    racks: Mapping[NodeId, str] | None = None,
) -> list[tuple[NodeId, ...]]:
    """Replica lists for partitions 0..num_partitions-1, leader first.

    ``nodes`` are the candidate nodes (order defines the ring; callers pass them sorted);
    ``racks`` their racks (missing or empty: no rack). Raises ValueError when the factor is not
    in 1..len(nodes) or num_partitions < 1.
    """
    n = len(nodes)
    if num_partitions < 1:
        raise ValueError("num_partitions must be positive")
    if not 1 <= replication_factor <= n:
        raise ValueError(f"replication factor {replication_factor} with {n} node(s)")
    rack_of = {node: (racks or {}).get(node, "") for node in nodes}
    ring = rack_alternated(nodes, rack_of)
    all_racks = set(rack_of.values())
    assignment = []
    for p in range(num_partitions):
        first = (start_index + p) % n
        replicas = [ring[first]]
        used = {rack_of[ring[first]]}
        # Nodes of new racks first, then the rest, each in ring order.
        for j in range(1, n):
            if len(replicas) == replication_factor:
                break
            node = ring[(first + j) % n]
            if rack_of[node] not in used or used == all_racks:
                replicas.append(node)
                used.add(rack_of[node])
        for j in range(1, n):
            if len(replicas) == replication_factor:
                break
            node = ring[(first + j) % n]
            if node not in replicas:
                replicas.append(node)
        assignment.append(tuple(replicas))
    return assignment


def ring_position(nodes: Sequence[NodeId], racks: Mapping[NodeId, str] | None,
                  node: NodeId) -> int:
    """Where ``node`` is in the ring :func:`assign_replicas` uses for these nodes (0 if it is
    not among them): the start index that makes it lead partition 0."""
    ring = rack_alternated(nodes, {n: (racks or {}).get(n, "") for n in nodes})
    return ring.index(node) if node in ring else 0


def rack_alternated(nodes: Sequence[NodeId], rack_of: Mapping[NodeId, str]) -> list[NodeId]:
    """The nodes with racks interleaved: each rack's first node (racks in order), then each
    rack's second node, and so on (Kafka's ``getRackAlternatedBrokerList``)."""
    by_rack: dict[str, list[NodeId]] = {}
    for node in nodes:
        by_rack.setdefault(rack_of[node], []).append(node)
    columns = [by_rack[rack] for rack in sorted(by_rack)]
    return [column[i] for i in range(max(len(c) for c in columns))
            for column in columns if i < len(column)]
