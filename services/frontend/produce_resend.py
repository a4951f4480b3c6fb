"""Resending a Produce whose handler failed mid-request.

A handler that dies, or whose stream breaks, after it took a Produce leaves the request's
outcome unknown: its appends may have been stored, may still be on their way to the leaders,
or may never arrive. Answering an error then would let the client's next produce for a
partition overtake a late append (librdkafka, refused OUT_OF_ORDER_SEQUENCE_NUMBER for that
next one, bumps its producer epoch and renumbers records whose outcome it did not know:
duplicates), so such a Produce closes the client's connection.

One kind of Produce can be finished instead: one whose every record batch is idempotent
(magic 2, a producer id and a base sequence). The frontend sends it again to another handler.
Each leader recognises a batch it already stored among the producer's last five and answers it
with its original offsets, appends one it has not seen, and stores no late copy of either (it
is a duplicate, or its sequence was passed). When the resend succeeds on every partition, every
batch is stored exactly once, whichever copy got there first, and the answer is the one the
client would have had. When any partition of the resend fails, its first copy may still land
later, so the connection closes as before.
"""

from __future__ import annotations

from typing import Any

from services.common.records.record_batch import MAGIC, iter_batches

from . import converter


def all_idempotent(records: bytes | memoryview | None) -> bool:
    """Whether ``records`` (one partition's record batches, as a client sent them) is whole
    and every batch in it carries a producer id and sequence numbers. Reads the 61-byte header
    of each batch, nothing else."""
    end = 0
    for position, header in iter_batches(records or b""):
        if header.magic != MAGIC or header.producer_id < 0 or header.base_sequence < 0:
            return False
        end = position + header.size
    return 0 < end == len(records or b"")


class ProduceResend:
    """The ``retry_safe`` of one Produce for :meth:`HandlerPool.call`: consulted only after a
    handler failed mid-request, it allows the resend when every batch is idempotent, and
    remembers that it did (:attr:`resent`): the answer is then used only if no partition
    failed."""

    __slots__ = ("_body", "_names", "resent")

    def __init__(self, body: Any, names: tuple[str, ...]) -> None:
        self._body = body
        self._names = names
        self.resent = False

    def __call__(self) -> bool:
        self.resent = all(map(all_idempotent, converter.batches_of(self._body, self._names)))
        return self.resent
