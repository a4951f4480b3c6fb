"""The coordinator runtime (see :mod:`.runtime`): ``placement`` (keys onto partitions of an
internal compacted topic, created on first need, and who coordinates them), ``partition`` (a
partition's state, loaded from its records and changed by conditional appends), ``runtime``
(the read-compute-conditional-append loop, purgatory waits and timers) and ``schema`` (record
formats declared as data, and their codec). Generic: its users bring the state and records."""
