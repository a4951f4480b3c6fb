"""The log node (Kafka's ``UnifiedLog``/``LogSegment``): partition replicas on local disk.

Domain modules, which know nothing of gRPC: ``log_validator`` (checks of appended batches,
offset assignment; the batch format itself is :mod:`services.common.records`), ``index_file``,
``offset_index``, ``time_index`` and ``transaction_index`` (a segment's indexes), ``segment``
(a log file and its indexes), ``partition_log`` (one replica: segments, offsets, appends,
transaction markers and reads), with ``producer_state`` (idempotent and transactional
producers, the last stable offset), ``verification`` (transaction verification guards),
``leader_epochs``, ``replica_state`` and ``checkpoint`` beside it, ``cleaner``,
``cleaned_transactions`` and ``segment_swap`` (compaction), ``log_manager`` (every replica
under the data directory), ``partition_metadata`` and ``topic_config``. gRPC glue:
``servicer``, ``purgatory_notifier``, ``server`` and ``__main__``.
"""
