"""The replicator service: cluster metadata (Kafka's controller role) - topics, their partitions'
replica assignments, leaders and ISRs, and log node liveness - served to handlers over gRPC.

Domain modules: ``metadata`` (the immutable metadata image), ``metadata_store`` (its durable
copy: the store interface and the JSON file), ``metadata_log`` (the default store, a replicated
metadata log on the log nodes), ``topic_rules`` (what a valid topic is), ``assignment``
(replica placement), ``log_nodes`` (talking to log nodes), ``publisher`` (change notification)
and ``controller`` (the operations); ``servicer``/``server`` are the gRPC glue.
"""
