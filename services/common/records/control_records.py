"""Control batches that end transactions (Kafka's ``ControlRecordType`` and
``EndTransactionMarker``).

A transaction coordinator ends a transaction by writing, to every partition it touched, a
control batch: attributes transactional (bit 4) and control (bit 5), uncompressed, the
transaction's producer id and epoch, no sequence (-1), one record whose key says what the
batch controls and whose value carries that control's data::

    ControlRecordKey      => version:int16 (0) type:int16
    EndTransactionMarker  => version:int16 (0) coordinator_epoch:int32

Types 0 ABORT and 1 COMMIT are end transaction markers; Kafka's KRaft quorum writes others
(2 and up), which a reader here reports as not being a marker. As Kafka's readers do, a newer
version of the key or the marker is read as version 0 (later versions may only append
fields), and a negative version or a key or value too short is an error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from .record import Record, decode_records, encode_batch
from .record_batch import (
    CONTROL_BIT,
    NO_PARTITION_LEADER_EPOCH,
    TRANSACTIONAL_BIT,
    BatchHeader,
    Buffer,
    RecordError,
)

CONTROL_KEY_VERSION = 0
END_TRANSACTION_MARKER_VERSION = 0

_CONTROL_KEY = struct.Struct(">hh")
_END_TRANSACTION_MARKER = struct.Struct(">hi")


class ControlRecordType(IntEnum):
    """The control record types of transactions."""

    ABORT = 0
    COMMIT = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class EndTransactionMarker:
    """The end of a transaction, committed or aborted, by the transaction coordinator of
    ``coordinator_epoch`` (a partition refuses markers of an older coordinator epoch)."""

    type: ControlRecordType
    coordinator_epoch: int


def build_end_transaction_batch(marker: EndTransactionMarker, *, producer_id: int,
                                producer_epoch: int, timestamp: int,
                                partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH
                                ) -> bytes:
    """The control batch of ``marker`` for the transaction of ``producer_id`` at
    ``producer_epoch``, stamped ``timestamp``; its offset is the log node's to assign."""
    header = BatchHeader(partition_leader_epoch=partition_leader_epoch,
                         attributes=TRANSACTIONAL_BIT | CONTROL_BIT, base_timestamp=timestamp,
                         max_timestamp=timestamp, producer_id=producer_id,
                         producer_epoch=producer_epoch)
    key = _CONTROL_KEY.pack(CONTROL_KEY_VERSION, marker.type)
    value = _END_TRANSACTION_MARKER.pack(END_TRANSACTION_MARKER_VERSION, marker.coordinator_epoch)
    return encode_batch(header, [Record(0, 0, key, value)])


def read_end_transaction_marker(batch: Buffer, header: BatchHeader) -> EndTransactionMarker | None:
    """The marker held by control batch ``batch`` (the whole batch, header first), or None
    when it is a control batch of another type. Raises :class:`RecordError` for a batch that is
    not a control batch or does not hold one well-formed control record."""
    if not header.is_control:
        raise RecordError(f"batch at offset {header.base_offset} is not a control batch")
    records = decode_records(batch, header)
    if len(records) != 1:
        raise RecordError(f"control batch of {len(records)} records")
    key, value = records[0].key or b"", records[0].value or b""
    if len(key) < _CONTROL_KEY.size:
        raise RecordError(f"control record key of {len(key)} bytes")
    key_version, type_id = _CONTROL_KEY.unpack_from(key)
    if key_version < 0:
        raise RecordError(f"control record key version {key_version}")
    if type_id not in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
        return None
    if len(value) < _END_TRANSACTION_MARKER.size:
        raise RecordError(f"end transaction marker of {len(value)} bytes")
    version, coordinator_epoch = _END_TRANSACTION_MARKER.unpack_from(value)
    if version < 0:
        raise RecordError(f"end transaction marker version {version}")
    return EndTransactionMarker(type=ControlRecordType(type_id),
                                coordinator_epoch=coordinator_epoch)
