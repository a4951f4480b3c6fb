"""Tests of services.log.transaction_index: the entry format, lookups of the aborted
transactions of a read, truncation, persistence and sanity checks."""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.log.transaction_index import ENTRY_SIZE, AbortedTxn, TransactionIndex


def test_an_entry_is_kafkas_34_bytes(tmp_path: Path) -> None:
    index = TransactionIndex(tmp_path / "0.txnindex", 100)
    index.append(AbortedTxn(producer_id=7, first_offset=90, last_offset=105,
                            last_stable_offset=106))
    index.close()
    raw = (tmp_path / "0.txnindex").read_bytes()
    assert len(raw) == ENTRY_SIZE == 34
    assert struct.unpack(">hqqqq", raw) == (0, 7, 90, 105, 106)
    reopened = TransactionIndex(tmp_path / "0.txnindex", 100)
    assert reopened.existed and reopened.entries() == [AbortedTxn(7, 90, 105, 106)]
    assert reopened.problem(next_offset=106) is None
    reopened.close()


def test_markers_must_come_in_offset_order(tmp_path: Path) -> None:
    index = TransactionIndex(tmp_path / "0.txnindex", 0)
    index.append(AbortedTxn(1, 0, 5, 6))
    with pytest.raises(ValueError):
        index.append(AbortedTxn(2, 1, 5, 6))
    assert len(index) == 1
    index.close()


def test_collect_finds_the_overlapping_transactions_and_when_to_stop(tmp_path: Path) -> None:
    index = TransactionIndex(tmp_path / "0.txnindex", 0)
    # Producer 1 aborted [2, 10] while producer 2's transaction from 4 was open, then producer
    # 2 aborted [4, 20] with nothing else open.
    index.append(AbortedTxn(1, 2, 10, 4))
    index.append(AbortedTxn(2, 4, 20, 21))
    # [0, 2) touches neither, and once producer 1 aborted, everything below 4 was decided.
    assert index.collect(0, 2) == ([], True)
    assert index.collect(0, 4) == ([AbortedTxn(1, 2, 10, 4)], True)
    # Producer 2's transaction from 4 was still open then: look on.
    assert index.collect(0, 5) == ([AbortedTxn(1, 2, 10, 4), AbortedTxn(2, 4, 20, 21)], True)
    assert index.collect(11, 15) == ([AbortedTxn(2, 4, 20, 21)], True)
    # Past the last stable offset of the last marker here: a later segment may hold more.
    assert index.collect(11, 25) == ([AbortedTxn(2, 4, 20, 21)], False)
    assert index.collect(21, 30) == ([], False)
    index.close()


def test_truncation_drops_the_markers_cut_away(tmp_path: Path) -> None:
    index = TransactionIndex(tmp_path / "0.txnindex", 0)
    for last in (3, 8, 12):
        index.append(AbortedTxn(last, 0, last, last + 1))
    index.truncate_to(8)
    assert [txn.last_offset for txn in index.entries()] == [3]
    index.truncate_to(100)
    assert len(index) == 1
    index.close()
    assert (tmp_path / "0.txnindex").stat().st_size == ENTRY_SIZE


@pytest.mark.parametrize(("raw", "next_offset", "problem"), [
    (struct.pack(">hqqqq", 0, 1, 0, 5, 6)[:-3], None, "torn"),
    (struct.pack(">hqqqq", 1, 1, 0, 5, 6), None, "version"),
    (struct.pack(">hqqqq", 0, 1, 0, 5, 6) * 2, None, "order"),
    (struct.pack(">hqqqq", 0, 1, 9, 5, 6), None, "first offset"),
    (struct.pack(">hqqqq", 0, 1, 0, 5, 6), 5, "beyond the end"),
    (struct.pack(">hqqqq", 0, 1, 0, 5, 6), None, "below the segment"),
])
def test_damaged_indexes_are_reported(tmp_path: Path, raw: bytes, next_offset: int | None,
                                      problem: str) -> None:
    path = tmp_path / "x.txnindex"
    path.write_bytes(raw)
    index = TransactionIndex(path, 10 if problem == "below the segment" else 0)
    found = index.problem(next_offset)
    index.close()
    assert found is not None and problem in found


def test_a_missing_file_is_noticed_and_an_unchanged_index_is_not_forced_to_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = TransactionIndex(tmp_path / "0.txnindex", 0)
    assert not index.existed and (tmp_path / "0.txnindex").exists()
    synced: list[int] = []
    monkeypatch.setattr("services.log.index_file.os.fsync", synced.append)
    index.flush()
    assert synced == []
    index.append(AbortedTxn(1, 0, 1, 2))
    index.flush()
    index.flush()
    assert len(synced) == 1
    index.close()


@settings(max_examples=150, deadline=None)
@given(
    # Transactions as (first offset, length, how far below the marker + 1 the LSO was);
    # markers follow each other in offset order.
    txns=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 15), st.integers(0, 20)),
                  max_size=12),
    fetch=st.integers(0, 120),
    span=st.integers(1, 60),
)
def test_collect_matches_a_scan_of_every_entry(txns: list[tuple[int, int, int]], fetch: int,
                                               span: int) -> None:
    entries, marker = [], 0
    for first, length, open_below in txns:
        marker = max(marker + 1, first + length)
        entries.append(AbortedTxn(len(entries), min(first, marker), marker,
                                  max(marker + 1 - open_below, 0)))
    with tempfile.TemporaryDirectory() as tmp:
        index = TransactionIndex(Path(tmp) / "0.txnindex", 0)
        for entry in entries:
            index.append(entry)
        found, complete = index.collect(fetch, fetch + span)
        index.close()
    # Kafka's scan: every entry in order, stopping after the first whose LSO reaches the bound.
    expected, stop = [], False
    for entry in entries:
        if entry.last_offset >= fetch and entry.first_offset < fetch + span:
            expected.append(entry)
        if entry.last_stable_offset >= fetch + span:
            stop = True
            break
    assert (found, complete) == (expected, stop)
