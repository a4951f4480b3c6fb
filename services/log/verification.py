"""Transaction verification on a partition leader (KIP-890 part 1; Kafka's
``VerificationGuard`` and ``VerificationStateEntry``): a transactional batch that would start
its producer's transaction on the partition is stored only once the transaction coordinator
confirmed that the partition is in the producer's ongoing transaction. This keeps a late
write (a retry after the transaction ended) from opening a transaction nobody will ever end.

Kafka's broker asks its coordinator between two steps of one append; here the coordinator is
in a handler, so the check is split over two appends with a guard:

1. An append of such a batch without the right guard stores nothing and fails with
   INVALID_TXN_STATE carrying a guard (:class:`VerificationRequiredError`): a random non-zero int64
   the partition now remembers for the producer (the same one while it stands).
2. The handler checks with the coordinator and sends the append again with that guard; the
   partition stores it only if the guard is still the producer's.

Any marker for the producer, or any transactional batch of it stored, voids its guard, so a
confirmation that raced with the end of the transaction cannot open a new one (the ABA problem
Kafka's unique guard solves). Guards live in memory only: after a restart or a leader change
an append simply gets a new one. They expire with ``producer.id.expiration.ms``.

While a guard stands, the state also keeps the lowest sequence seen from the producer, so that
a verified batch cannot be stored ahead of a lower one still being verified (out of order).

Not thread-safe: used by the producer state under the partition's append lock.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from services.common.errors import ErrorCode, KafkaError

# The guard of no verification (Kafka's VerificationGuard.SENTINEL).
NO_GUARD = 0


def new_guard() -> int:
    """A random non-zero int64."""
    while True:
        guard = secrets.randbits(64) - 2**63
        if guard != NO_GUARD:
            return guard


class VerificationRequiredError(KafkaError):
    """INVALID_TXN_STATE for a transactional batch that needs the coordinator's word first;
    ``guard`` is the one to send the append again with."""

    def __init__(self, producer_id: int, guard: int) -> None:
        super().__init__(ErrorCode.invalid_txn_state,
                         f"producer {producer_id} has no ongoing transaction on this partition: "
                         "verify it with the transaction coordinator and send again with the "
                         "verification guard")
        self.producer_id = producer_id
        self.guard = guard


@dataclass(slots=True)
class VerificationState:
    """A producer's standing guard (Kafka's ``VerificationStateEntry``)."""

    guard: int
    # When it was handed out (it expires like an idle producer).
    timestamp: int
    # The lowest base sequence seen from the producer at ``epoch`` while verifying.
    lowest_sequence: int
    epoch: int

    def note(self, sequence: int, epoch: int) -> None:
        """Another batch needs verification: a lower sequence of the same epoch, or any
        sequence of a newer epoch, becomes the lowest (Kafka's
        ``maybeUpdateLowestSequenceAndEpoch``)."""
        if epoch == self.epoch and sequence < self.lowest_sequence:
            self.lowest_sequence = sequence
        if epoch > self.epoch:
            self.epoch, self.lowest_sequence = epoch, sequence

    def verifies(self, guard: int) -> bool:
        return guard != NO_GUARD and guard == self.guard
