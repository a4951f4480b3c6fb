"""Kafka error codes, in one place.

The codes are Kafka's own (kio's ``ErrorCode`` table, generated from the Java client's
``Errors``). Domain code raises :class:`KafkaError` with a code; the gRPC glue turns it into the
error field of the answer.
"""

from __future__ import annotations

from collections.abc import Sequence

from kio.schema.errors import ErrorCode

__all__ = ["ErrorCode", "KafkaError", "NotEnoughReplicasError", "error_name"]


class KafkaError(Exception):
    """A failure that clients see as a Kafka error code (and an optional message)."""

    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        super().__init__(message or code.name.upper())
        self.code = code
        self.message = message

    @property
    def errno(self) -> int:
        return int(self.code.value)

    @property
    def retriable(self) -> bool:
        return bool(self.code.retriable)


class RecordValidationError(KafkaError):
    """An append refused whole because of some of its records (Kafka's
    RecordValidationException, KIP-467): ``record_errors`` holds (index of the record among
    those appended, why) for each, in order; the message sums them up."""

    # How many of them the summary names.
    SUMMARY_LIMIT = 3

    def __init__(self, code: ErrorCode, record_errors: list[tuple[int, str]]) -> None:
        named = "; ".join(f"record {index}: {why}"
                          for index, why in record_errors[:self.SUMMARY_LIMIT])
        more = len(record_errors) - self.SUMMARY_LIMIT
        super().__init__(code, f"{len(record_errors)} record(s) rejected, so the batch was: "
                               f"{named}" + (f"; and {more} more" if more > 0 else ""))
        self.record_errors = record_errors


class NotEnoughReplicasError(KafkaError):
    """An acks=all write to a partition whose ISR is smaller than the topic's
    min.insync.replicas, with Kafka's message: refused before it is stored
    (NOT_ENOUGH_REPLICAS), or stored but not acknowledged (NOT_ENOUGH_REPLICAS_AFTER_APPEND)."""

    def __init__(self, isr: Sequence[int], required: int, topic: str, partition: int,
                 code: ErrorCode = ErrorCode.not_enough_replicas) -> None:
        super().__init__(code, f"The size of the current ISR {list(isr)} is insufficient to "
                               f"satisfy the min.isr requirement of {required} for partition "
                               f"{topic}-{partition}")


def error_name(code: int) -> str:
    """The Kafka name of an error code (e.g. 3 -> UNKNOWN_TOPIC_OR_PARTITION)."""
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"UNKNOWN_ERROR_{code}"
