"""The replicator service: cluster metadata (Kafka's controller role) - topics, their partitions'
replica assignments, leaders and ISRs, and log node liveness - served to handlers over gRPC,
and the replication role (:mod:`.replication`).

Domain modules: ``metadata`` (the immutable image), ``controller`` (the commit core and its
control managers), ``metadata_store`` and ``metadata_log`` (the image's durable copy),
``topic_rules`` and ``assignment`` (valid topics, replica placement), ``log_nodes`` (what the
replicator asks of log nodes), ``publisher`` (change notification), ``leadership`` (the
Lease); ``servicer``, ``server`` and ``grpc_log_nodes`` are the gRPC glue.
"""
