"""The group coordinator of the classic consumer group protocol, run by stateless handlers:
``records`` (the ``__consumer_offsets`` formats), ``group`` (the state machine), ``state`` (a
partition's groups and offsets), ``store`` (reading and conditionally appending a partition)
and ``coordinator`` (the operations, waits and session timers)."""
