"""The leader epoch cache: assignment rules, Kafka's end offset lookup, truncation and the
checkpoint file."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from services.log.leader_epochs import FILE_NAME, EpochEntry, LeaderEpochCache


def test_only_newer_epochs_are_added_and_survive_a_reload(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path)
    assert cache.latest_epoch == -1 and cache.entries == ()
    assert cache.assign(0, 0)
    assert not cache.assign(0, 5)  # the same epoch again: its start stays
    assert not cache.assign(-1, 7)  # batches written without an epoch
    assert cache.assign(3, 10)
    assert not cache.assign(2, 12)
    assert cache.entries == (EpochEntry(0, 0), EpochEntry(3, 10))
    assert (tmp_path / FILE_NAME).read_text().splitlines() == ["0", "2", "0 0", "3 10"]
    assert LeaderEpochCache(tmp_path).entries == cache.entries


def test_an_epoch_starting_where_an_empty_one_did_replaces_it(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path)
    cache.assign(1, 0)
    cache.assign(2, 4)
    cache.assign(5, 4)  # epoch 2 wrote nothing
    assert cache.entries == (EpochEntry(1, 0), EpochEntry(5, 4))


def test_end_offsets_follow_kafka(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path)
    assert cache.end_offset_for(0, 10) == (-1, -1)  # nothing known
    cache.assign(1, 5)
    cache.assign(3, 20)
    cache.assign(4, 30)
    log_end = 42
    assert cache.end_offset_for(4, log_end) == (4, 42)  # the current epoch ends at the end
    assert cache.end_offset_for(3, log_end) == (3, 30)
    assert cache.end_offset_for(2, log_end) == (1, 20)  # epoch 2 unknown: the one below it
    assert cache.end_offset_for(0, log_end) == (0, 5)  # older than everything known
    assert cache.end_offset_for(9, log_end) == (-1, -1)  # newer than everything known
    assert cache.end_offset_for(-1, log_end) == (-1, -1)


def test_truncation_forgets_epochs_starting_at_or_past_the_cut(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path)
    for epoch, start in ((0, 0), (2, 10), (3, 15)):
        cache.assign(epoch, start)
    cache.truncate_from_end(15)
    assert cache.entries == (EpochEntry(0, 0), EpochEntry(2, 10))
    cache.truncate_from_end(11)
    assert cache.entries == (EpochEntry(0, 0), EpochEntry(2, 10))
    cache.truncate_from_end(0)
    assert cache.entries == ()
    assert LeaderEpochCache(tmp_path).entries == ()


def test_an_unreadable_file_is_an_empty_cache(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_text("0\n3\n1 0\n")
    assert LeaderEpochCache(tmp_path).entries == ()
    (tmp_path / FILE_NAME).write_text("7\n0\n")
    assert LeaderEpochCache(tmp_path).entries == ()


@settings(deadline=None)  # every change is fsynced: slow on a busy machine
@given(st.lists(st.tuples(st.integers(-1, 20), st.integers(0, 100)), max_size=30))
def test_epochs_and_start_offsets_always_increase(tmp_path_factory, assignments) -> None:
    cache = LeaderEpochCache(tmp_path_factory.mktemp("epochs"))
    for epoch, start in sorted(assignments, key=lambda a: a[1]):
        cache.assign(epoch, start)
    entries = cache.entries
    assert all(a.epoch < b.epoch and a.start_offset < b.start_offset
               for a, b in zip(entries, entries[1:], strict=False))
    for entry in entries:
        end_epoch, _ = cache.end_offset_for(entry.epoch, 1000)
        assert end_epoch == entry.epoch
