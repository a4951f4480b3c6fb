"""Spreading partitions over the log nodes: what an operator runs after adding log nodes (they
start empty) or before removing one (``--exclude``), as Kafka's
``kafka-reassign-partitions --generate`` followed by ``--execute``.

The plan (:func:`plan`) keeps every partition's replica count and moves as few replicas as it
can: a replica moves only off an excluded node or off a node holding more than its share
(total replicas over the nodes kept, rounded up), to the node holding fewest that the
partition does not use yet; a moved replica keeps its place in the replica list. Preferred
leaders (first replicas) are then evened out by reordering replicas within partitions, which
copies nothing. The plan is carried out as partition reassignments (the replicator's
AlterPartitionReassignments): new replicas copy from their leader and join the ISR before the
old ones are dropped, so the partitions stay available and nothing acknowledged is lost.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence

TopicPartition = tuple[str, int]
Assignment = Mapping[TopicPartition, Sequence[int]]


def plan(assignment: Assignment, nodes: Iterable[int], exclude: Collection[int] = ()
         ) -> dict[TopicPartition, tuple[int, ...]]:
    """The new replica lists of the partitions that change, so that no replica stays on an
    ``exclude``d node and the nodes kept hold about the same number of replicas and of
    preferred leaders. Raises ValueError when a partition has more replicas than nodes kept."""
    kept = sorted(set(nodes) - set(exclude))
    replicas = {tp: list(r) for tp, r in sorted(assignment.items())}
    widest = max((len(r) for r in replicas.values()), default=0)
    if widest > len(kept):
        raise ValueError(f"a partition has {widest} replicas but only {len(kept)} log nodes "
                         f"are kept ({kept})")
    if not kept:
        return {}
    load = Counter({n: 0 for n in kept})
    for r in replicas.values():
        load.update(n for n in r if n in load)
    share = math.ceil(sum(len(r) for r in replicas.values()) / len(kept))

    def least_loaded(avoid: Collection[int]) -> int:
        return min((n for n in kept if n not in avoid), key=lambda n: (load[n], n))

    # Replicas that must move: off excluded nodes first, then off nodes above their share.
    for r in replicas.values():
        for i, node in enumerate(r):
            if node not in load:
                r[i] = least_loaded(r)
                load[r[i]] += 1
    for r in replicas.values():
        for i, node in enumerate(r):
            if load[node] > share:
                target = least_loaded(r)
                if load[target] + 1 < load[node]:
                    load[node] -= 1
                    r[i] = target
                    load[target] += 1
    _even_out_leaders(replicas, kept)
    return {tp: tuple(r) for tp, r in replicas.items() if tuple(r) != tuple(assignment[tp])}


def _even_out_leaders(replicas: dict[TopicPartition, list[int]], kept: Sequence[int]) -> None:
    """Reorder replica lists so that each node is first in about as many partitions."""
    first = Counter({n: 0 for n in kept})
    first.update(r[0] for r in replicas.values() if r)
    share = math.ceil(len(replicas) / len(kept))
    for r in replicas.values():
        if not r or first[r[0]] <= share:
            continue
        best = min(r, key=lambda n: (first[n], n))
        if first[best] + 1 < first[r[0]]:
            first[r[0]] -= 1
            first[best] += 1
            r.remove(best)
            r.insert(0, best)


def load_of(assignment: Assignment) -> tuple[Counter[int], Counter[int]]:
    """(replicas, preferred leaders) per node."""
    replicas: Counter[int] = Counter()
    leaders: Counter[int] = Counter()
    for r in assignment.values():
        replicas.update(r)
        if r:
            leaders[r[0]] += 1
    return replicas, leaders
