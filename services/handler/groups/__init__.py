"""The group coordinator of the classic consumer group protocol, run by stateless handlers on
the coordinator runtime: ``group`` (the pure state machine), ``state`` (a partition's groups
and offsets, and their records), ``membership`` (join, sync, heartbeat, leave, deadlines,
session expiry), ``offsets`` (commit, fetch, delete), ``sessions`` (their purgatory timers)
and ``coordinator`` (placement on ``__consumer_offsets``, groups as a whole, the wiring)."""
