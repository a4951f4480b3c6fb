"""The spread plan: replicas off excluded nodes, even replica counts and preferred leaders
over the nodes kept, as few moves as that takes, replica counts unchanged."""

from __future__ import annotations

import pytest

from services.admin.spread import load_of, plan


def apply(assignment, moves):
    return {**assignment, **moves}


def test_partitions_piled_on_one_node_spread_over_new_ones():
    assignment = {("t", p): (0,) for p in range(6)}
    moves = plan(assignment, [0, 1, 2])
    replicas, leaders = load_of(apply(assignment, moves))
    assert replicas == {0: 2, 1: 2, 2: 2} and leaders == {0: 2, 1: 2, 2: 2}
    assert len(moves) == 4  # the two that stay on node 0 are not touched


def test_an_excluded_node_is_emptied_and_replica_counts_kept():
    assignment = {("t", p): tuple((p + i) % 3 for i in range(2)) for p in range(9)}
    moves = plan(assignment, [0, 1, 2, 3], exclude=[1])
    after = apply(assignment, moves)
    replicas, leaders = load_of(after)
    assert replicas[1] == 0 and leaders[1] == 0
    assert all(len(r) == 2 and len(set(r)) == 2 for r in after.values())
    assert max(replicas[n] for n in (0, 2, 3)) - min(replicas[n] for n in (0, 2, 3)) <= 1


def test_a_balanced_cluster_needs_no_move():
    assignment = {("t", p): ((p % 3), (p + 1) % 3) for p in range(6)}
    assert plan(assignment, [0, 1, 2]) == {}


def test_more_replicas_than_nodes_kept_is_refused():
    with pytest.raises(ValueError):
        plan({("t", 0): (0, 1, 2)}, [0, 1, 2], exclude=[2])
