"""Replica placement: leaders round-robin from the start index, followers on the next nodes."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.replicator.assignment import assign_replicas
from services.replicator.metadata import NodeId


def test_leaders_round_robin_and_followers_follow():
    nodes = [NodeId(n) for n in (0, 1, 2)]
    assert assign_replicas(num_partitions=4, replication_factor=2, nodes=nodes,
                           start_index=1) == [(1, 2), (2, 0), (0, 1), (1, 2)]


def test_impossible_requests_are_refused():
    nodes = [NodeId(0), NodeId(1)]
    with pytest.raises(ValueError):
        assign_replicas(num_partitions=1, replication_factor=3, nodes=nodes, start_index=0)
    with pytest.raises(ValueError):
        assign_replicas(num_partitions=0, replication_factor=1, nodes=nodes, start_index=0)
    with pytest.raises(ValueError):
        assign_replicas(num_partitions=1, replication_factor=1, nodes=[], start_index=0)


@given(
    st.lists(st.integers(0, 1000), min_size=1, max_size=12, unique=True),
    st.integers(1, 60),
    st.data(),
)
def test_replicas_are_distinct_and_leaders_balanced(ids, partitions, data):
    nodes = [NodeId(n) for n in sorted(ids)]
    factor = data.draw(st.integers(1, len(nodes)))
    start = data.draw(st.integers(0, 10_000))
    replicas = assign_replicas(num_partitions=partitions, replication_factor=factor,
                               nodes=nodes, start_index=start)
    assert len(replicas) == partitions
    assert all(len(r) == factor == len(set(r)) and set(r) <= set(nodes) for r in replicas)
    leaders = Counter(r[0] for r in replicas)
    counts = [leaders.get(n, 0) for n in nodes]
    assert max(counts) - min(counts) <= 1
    # Every node carries its share of all replicas too.
    load = Counter(n for r in replicas for n in r)
    assert max(load.get(n, 0) for n in nodes) - min(load.get(n, 0) for n in nodes) <= factor
