"""The chaos checker on crafted histories: each kind of finding is detected, and a clean
history has none."""

from __future__ import annotations

import pytest

from tests.chaos.checker import Acked, ClientSpan, Fault, History, Read, check, findings_by_fault

T = "chaos"


def acked(producer: str, sequence: int, partition: int, offset: int, at: float) -> Acked:
    return Acked(producer=producer, sequence=sequence, topic=T, partition=partition,
                 offset=offset, at=at)


def read(producer: str, sequence: int, partition: int, offset: int, at: float = 100.0,
         consumer: str = "c0", group: bool = True) -> Read:
    return Read(consumer=consumer, producer=producer, sequence=sequence, topic=T,
                partition=partition, offset=offset, at=at, group=group)


def clean_history() -> History:
    """Two producers, two partitions, everything read once where it was acknowledged."""
    history = History()
    offsets = {0: 0, 1: 0}
    for sequence in range(10):
        for producer in ("p0", "p1"):
            partition = sequence % 2
            offset = offsets[partition]
            offsets[partition] += 1
            at = sequence * 0.1
            history.acked.append(acked(producer, sequence, partition, offset, at))
            history.reads.append(read(producer, sequence, partition, offset, at + 0.05))
    history.clients = {
        "p0": ClientSpan(name="p0", start=0.0, end=0.9,
                         progress=[a.at for a in history.acked if a.producer == "p0"]),
        "c0": ClientSpan(name="c0", start=0.0, end=0.95,
                         progress=[r.at for r in history.reads])}
    history.end = 1.0
    return history


def test_a_clean_history_has_no_findings():
    report = check(clean_history(), stuck_after=1.0)
    assert report.ok, report.describe()
    assert report.totals()["acknowledged"] == 20 and report.totals()["lost"] == 0


def test_an_acknowledged_record_nobody_read_is_lost():
    history = clean_history()
    gone = history.reads.pop(7)
    report = check(history, stuck_after=1.0)
    assert [a.record for a in report.lost] == [gone.record]
    assert not report.ok


def test_a_record_read_only_by_the_verifying_reader_is_missed_by_the_group_not_lost():
    history = clean_history()
    history.reads[3] = read(*history.reads[3].record, 1, history.reads[3].offset, group=False)
    report = check(history, stuck_after=1.0)
    assert report.lost == []
    assert [a.record for a in report.missed_by_group] == [history.reads[3].record]


def test_a_record_stored_twice_is_a_duplicate():
    history = clean_history()
    history.reads.append(read("p0", 4, 0, 10))  # a retried batch appended again
    report = check(history, stuck_after=1.0)
    assert [(d.record, d.offsets) for d in report.duplicates] == [(("p0", 4), (4, 10))]
    assert report.reordered == []  # the same sequence twice is a duplicate, not a reordering


def test_reading_one_offset_twice_is_a_redelivery_not_a_duplicate():
    history = clean_history()
    history.reads.append(read("p1", 5, 1, 5, consumer="c1"))  # after a rebalance
    assert check(history, stuck_after=1.0).ok


def test_a_later_record_stored_before_an_earlier_one_is_a_reordering():
    history = clean_history()
    # p0's sequences 2 and 4 (partition 0, offsets 2 and 4) stored the other way round.
    history.reads = [r for r in history.reads if not (r.producer == "p0" and r.sequence in (2, 4))]
    history.reads += [read("p0", 4, 0, 2), read("p0", 2, 0, 4)]
    history.acked = [a for a in history.acked if not (a.producer == "p0" and a.sequence in (2, 4))]
    history.acked += [acked("p0", 4, 0, 2, 0.4), acked("p0", 2, 0, 4, 0.2)]
    report = check(history, stuck_after=1.0)
    assert [(r.producer, r.earlier, r.earlier_offset, r.later, r.later_offset)
            for r in report.reordered] == [("p0", 2, 4, 4, 2)]


def test_an_acknowledgement_at_another_offset_than_read_is_misplaced():
    history = clean_history()
    moved = history.acked[5]
    history.acked[5] = acked(moved.producer, moved.sequence, moved.partition, 99, moved.at)
    report = check(history, stuck_after=1.0)
    assert [m.acked.offset for m in report.misplaced] == [99]


def test_one_offset_read_as_two_records_is_a_divergent_log():
    history = clean_history()
    history.reads.append(read("p9", 0, 1, 3, consumer="c1"))  # read past the watermark
    report = check(history, stuck_after=1.0)
    assert [(d.topic_partition, d.offset) for d in report.divergent] == [((T, 1), 3)]


def test_a_client_without_progress_for_longer_than_allowed_is_stuck():
    history = clean_history()
    history.clients["c1"] = ClientSpan(name="c1", start=0.0, end=5.0, progress=[0.5, 0.6, 4.0])
    report = check(history, stuck_after=2.0)
    assert [(s.client, s.since, s.until) for s in report.stuck] == [("c1", 0.6, 4.0)]
    # Progress outside the span does not count, and the span's end closes the last gap.
    history.clients["c1"] = ClientSpan(name="c1", start=0.0, end=3.0, progress=[0.5, 9.0])
    assert [(s.since, s.until) for s in check(history, stuck_after=2.0).stuck] == [(0.5, 3.0)]


def test_the_ack_pause_of_a_fault_is_the_longest_gap_on_any_partition_around_it():
    history = History()
    # Partition 0 acknowledged every 0.1 s throughout; partition 1 stops from 1.0 to 4.0.
    history.acked += [acked("p0", i, 0, i, i * 0.1) for i in range(100)]
    history.acked += [acked("p0", 100 + i, 1, i, t) for i, t in
                      enumerate([0.2, 0.5, 1.0, 4.0, 4.1, 4.2])]
    history.faults = [Fault(kind="kill", target="log-1", start=1.5, end=2.0),
                      Fault(kind="pause", target="handler-0", start=6.0, end=6.5)]
    history.end = 10.0
    first, second = check(history, stuck_after=10.0).pauses
    assert (first.fault.target, first.seconds, first.topic_partition) == (
        "log-1", pytest.approx(3.0), (T, 1))
    assert not first.open_ended
    # After 6.0 partition 1 has no acknowledgement at all: open-ended up to the history's end.
    assert (second.seconds, second.topic_partition, second.open_ended) == (
        pytest.approx(5.8), (T, 1), True)
    by_kind = check(history, stuck_after=10.0).pauses_by_kind()
    assert by_kind["kill log"] == {"faults": 1, "p50_s": 3.0, "max_s": 3.0}
    assert set(by_kind) == {"kill log", "pause handler"}


def test_a_pause_that_ends_after_the_next_fault_belongs_to_the_next_fault():
    history = History()
    history.acked += [acked("p0", i, 0, i, t) for i, t in
                      enumerate([0.0, 0.1, 0.2, 2.0, 2.1, 2.2, 2.5, 5.5, 5.6])]
    history.faults = [Fault(kind="kill", target="log-0", start=0.5, end=1.0),
                      Fault(kind="pause", target="log-1", start=3.0, end=5.0)]
    history.end = 6.0
    first, second = check(history, stuck_after=10.0).pauses
    assert first.seconds == pytest.approx(1.8)  # 0.2 -> 2.0
    assert second.seconds == pytest.approx(3.0)  # 2.5 -> 5.5, begun before the pause


def test_a_partition_without_acknowledgements_for_longer_than_allowed_is_stalled():
    history = History()
    history.acked += [acked("p0", i, 0, i, i * 0.5) for i in range(20)]  # 0.0 .. 9.5
    history.acked += [acked("p0", 20 + i, 1, i, t) for i, t in enumerate([0.5, 1.0, 7.0, 9.0])]
    history.clients["p0"] = ClientSpan(name="p0", start=0.0, end=10.0,
                                       progress=[a.at for a in history.acked])
    report = check(history, stuck_after=3.0)
    assert report.stuck == []  # the producer progressed on partition 0 all along
    assert [(s.topic_partition, s.since, s.until) for s in report.stalled] == [
        ((T, 1), 1.0, 7.0)]
    assert not report.ok


def test_findings_are_attributed_to_the_fault_in_whose_window_they_were_acknowledged():
    history = clean_history()
    history.faults = [Fault(kind="kill", target="log-0", start=0.25, end=0.3),
                      Fault(kind="full-disk", target="log-1", start=0.55, end=0.7)]
    history.reads.append(read("p0", 8, 0, 30))  # acknowledged at 0.8: during the full disk
    history.reads = [r for r in history.reads if r.record != ("p1", 3)]  # acked at 0.3
    history.reads = [r for r in history.reads if r.record != ("p1", 0)]  # acked at 0.0
    report = check(history, stuck_after=1.0)
    assert findings_by_fault(report, history) == {
        "full-disk log-1": {"duplicates": 1}, "kill log-0": {"lost": 1},
        "before any fault": {"lost": 1}}
