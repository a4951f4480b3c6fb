"""The transactions the log cleaner walks through (Kafka's ``CleanedTransactionMetadata``):
which data batches belong to aborted transactions, and which markers may go.

The cleaner reads a log's batches in offset order; this follows them with the aborted
transactions of the range (from the transaction indexes, collected on the event loop before
the cleaner's thread starts) sorted by first offset. A transaction becomes *ongoing aborted*
once a batch reaches its first offset, until its producer's ABORT marker; a transactional
batch of a producer with an ongoing aborted transaction is aborted data, and any other
transactional batch makes its producer's transaction *ongoing committed* until its COMMIT
marker. So:

- aborted data may be removed (its records are of no reader's concern: read_committed readers
  skip them, and read_uncommitted readers of a compacted topic get no guarantee about them);
- an ABORT marker stays while batches of its transaction were seen in this pass (the reader
  needs the marker and the cleaned segment's index needs the transaction: it is added to
  :attr:`CleanedTransactions.index`); a COMMIT marker stays while batches of its transaction
  were seen. Otherwise the marker may be discarded, once its delete horizon has passed (the
  cleaner sets one the first time, as for tombstones: "transactional markers are retained
  until ..." in Kafka's ``LogCleaner``);
- a control batch without records (a marker the cleaner emptied) may always be discarded;
  one of an unknown control type never is.

The cleaner only cleans below the last stable offset, so every transaction it meets there is
decided and its marker is in the log. Not thread-safe: one pass of the cleaner's thread owns
an instance.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from services.common.records.control_records import ControlRecordType, EndTransactionMarker
from services.common.records.record_batch import TRANSACTIONAL_BIT, BatchHeader

from .transaction_index import AbortedTxn, TransactionIndex


@dataclass(slots=True)
class _OngoingAbort:
    txn: AbortedTxn
    # Whether a data batch of the transaction was seen in this pass.
    seen: bool = False


class CleanedTransactions:
    """Transaction state along one cleaning pass; see the module docstring."""

    def __init__(self, aborted: Iterable[AbortedTxn]) -> None:
        # Not reached yet, by first offset (a transaction's first offset is unique).
        self._pending = [(txn.first_offset, txn) for txn in aborted]
        heapq.heapify(self._pending)
        self._aborting: dict[int, _OngoingAbort] = {}
        self._committing: set[int] = set()
        # Where kept aborted transactions go: the index of the segment being written.
        self.index: TransactionIndex | None = None

    def _reach(self, offset: int) -> None:
        """Every aborted transaction beginning at or before ``offset`` is now ongoing."""
        pending = self._pending
        while pending and pending[0][0] <= offset:
            txn = heapq.heappop(pending)[1]
            self._aborting.setdefault(txn.producer_id, _OngoingAbort(txn))

    def on_data_batch(self, header: BatchHeader) -> bool:
        """A data batch read: whether it is aborted data (Kafka's ``onBatchRead``)."""
        self._reach(header.last_offset)
        if not header.attributes & TRANSACTIONAL_BIT:
            return False
        ongoing = self._aborting.get(header.producer_id)
        if ongoing is not None:
            ongoing.seen = True
            return True
        self._committing.add(header.producer_id)
        return False

    def on_control_batch(self, header: BatchHeader,
                         marker: EndTransactionMarker | None) -> bool:
        """A control batch read, holding ``marker`` (None: none): whether it may be discarded
        (Kafka's ``onControlBatchRead``). A kept ABORT goes in :attr:`index`."""
        self._reach(header.last_offset)
        if marker is None:
            return header.record_count == 0
        producer_id = header.producer_id
        if marker.type is ControlRecordType.ABORT:
            ongoing = self._aborting.pop(producer_id, None)
            if ongoing is not None and ongoing.seen:
                if self.index is not None:
                    self.index.append(ongoing.txn)
                return False
            return True
        if producer_id in self._committing:
            self._committing.discard(producer_id)
            return False
        return True
