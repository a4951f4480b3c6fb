"""The replication control role of the replicator (the controller's side of Kafka's
replication: LeaderAndIsr propagation, AlterPartition handling, dynamic replication configs).
Record bytes never pass through it: followers' log nodes fetch from their leaders' log nodes,
and each leader moves its own high watermark (see :mod:`services.log.replica_manager`).

- :mod:`.settings`: what each log node needs to replicate (the replica.* settings, its
  replication throttle rates, the log nodes' addresses).
- :mod:`.isr_changes`: one control stream per live log node, on which its leaders ask for ISR
  changes; each is committed (or refused) through the controller and answered with the
  partition's new state.
- :mod:`.manager`: follows the cluster metadata, gives every replica its state (leader or
  follower, epochs, replicas, ISR) and every node its settings, runs the control streams.
- :mod:`.progress`: fails the acks=all waits of a leader epoch that ended with its leader.

What the role asks of log nodes is :mod:`services.replicator.log_nodes`.
"""
