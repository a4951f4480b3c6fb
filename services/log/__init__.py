"""The log node (Kafka's ``UnifiedLog``/``LogSegment``): partition replicas on local disk.

Domain modules, which know nothing of gRPC: ``log_validator`` (checks of appended batches,
offset assignment; the batch format itself is :mod:`services.common.records`), ``index_file``,
``offset_index`` and ``time_index`` (a segment's indexes), ``segment`` (a log file and its
indexes), ``partition_log`` (one replica: segments, offsets, appends and reads), with
``producer_state``, ``leader_epochs``, ``replica_state`` and ``checkpoint`` beside it,
``cleaner`` and ``segment_swap`` (compaction), ``log_manager`` (every replica under the data
directory), ``partition_metadata`` and ``topic_config``. gRPC glue: ``servicer``,
``purgatory_notifier``, ``server`` and ``__main__``.
"""
