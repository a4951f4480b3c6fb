"""Settings of the replicator service."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import option
from services.common.tls import CA_HELP, CERT_HELP, KEY_HELP


@dataclass(frozen=True, slots=True)
class ReplicatorConfig:
    """The replicator: cluster metadata (the controller role) for the log nodes."""

    grpc_address: str = option("127.0.0.1:19400", "host:port of the Replicator gRPC service")
    internal_tls_ca: str = option("", CA_HELP)
    internal_tls_cert: str = option("", CERT_HELP)
    internal_tls_key: str = option("", KEY_HELP)
    metrics_port: int = option(0, "Prometheus HTTP port (0: disabled)")
    instance: str = option("replicator-0", "this instance's name (metrics snapshots, logs)")
    data_dir: str = option(
        "data/replicator", "directory of metadata.json (--metadata-store file)")
    metadata_store: str = option(
        "log", "where the cluster metadata lives: log (a replicated metadata log, partition "
        "__cluster_metadata-0 on every log node) or file (metadata.json in the data dir)")
    metadata_log_start_timeout_ms: int = option(
        60000, "how long start-up waits (retrying with backoff) for a majority of the log "
        "nodes to answer for the metadata log")
    log_nodes: tuple[str, ...] = option(
        ("0=127.0.0.1:19200",), "log nodes as node_id=host:port entries, comma separated"
    )
    initial_acls_file: str = option(
        "", "JSON list of ACL bindings stored when a new cluster is created, each "
        '{"resource_type": "TOPIC", "resource_name": "orders", "pattern_type": "LITERAL", '
        '"principal": "User:alice", "host": "*", "operation": "WRITE", "permission": "ALLOW"} '
        "(empty: none; ignored once the cluster exists)")
    num_partitions: int = option(1, "partitions of a new topic that asks for the default")
    default_replication_factor: int = option(
        1, "replication factor of a new topic that asks for the default"
    )
    cluster_id: str = option("", "cluster id (empty: generate one once and persist it)")
    node_check_interval_ms: int = option(1000, "how often each log node's health is checked")
    node_session_timeout_ms: int = option(
        3000, "a log node failing its health checks this long is fenced: the partitions it led "
        "get new leaders from their ISR (Kafka's broker.session.timeout.ms)")
    unclean_leader_election_enable: bool = option(
        False, "unclean.leader.election.enable: elect a replica outside the ISR when none in "
        "it is left (records may be lost)")
    auto_leader_rebalance_enable: bool = option(
        True, "auto.leader.rebalance.enable: give partitions back to their preferred (first) "
        "replica once it is in sync again")
    leader_imbalance_check_interval_ms: int = option(
        300000, "leader.imbalance.check.interval.ms: how often preferred leaders are elected")
    purgatory_address: str = option(
        "", "host:port of the purgatory to tell about high watermark moves (empty: only the "
        "leaders tell it)")
    replica_lag_time_max_ms: int = option(
        30000, "replica.lag.time.max.ms: a follower not caught up for this long leaves the ISR")
    replica_fetch_wait_max_ms: int = option(
        500, "replica.fetch.wait.max.ms: how long a follower fetch waits on the leader for data")
    replica_fetch_max_bytes: int = option(
        1048576, "replica.fetch.max.bytes: bytes per partition a follower fetch asks for")
    replica_fetch_response_max_bytes: int = option(
        10485760, "replica.fetch.response.max.bytes: bytes a follower fetch asks for in all")
    replica_fetch_backoff_ms: int = option(
        200, "replica.fetch.backoff.ms: pause after a failed follower fetch")
    leader_election_lease: str = option(
        "", "name of the coordination.k8s.io Lease that elects the active replicator among "
        "replicas (empty: no election, this is the only replicator)")
    leader_election_namespace: str = option(
        "", "namespace of the Lease (empty: the pod's namespace, else default)")
    leader_election_identity: str = option(
        "", "this replicator's name in the Lease, unique among replicas (empty: the pod "
        "name, i.e. the host name)")
    leader_election_lease_duration_ms: int = option(
        15000, "how long a standby waits on a Lease that stopped being renewed before taking "
        "it over")
    leader_election_renew_deadline_ms: int = option(
        10000, "the active replicator stops if it could not renew the Lease for this long "
        "(less than the lease duration)")
    leader_election_retry_period_ms: int = option(
        2000, "how often the Lease is renewed by the active replicator and tried by standbys")
