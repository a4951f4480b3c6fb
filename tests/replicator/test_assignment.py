"""Replica placement: leaders round-robin from the start index, followers on the next nodes."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.replicator.assignment import assign_replicas, rack_alternated, ring_position
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


def test_racks_alternate_in_the_ring():
    racks = {NodeId(0): "a", NodeId(1): "a", NodeId(2): "b", NodeId(3): "b", NodeId(4): "c"}
    assert rack_alternated([NodeId(n) for n in range(5)], racks) == [0, 2, 4, 1, 3]


def test_rack_aware_replicas_span_racks():
    nodes = [NodeId(n) for n in range(6)]
    racks = {NodeId(n): "abc"[n % 3] for n in range(6)}
    replicas = assign_replicas(num_partitions=6, replication_factor=3, nodes=nodes,
                               start_index=0, racks=racks)
    assert all(len({racks[r] for r in rs}) == 3 for rs in replicas)
    assert sorted(rs[0] for rs in replicas) == nodes  # leaders still spread evenly


def test_uneven_racks_still_give_every_partition_a_second_rack():
    nodes = [NodeId(n) for n in range(4)]
    racks = {NodeId(0): "a", NodeId(1): "a", NodeId(2): "a", NodeId(3): "b"}
    replicas = assign_replicas(num_partitions=4, replication_factor=2, nodes=nodes,
                               start_index=0, racks=racks)
    assert all({racks[r] for r in rs} == {"a", "b"} for rs in replicas)


def test_the_ring_position_continues_a_topic_where_it_is():
    nodes = [NodeId(n) for n in range(4)]
    racks = {NodeId(0): "a", NodeId(1): "a", NodeId(2): "b", NodeId(3): "b"}
    first = assign_replicas(num_partitions=1, replication_factor=2, nodes=nodes, start_index=2,
                            racks=racks)[0][0]
    start = ring_position(nodes, racks, first)
    grown = assign_replicas(num_partitions=3, replication_factor=2, nodes=nodes,
                            start_index=start, racks=racks)
    assert grown[0][0] == first
    assert ring_position(nodes, None, NodeId(3)) == 3


@given(
    st.lists(st.integers(0, 1000), min_size=1, max_size=12, unique=True),
    st.lists(st.sampled_from("abcd"), min_size=12, max_size=12),
    st.integers(1, 30),
    st.data(),
)
def test_rack_aware_replicas_are_distinct_and_cover_as_many_racks_as_they_can(
    ids, rack_names, partitions, data
):
    nodes = [NodeId(n) for n in sorted(ids)]
    racks = {node: rack_names[i] for i, node in enumerate(nodes)}
    factor = data.draw(st.integers(1, len(nodes)))
    replicas = assign_replicas(num_partitions=partitions, replication_factor=factor,
                               nodes=nodes, start_index=data.draw(st.integers(0, 100)),
                               racks=racks)
    spread = min(factor, len(set(racks.values())))
    for rs in replicas:
        assert len(rs) == factor == len(set(rs)) and set(rs) <= set(nodes)
        assert len({racks[r] for r in rs}) == spread
    leaders = Counter(r[0] for r in replicas)
    counts = [leaders.get(n, 0) for n in nodes]
    assert max(counts) - min(counts) <= 1
