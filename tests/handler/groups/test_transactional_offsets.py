"""Transactional offsets in a ``__consumer_offsets`` partition's state (Kafka's pending
transactional offsets of ``OffsetMetadataManager``): pending per producer until its COMMIT
marker, dropped by its ABORT, the newer record winning when a plain commit came between, and
tombstones dropping pending offsets too."""

from __future__ import annotations

from services.handler.groups.state import CommittedOffset, PartitionState, offset_record

TP = ("t", 0)


def replay(state: PartitionState, offset: int, producer_id: int, value: int | None,
           tp: tuple[str, int] = TP, group: str = "g") -> None:
    key, stored = offset_record(group, tp, None if value is None else CommittedOffset(
        offset=value, commit_timestamp=1))
    state.replay_record(offset, producer_id, key, stored)


def committed(state: PartitionState, tp: tuple[str, int] = TP) -> int | None:
    value = state.group_offsets("g").get(tp)
    return None if value is None else value.offset


def test_pending_offsets_count_once_committed_and_vanish_once_aborted() -> None:
    state = PartitionState()
    replay(state, 0, -1, 3)
    replay(state, 1, 7, 10)
    replay(state, 2, 8, 20, tp=("t", 1))
    assert committed(state) == 3 and state.pending_partitions("g") == {TP, ("t", 1)}
    assert state.in_transaction(7) and not state.in_transaction(9)
    state.replay_end_transaction(7, committed=True)
    state.replay_end_transaction(8, committed=False)
    assert (committed(state), committed(state, ("t", 1))) == (10, None)
    assert state.pending_partitions("g") == set() and not state.in_transaction(7)
    state.replay_end_transaction(7, committed=True)  # a marker without pending offsets
    assert committed(state) == 10


def test_a_plain_commit_written_after_the_transactional_one_wins() -> None:
    state = PartitionState()
    replay(state, 0, 7, 10)
    replay(state, 1, -1, 11)
    state.replay_end_transaction(7, committed=True)
    assert committed(state) == 11
    replay(state, 2, -1, 12)
    replay(state, 3, 7, 13)
    state.replay_end_transaction(7, committed=True)
    assert committed(state) == 13


def test_tombstones_drop_pending_offsets_and_pending_groups_exist() -> None:
    state = PartitionState()
    replay(state, 0, 7, 10, group="only-pending")
    assert state.exists("only-pending") and "only-pending" in state.group_ids()
    replay(state, 1, 7, 10)
    replay(state, 2, -1, None)
    assert state.pending_partitions("g") == set()
    state.replay_end_transaction(7, committed=True)
    assert committed(state) is None
    assert state.group_offsets("only-pending")[TP].offset == 10
