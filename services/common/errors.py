"""Kafka error codes, in one place.

The codes are Kafka's own (kio's ``ErrorCode`` table, generated from the Java client's
``Errors``). Domain code raises :class:`KafkaError` with a code; the gRPC glue turns it into the
error field of the answer.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = ["ErrorCode", "KafkaError", "error_name"]


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


def error_name(code: int) -> str:
    """The Kafka name of an error code (e.g. 3 -> UNKNOWN_TOPIC_OR_PARTITION)."""
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"UNKNOWN_ERROR_{code}"
