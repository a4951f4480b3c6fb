"""The state of one ``__transaction_state`` partition, replayed from its records: every
transactional id it holds and its transaction (what Kafka's ``TransactionStateManager`` loads
into memory when it becomes a partition's coordinator), and the records that write changes.
Pure: records in, state out; records out of transactions.

Later records win per key (the log is compacted by key, as Kafka's); a tombstone (no value)
deletes a transactional id that expired.
"""

from __future__ import annotations

from ..coordinator.schema import decode, decode_key, encode
from ..coordinator_records import TRANSACTION_KEYS, TransactionLogKey, TransactionLogValue
from .metadata import TransactionMetadata

Record = tuple[bytes, bytes | None]


class PartitionState:
    """The transactions of one transaction state partition."""

    def __init__(self) -> None:
        self.transactions: dict[str, TransactionMetadata] = {}

    def get(self, transactional_id: str) -> TransactionMetadata | None:
        return self.transactions.get(transactional_id)

    def replay(self, key: bytes, value: bytes | None) -> None:
        """Apply one record; raises RecordFormatError (a ValueError) for one it cannot read
        (records of other kinds are ignored)."""
        decoded = decode_key(TRANSACTION_KEYS, key)
        if not isinstance(decoded, TransactionLogKey):
            return
        if value is None:
            self.transactions.pop(decoded.transactional_id, None)
        else:
            self.transactions[decoded.transactional_id] = TransactionMetadata.from_record(
                decoded.transactional_id, decode(TransactionLogValue, value))


def transaction_record(transactional_id: str, meta: TransactionMetadata | None) -> Record:
    """The record of a transaction (key v0, value v1), or the tombstone of an expired id."""
    key = encode(TransactionLogKey(transactional_id=transactional_id), 0)
    return key, None if meta is None else encode(meta.to_record(), 1)
