"""The transaction coordinator, run by stateless handlers on the coordinator runtime (its
second user): ``metadata`` (a transactional id's transaction and the pure state machine),
``state`` (a ``__transaction_state`` partition's transactions, and their records), ``markers``
(writing COMMIT/ABORT markers to a transaction's partitions until every leader has them) and
``coordinator`` (placement on ``__transaction_state``, the operations, timers and the wiring)."""
