"""The replication role of the replicator (Kafka's ReplicaFetcherManager, the leader's
follower bookkeeping in ``Partition``, and the controller's ISR handling), run from one place:

- :mod:`.partition_state`: per partition, each follower's log end offset and when it was last
  caught up, the high watermark (min log end offset over the ISR), and which followers should
  leave or join the ISR. Pure domain: no I/O.
- :mod:`.fetcher`: one fetch loop per leader node, copying its new batches to the followers
  of the partitions it leads (one long-poll read on the leader, follower appends).
- :mod:`.high_watermarks`: coalescing pushes of high watermarks to leader log nodes, whose
  progress reports then complete the purgatory's acks=all produces.
- :mod:`.manager`: follows the cluster metadata, gives every replica its state (leader or
  follower, epoch), runs the fetchers and the ISR checks, and commits ISR changes through the
  controller.

What the role asks of log nodes is :mod:`services.replicator.log_nodes`.
"""
