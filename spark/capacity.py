"""Capacity planning over the log nodes, as pure functions of what the capacity report read:
growth per partition replica, where retention will hold each partition, how full each log
node's disk will get, how unevenly the bytes lie, and what to do about it (which partitions to
move where, or how many log nodes to add).

Inputs: per replica (log node, topic, partition) its size and log end offset at two instants
``window_s`` apart, the disk of each log node (total, free), and the cluster metadata (each
partition's replicas and leader, each topic's configs). Definitions:

    growth_bytes_per_s   (size now - size then) / window, of the leader's replica (a follower
                         catching up is not growth); records_per_s likewise from the log end
    retained_bytes       where retention holds the partition under this growth: for
                         cleanup.policy=delete, min(retention.bytes, growth * retention.ms),
                         never below what it holds now; unbounded (None) when neither limits
                         it and it grows; a compacted partition is taken as it is now
    headroom_bytes       retention.bytes - size (None without a byte limit)
    node projected_bytes the retained bytes of every replica on the node
    node days_to_full    free bytes / growth of the node's replicas, when retention lets them
                         outgrow the free space (None when it holds them, or nothing grows)
    skew                 a node's bytes over the mean bytes per log node

Recommendations, in order: when the replicas' projected bytes exceed ``target_use`` of the
log nodes' disks (or a node fills within ``horizon_days``), add log nodes (how many keep the
projection under the target), then spread replicas onto them (``kbroker spread``); and, while
the heaviest node holds more than ``1 + tolerance`` times the mean, move the replica of the
heaviest node that best evens out the two (at most half their difference) to the lightest node
without a replica of that partition.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

DAY_S = 86400.0
# Kafka's defaults (the log nodes' own defaults unless their flags changed them).
DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000
DEFAULT_RETENTION_BYTES = -1
MAX_MOVES = 20


@dataclass(frozen=True, slots=True)
class ReplicaSample:
    node: int
    topic: str
    partition: int
    size_then: float
    size_now: float
    leo_then: float
    leo_now: float


@dataclass(frozen=True, slots=True)
class NodeDisk:
    node: int
    total_bytes: float
    free_bytes: float


@dataclass(frozen=True, slots=True)
class PartitionPlacement:
    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PartitionCapacity:
    topic: str
    partition: int
    leader: int
    replicas: str
    size_bytes: float
    growth_bytes_per_s: float
    records_per_s: float
    retention_bytes: int
    retention_ms: int
    retained_bytes: float | None
    headroom_bytes: float | None


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    node: int
    replicas: int
    leaders: int
    partition_bytes: float
    growth_bytes_per_s: float
    projected_bytes: float | None
    total_bytes: float | None
    free_bytes: float | None
    days_to_full: float | None
    skew: float


@dataclass(frozen=True, slots=True)
class TopicCapacity:
    topic: str
    partitions: int
    size_bytes: float
    growth_bytes_per_s: float
    records_per_s: float
    retained_bytes: float | None
    partition_skew: float


@dataclass(frozen=True, slots=True)
class Move:
    topic: str
    partition: int
    from_node: int
    to_node: int
    bytes: float


@dataclass(frozen=True, slots=True)
class Plan:
    partitions: list[PartitionCapacity]
    nodes: list[NodeCapacity]
    moves: list[Move]
    add_log_nodes: int
    advice: list[str]

    def rows(self, name: str) -> list[dict[str, Any]]:
        return [asdict(item) for item in getattr(self, name)]


def _config(configs: Mapping[str, str], key: str, default: int) -> int:
    try:
        return int(configs.get(key, default))
    except ValueError:
        return default


def partition_capacity(placement: PartitionPlacement, samples: Sequence[ReplicaSample],
                       window_s: float) -> PartitionCapacity:
    """One partition's size, growth and retention (``samples``: its replicas)."""
    by_node = {s.node: s for s in samples}
    source = by_node.get(placement.leader) or max(samples, key=lambda s: s.size_now)
    growth = max(source.size_now - source.size_then, 0.0) / window_s if window_s > 0 else 0.0
    records = max(source.leo_now - source.leo_then, 0.0) / window_s if window_s > 0 else 0.0
    retention_ms = _config(placement.configs, "retention.ms", DEFAULT_RETENTION_MS)
    retention_bytes = _config(placement.configs, "retention.bytes", DEFAULT_RETENTION_BYTES)
    size = source.size_now
    retained: float | None
    if "delete" not in placement.configs.get("cleanup.policy", "delete"):
        retained = size
    else:
        limits = []
        if retention_bytes >= 0:
            limits.append(float(retention_bytes))
        if retention_ms >= 0:
            limits.append(growth * retention_ms / 1000)
        retained = max(size, min(limits)) if limits else (None if growth > 0 else size)
    headroom = retention_bytes - size if retention_bytes >= 0 else None
    return PartitionCapacity(
        topic=placement.topic, partition=placement.partition, leader=placement.leader,
        replicas=",".join(str(r) for r in placement.replicas), size_bytes=size,
        growth_bytes_per_s=growth, records_per_s=records, retention_bytes=retention_bytes,
        retention_ms=retention_ms, retained_bytes=retained, headroom_bytes=headroom)


def plan(placements: Sequence[PartitionPlacement], samples: Sequence[ReplicaSample],
         disks: Sequence[NodeDisk], nodes: Sequence[int], window_s: float, *,
         tolerance: float = 0.2, target_use: float = 0.8,
         horizon_days: float = 7.0) -> Plan:
    """The capacity plan (see the module docstring)."""
    by_partition: dict[tuple[str, int], list[ReplicaSample]] = {}
    for sample in samples:
        by_partition.setdefault((sample.topic, sample.partition), []).append(sample)
    partitions = [partition_capacity(p, by_partition[(p.topic, p.partition)], window_s)
                  for p in placements if (p.topic, p.partition) in by_partition]
    capacity = {(p.topic, p.partition): p for p in partitions}
    node_ids = sorted(set(nodes) | {s.node for s in samples})
    disk = {d.node: d for d in disks}
    holds: dict[int, dict[tuple[str, int], float]] = {n: {} for n in node_ids}
    growth = dict.fromkeys(node_ids, 0.0)
    projected: dict[int, float | None] = dict.fromkeys(node_ids, 0.0)
    leaders = dict.fromkeys(node_ids, 0)
    for p in placements:
        if p.leader in leaders:
            leaders[p.leader] += 1
    for sample in samples:
        key = (sample.topic, sample.partition)
        holds[sample.node][key] = sample.size_now
        part = capacity.get(key)
        if part is None:
            continue
        growth[sample.node] += part.growth_bytes_per_s
        before = projected[sample.node]
        projected[sample.node] = (None if before is None or part.retained_bytes is None
                                  else before + part.retained_bytes)
    bytes_on = {n: sum(holds[n].values()) for n in node_ids}
    mean = sum(bytes_on.values()) / len(node_ids) if node_ids else 0.0
    node_rows = []
    for n in node_ids:
        d = disk.get(n)
        days = None
        # Growth fills the disk only where retention lets the replicas outgrow its free space.
        if d is not None and growth[n] > 0 and (
                projected[n] is None or projected[n] - bytes_on[n] > d.free_bytes):
            days = d.free_bytes / growth[n] / DAY_S
        node_rows.append(NodeCapacity(
            node=n, replicas=len(holds[n]), leaders=leaders[n], partition_bytes=bytes_on[n],
            growth_bytes_per_s=growth[n], projected_bytes=projected[n],
            total_bytes=d.total_bytes if d else None, free_bytes=d.free_bytes if d else None,
            days_to_full=days, skew=bytes_on[n] / mean if mean > 0 else 1.0))
    add, advice = _nodes_to_add(node_rows, target_use, horizon_days)
    moves = _moves(placements, holds, tolerance)
    if moves:
        advice.append(f"move {len(moves)} replica(s) off the heaviest log nodes (moves "
                      f"table) to bring every node within {tolerance:.0%} of the mean bytes")
    return Plan(partitions, node_rows, moves, add, advice)


def _nodes_to_add(nodes: Sequence[NodeCapacity], target_use: float,
                  horizon_days: float) -> tuple[int, list[str]]:
    advice = []
    sized = [n for n in nodes if n.total_bytes]
    if not sized:
        return 0, advice
    filling = [n for n in sized if n.days_to_full is not None and n.days_to_full < horizon_days]
    for n in filling:
        advice.append(f"log node {n.node} fills its disk in {n.days_to_full:.1f} days at "
                      f"the current growth")
    unbounded = [n for n in sized if n.projected_bytes is None]
    if unbounded:
        advice.append("partitions without retention limits keep growing on log node(s) "
                      + ", ".join(str(n.node) for n in unbounded))
    capacity = sum(n.total_bytes or 0.0 for n in sized)
    # Bytes the disks hold besides the replicas (other files) stay where they are.
    other = sum(max((n.total_bytes or 0) - (n.free_bytes or 0) - n.partition_bytes, 0.0)
                for n in sized)
    need = other + sum(n.projected_bytes if n.projected_bytes is not None
                       else n.partition_bytes for n in sized)
    mean_disk = capacity / len(sized)
    add = max(0, math.ceil(need / (target_use * mean_disk)) - len(sized))
    if add == 0 and filling:
        add = 1
    if add:
        advice.insert(0, f"add {add} log node(s): the replicas will need "
                      f"{need / capacity:.0%} of the log nodes' disks (target "
                      f"{target_use:.0%}); then spread partitions onto them with kbroker spread")
    return add, advice


def _moves(placements: Sequence[PartitionPlacement],
           holds: dict[int, dict[tuple[str, int], float]], tolerance: float) -> list[Move]:
    """Greedy moves from the heaviest node to the lightest one that can take a replica."""
    if len(holds) < 2:
        return []
    load = {n: sum(parts.values()) for n, parts in holds.items()}
    replicas = {(p.topic, p.partition): set(p.replicas) for p in placements}
    for n, parts in holds.items():
        for key in parts:
            replicas.setdefault(key, set()).add(n)
    mean = sum(load.values()) / len(load)
    moves: list[Move] = []
    while len(moves) < MAX_MOVES and mean > 0:
        heavy = max(load, key=lambda n: (load[n], -n))
        if load[heavy] <= (1 + tolerance) * mean:
            break
        best: tuple[float, float, tuple[str, int], int] | None = None
        for light in sorted(load, key=lambda n: (load[n], n)):
            for key, size in holds[heavy].items():
                if light in replicas[key] or not 0 < size < load[heavy] - load[light]:
                    continue
                worst = max(load[heavy] - size, load[light] + size)
                if best is None or (worst, -size) < (best[0], -best[1]):
                    best = (worst, size, key, light)
            if best is not None:
                break
        if best is None:
            break
        _, size, key, light = best
        moves.append(Move(key[0], key[1], heavy, light, size))
        del holds[heavy][key]
        holds[light][key] = size
        replicas[key] = (replicas[key] - {heavy}) | {light}
        load[heavy] -= size
        load[light] += size
    return moves


def topic_capacity(partitions: Sequence[PartitionCapacity]) -> list[TopicCapacity]:
    """Per topic, largest first: partitions, bytes, growth, retained bytes (None when any
    partition is unbounded) and partition skew (the largest partition over the mean)."""
    by_topic: dict[str, list[PartitionCapacity]] = {}
    for p in partitions:
        by_topic.setdefault(p.topic, []).append(p)
    rows = []
    for topic, parts in by_topic.items():
        sizes = [p.size_bytes for p in parts]
        mean = sum(sizes) / len(sizes)
        retained = [p.retained_bytes for p in parts]
        rows.append(TopicCapacity(
            topic=topic, partitions=len(parts), size_bytes=sum(sizes),
            growth_bytes_per_s=sum(p.growth_bytes_per_s for p in parts),
            records_per_s=sum(p.records_per_s for p in parts),
            retained_bytes=None if None in retained else sum(r or 0.0 for r in retained),
            partition_skew=max(sizes) / mean if mean > 0 else 1.0))
    return sorted(rows, key=lambda r: (-r.size_bytes, r.topic))
