"""What a leader knows of its followers: positions and caught-up times from their fetches,
the high watermark over the maximal ISR, and the ISR changes it asks for (Kafka's Partition on
the leader). Pure domain."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.log.leader_replicas import LeaderReplicas

LAG_MS = 1000
L, F1, F2 = 0, 1, 2


def replicas(isr: tuple[int, ...] = (L, F1, F2), now: int = 0,
             epoch_start: int = 0) -> LeaderReplicas:
    return LeaderReplicas(node_id=L, leader_epoch=3, replicas=(L, F1, F2), isr=isr,
                          partition_epoch=5, epoch_start_offset=epoch_start, now_ms=now)


def test_the_high_watermark_waits_for_every_isr_member():
    r = replicas()
    assert r.high_watermark_candidate(10) == -1  # no follower position known yet
    r.record_fetch(F1, 10, 10, now_ms=1)
    assert r.high_watermark_candidate(10) == -1
    r.record_fetch(F2, 6, 10, now_ms=1)
    assert r.high_watermark_candidate(10) == 6
    r.record_fetch(F2, 10, 10, now_ms=2)
    assert r.high_watermark_candidate(12) == 10


def test_a_follower_out_of_the_isr_does_not_hold_the_high_watermark_back():
    r = replicas(isr=(L, F1))
    r.record_fetch(F1, 8, 10, now_ms=1)
    r.record_fetch(F2, 2, 10, now_ms=1)
    assert r.high_watermark_candidate(10) == 8


def test_a_leader_alone_in_the_isr_commits_its_log_end():
    r = replicas(isr=(L,))
    assert r.alone and r.high_watermark_candidate(4) == 4


def test_a_node_that_is_no_follower_is_not_recorded():
    r = replicas(isr=(L, F1))
    assert not r.record_fetch(7, 5, 5, now_ms=1)
    assert not r.record_fetch(L, 5, 5, now_ms=1)


def test_isr_followers_get_the_whole_lag_time_then_leave():
    r = replicas(now=1000)
    r.record_fetch(F1, 10, 10, now_ms=1500)
    assert r.out_of_sync(now_ms=2000, lag_ms=LAG_MS) == ()
    # F2 never caught up since the leader took office at 1000; F1 did at 1500.
    assert r.out_of_sync(now_ms=2001, lag_ms=LAG_MS) == (F2,)
    assert r.shrink(now_ms=2001, lag_ms=LAG_MS) == (L, F1)
    assert r.out_of_sync(now_ms=2501, lag_ms=LAG_MS) == (F1, F2)


def test_a_fetch_behind_the_log_end_catches_up_only_to_the_previous_fetch():
    r = replicas(now=0)
    # F1 fetched at the log end (10) at 900, then at 10 again while the leader had 20: it
    # was caught up as of its previous fetch, not now.
    r.record_fetch(F1, 10, 10, now_ms=900)
    r.record_fetch(F1, 10, 20, now_ms=1900)
    assert r.out_of_sync(now_ms=1901, lag_ms=LAG_MS) == (F1, F2)
    assert r.followers[F1].last_caught_up_ms == 900
    # The next fetch reaches the log end the leader had at the one before: caught up then.
    r.record_fetch(F1, 20, 30, now_ms=2500)
    assert r.followers[F1].last_caught_up_ms == 1900


def test_a_follower_joins_once_it_holds_the_high_watermark_and_the_epoch_start():
    r = replicas(isr=(L, F1), now=0, epoch_start=8)
    r.record_fetch(F2, 7, 10, now_ms=5)
    assert r.expansion(high_watermark=6) is None  # below the epoch start
    r.record_fetch(F2, 9, 10, now_ms=6)
    assert r.expansion(high_watermark=10) is None  # below the high watermark
    assert r.expansion(high_watermark=9) == (L, F1, F2)


def test_only_the_follower_fetching_now_joins_not_one_that_stopped_at_the_high_watermark():
    r = replicas(isr=(L,), now=0)
    r.record_fetch(F2, 10, 10, now_ms=5)  # F2's last fetch before it went away
    r.record_fetch(F1, 10, 10, now_ms=6)
    assert r.expansion(10, now_ms=6, fetching=F1) == (L, F1)
    # Refused (F1 in controlled shutdown, say): F2 is asked for only on a fetch of its own.
    r.propose((L, F1))
    r.answered((L,), now_ms=7, retry_ms=1000)
    r.record_fetch(F1, 10, 10, now_ms=1100)
    assert r.expansion(10, now_ms=1100, fetching=F1) == (L, F1)
    r.record_fetch(F2, 10, 10, now_ms=1101)
    assert r.expansion(10, now_ms=1101, fetching=F2) == (L, F2)


def test_a_pending_expansion_counts_the_new_follower_until_answered():
    r = replicas(isr=(L,), now=0)
    r.record_fetch(F1, 10, 10, now_ms=5)
    assert r.alone and r.high_watermark_candidate(10) == 10
    proposal = r.propose((L, F1))
    assert proposal.adding == {F1} and not r.alone
    assert r.expansion(10) is None and r.shrink(10_000, LAG_MS) is None  # one at a time
    assert r.high_watermark_candidate(14) == 10  # 14 is on the leader only
    r.record_fetch(F1, 12, 14, now_ms=6)
    assert r.high_watermark_candidate(14) == 12
    # A newer committed state without it (say another follower was fenced) keeps the change
    # pending, the follower still counted.
    r.update((L, F1, F2), (L,), partition_epoch=6, now_ms=7)
    assert r.pending is proposal and r.maximal_isr() == {L, F1}
    r.answered((L, F1), now_ms=8, retry_ms=1000)
    r.update((L, F1, F2), (L, F1), partition_epoch=7, now_ms=8)
    assert r.pending is None and r.isr == (L, F1) and r.maximal_isr() == {L, F1}


def test_a_refused_expansion_is_not_asked_for_again_at_once():
    r = replicas(isr=(L,), now=0)
    r.record_fetch(F1, 10, 10, now_ms=5)
    r.propose(r.expansion(10, now_ms=5))
    # Refused (say F1 is in controlled shutdown): the ISR stays the leader alone.
    r.answered((L,), now_ms=10, retry_ms=1000)
    assert r.alone and r.expansion(10, now_ms=500) is None
    assert r.expansion(10, now_ms=1010) == (L, F1)


def test_a_pending_shrink_keeps_counting_the_leaving_follower():
    r = replicas(isr=(L, F1, F2), now=0)
    r.record_fetch(F1, 10, 10, now_ms=1)
    r.record_fetch(F2, 4, 10, now_ms=1)
    r.propose((L, F1))
    assert r.high_watermark_candidate(10) == 4
    r.answered((L, F1))
    r.update((L, F1, F2), (L, F1), partition_epoch=6, now_ms=2)
    assert r.high_watermark_candidate(10) == 10


def test_replicas_that_come_and_go():
    r = replicas(isr=(L, F1), now=0)
    r.update((L, F1, 3), (L, F1), partition_epoch=6, now_ms=1)
    assert set(r.followers) == {F1, 3} and r.followers[3].log_end_offset == -1
    # A follower that joins the committed ISR starts its lag time then.
    r.update((L, F1, 3), (L, F1, 3), partition_epoch=7, now_ms=50)
    assert r.followers[3].last_caught_up_ms == 50


def test_follower_lag_in_messages_and_seconds():
    r = replicas(isr=(L, F1), now=1000)
    assert r.follower_lag(F1, 0, 1500) == (-1, 0.5)
    assert r.follower_lag(F2, 0, 1500) == (-1, -1.0)
    r.record_fetch(F2, 20, 50, now_ms=1600)
    assert r.follower_lag(F2, 50, 2000) == (30, -1.0)


@given(st.lists(st.tuples(st.sampled_from([F1, F2]), st.integers(0, 100)), max_size=40),
       st.sampled_from([(L,), (L, F1), (L, F2), (L, F1, F2)]))
def test_the_high_watermark_is_held_by_every_isr_member(fetches, isr):
    r = replicas(isr=isr)
    high_watermark = -1
    for follower, offset in fetches:
        offset = max(offset, r.followers[follower].log_end_offset)  # a log only grows
        r.record_fetch(follower, offset, 100, now_ms=1)
        high_watermark = max(high_watermark, r.high_watermark_candidate(100))
        for member in isr:
            if member != L:
                assert r.followers[member].log_end_offset >= high_watermark
