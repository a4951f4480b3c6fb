"""One partition's replication state: high watermark = min log end offset over the ISR, and
the lag rules that shrink and expand the ISR."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.replicator.metadata import NodeId
from services.replicator.replication.partition_state import PartitionReplication

LAG_MS = 1000
L, F1, F2 = NodeId(0), NodeId(1), NodeId(2)


def partition(isr: tuple[NodeId, ...] = (L, F1, F2), now: int = 0) -> PartitionReplication:
    return PartitionReplication(topic="t", partition=0, leader=L, leader_epoch=3,
                                replicas=(L, F1, F2), isr=isr, now_ms=now)


def test_the_high_watermark_waits_for_every_isr_member():
    p = partition()
    p.record_leader(log_end_offset=10, high_watermark=0)
    assert not p.advance_high_watermark()  # no follower offset known yet
    p.record_follower(F1, log_end_offset=10, leader_log_end_offset=10, now_ms=1)
    assert p.high_watermark_candidate() == -1
    p.record_follower(F2, log_end_offset=6, leader_log_end_offset=10, now_ms=1)
    assert p.advance_high_watermark() and p.high_watermark == 6
    p.record_follower(F2, log_end_offset=10, leader_log_end_offset=10, now_ms=2)
    assert p.advance_high_watermark() and p.high_watermark == 10
    assert not p.advance_high_watermark()


def test_a_follower_out_of_the_isr_does_not_hold_the_high_watermark_back():
    p = partition(isr=(L, F1))
    p.record_leader(log_end_offset=10, high_watermark=0)
    p.record_follower(F1, log_end_offset=8, leader_log_end_offset=10, now_ms=1)
    p.record_follower(F2, log_end_offset=2, leader_log_end_offset=10, now_ms=1)
    assert p.advance_high_watermark() and p.high_watermark == 8


def test_the_high_watermark_never_moves_back():
    p = partition(isr=(L, F1))
    p.record_leader(log_end_offset=10, high_watermark=9)  # the leader committed alone before
    p.record_follower(F1, log_end_offset=5, leader_log_end_offset=10, now_ms=1)
    assert not p.advance_high_watermark() and p.high_watermark == 9


def test_a_leader_alone_in_the_isr_commits_its_log_end():
    p = partition(isr=(L,))
    p.record_leader(log_end_offset=4, high_watermark=0)
    assert p.advance_high_watermark() and p.high_watermark == 4


def test_isr_followers_get_the_whole_lag_time_then_leave():
    p = partition(now=1000)
    p.record_leader(log_end_offset=10, high_watermark=0)
    p.record_follower(F1, log_end_offset=10, leader_log_end_offset=10, now_ms=1500)
    assert p.lagging_in_sync(now_ms=2000, lag_ms=LAG_MS) == ()
    # F2 never caught up since the state began at 1000; F1 did at 1500.
    assert p.lagging_in_sync(now_ms=2001, lag_ms=LAG_MS) == (F2,)
    assert p.lagging_in_sync(now_ms=2501, lag_ms=LAG_MS) == (F1, F2)


def test_a_copy_that_leaves_the_follower_short_is_not_catching_up():
    p = partition(now=0)
    # The read saw the leader at 20 but only 12 fit in it.
    p.record_follower(F1, log_end_offset=12, leader_log_end_offset=20, now_ms=900)
    assert p.lagging_in_sync(now_ms=1001, lag_ms=LAG_MS) == (F1, F2)


def test_a_caught_up_follower_holding_the_high_watermark_joins():
    p = partition(isr=(L, F1), now=0)
    p.record_leader(log_end_offset=10, high_watermark=10)
    p.record_follower(F1, log_end_offset=10, leader_log_end_offset=10, now_ms=5)
    assert p.caught_up_out_of_sync(now_ms=10, lag_ms=LAG_MS) == ()  # F2 never caught up
    p.record_follower(F2, log_end_offset=7, leader_log_end_offset=7, now_ms=20)
    assert p.caught_up_out_of_sync(now_ms=30, lag_ms=LAG_MS) == ()  # below the watermark
    p.record_follower(F2, log_end_offset=10, leader_log_end_offset=10, now_ms=40)
    assert p.caught_up_out_of_sync(now_ms=50, lag_ms=LAG_MS) == (F2,)
    assert p.caught_up_out_of_sync(now_ms=2000, lag_ms=LAG_MS) == ()  # too long ago
    p.update_isr((L, F1, F2), now_ms=60)
    assert p.isr == (L, F1, F2) and p.caught_up_out_of_sync(now_ms=70, lag_ms=LAG_MS) == ()


def test_follower_lag_in_messages_and_seconds():
    p = partition(isr=(L, F1), now=1000)
    assert p.follower_lag(F1, 1500) == (-1, 0.5)
    assert p.follower_lag(F2, 1500) == (-1, -1.0)
    p.record_leader(log_end_offset=50, high_watermark=0)
    p.record_follower(F2, log_end_offset=20, leader_log_end_offset=50, now_ms=1600)
    assert p.follower_lag(F2, 2000) == (30, -1.0)
    p.forget_follower(F2)
    assert p.follower_lag(F2, 2000) == (-1, -1.0)


@given(st.lists(st.tuples(st.sampled_from([F1, F2]), st.integers(0, 100)), max_size=40),
       st.sampled_from([(L,), (L, F1), (L, F2), (L, F1, F2)]))
def test_the_high_watermark_is_held_by_every_isr_member(reports, isr):
    p = partition(isr=isr)
    p.record_leader(log_end_offset=100, high_watermark=-1)
    highest_seen = -1
    for follower, offset in reports:
        # A follower's log only grows (truncation starts a new state).
        offset = max(offset, p.followers[follower].log_end_offset)
        p.record_follower(follower, log_end_offset=offset, leader_log_end_offset=100, now_ms=1)
        p.advance_high_watermark()
        assert p.high_watermark >= highest_seen
        highest_seen = p.high_watermark
        for member in isr:
            if member != L:
                assert p.followers[member].log_end_offset >= p.high_watermark


def test_a_follower_expanding_a_lone_leaders_isr_holds_the_high_watermark_back():
    p = partition(isr=(L,), now=0)
    p.record_leader(log_end_offset=10, high_watermark=10)
    p.record_follower(F1, log_end_offset=10, leader_log_end_offset=10, now_ms=5)
    p.expanding.add(F1)
    p.record_leader(log_end_offset=14, high_watermark=10)
    assert not p.advance_high_watermark()  # 14 is on the leader only
    p.record_follower(F1, log_end_offset=12, leader_log_end_offset=14, now_ms=6)
    assert p.advance_high_watermark() and p.high_watermark == 12
    p.update_isr((L, F1), now_ms=7)
    assert p.expanding == set()
