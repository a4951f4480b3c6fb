"""The log node (Kafka's ``UnifiedLog``/``LogSegment``): partition replicas on local disk.

Domain modules, which know nothing of gRPC: ``log_validator`` (checks of appended batches,
offset assignment; the batch format itself is :mod:`services.common.records`),
``offset_index`` (sparse index files), ``segment`` (a log file and its index),
``partition_log`` (one replica's segments and offsets), ``log_manager`` (every replica under the
data directory), ``partition_metadata`` and ``topic_config``. gRPC glue: ``servicer``,
``purgatory_notifier``, ``server`` and ``__main__``.
"""
