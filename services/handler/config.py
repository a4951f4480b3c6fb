"""The handler's settings, read once at start-up from flags and ``KBROKER_*`` variables."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import option
from services.common.tls import CA_HELP, CERT_HELP, KEY_HELP


@dataclass(frozen=True, slots=True)
class HandlerConfig:
    """Settings of one handler instance."""

    grpc_address: str = option("127.0.0.1:19100", "host:port the KafkaHandler gRPC service binds")
    internal_tls_ca: str = option("", CA_HELP)
    internal_tls_cert: str = option("", CERT_HELP)
    internal_tls_key: str = option("", KEY_HELP)
    metrics_port: int = option(0, "Prometheus HTTP port (0: disabled)")
    replicator_address: str = option("127.0.0.1:19400", "host:port of the replicator")
    purgatory_address: str = option("127.0.0.1:19300", "host:port of the purgatory")
    acks_all_leader_wait_ms: int = option(
        100, "how long a partition leader may hold the answer to an acks=all append (or to a "
        "transaction marker, or a group or transaction coordinator's write) for its high "
        "watermark to pass the records, so that the write needs no wait in the purgatory (0: "
        "answer at once; what is not committed within it waits in the purgatory)")
    auto_create_topics_enable: bool = option(
        True, "create unknown topics asked for in Metadata requests (auto.create.topics.enable)"
    )
    advertised: str = option(
        "127.0.0.1:9092",
        "host:port brokers are advertised at when a request carries no kafka-advertised metadata",
    )
    broker_ports: int = option(
        1,
        "with no kafka-broker-ports metadata: broker N is advertised at the advertised port + N "
        "for N below this (a frontend port per broker id), else at the advertised port",
    )
    instance: str = option("handler-0", "this instance's name (metrics, logs)")
    offsets_topic_num_partitions: int = option(
        50, "partitions of __consumer_offsets when it is created (offsets.topic.num.partitions)")
    offsets_topic_replication_factor: int = option(
        3, "replication factor of __consumer_offsets, at most the live log nodes "
        "(offsets.topic.replication.factor)")
    offsets_topic_segment_bytes: int = option(
        104857600, "segment.bytes of __consumer_offsets (offsets.topic.segment.bytes)")
    offset_metadata_max_bytes: int = option(
        4096, "longest metadata string of a committed offset (offset.metadata.max.bytes)")
    group_initial_rebalance_delay_ms: int = option(
        3000, "how long a new group waits for more members before its first rebalance ends "
        "(group.initial.rebalance.delay.ms)")
    group_min_session_timeout_ms: int = option(
        6000, "shortest session timeout a member may ask for (group.min.session.timeout.ms)")
    group_max_session_timeout_ms: int = option(
        1800000, "longest session timeout a member may ask for (group.max.session.timeout.ms)")
    group_max_size: int = option(
        2147483647, "most members a group may have (group.max.size)")
    group_consumer_session_timeout_ms: int = option(
        45000, "session timeout of consumer group members (KIP-848; "
        "group.consumer.session.timeout.ms)")
    group_consumer_min_session_timeout_ms: int = option(
        45000, "lowest group.consumer.session.timeout.ms allowed "
        "(group.consumer.min.session.timeout.ms)")
    group_consumer_max_session_timeout_ms: int = option(
        60000, "highest group.consumer.session.timeout.ms allowed "
        "(group.consumer.max.session.timeout.ms)")
    group_consumer_heartbeat_interval_ms: int = option(
        5000, "how often consumer group members heartbeat "
        "(group.consumer.heartbeat.interval.ms)")
    group_consumer_min_heartbeat_interval_ms: int = option(
        5000, "lowest group.consumer.heartbeat.interval.ms allowed "
        "(group.consumer.min.heartbeat.interval.ms)")
    group_consumer_max_heartbeat_interval_ms: int = option(
        15000, "highest group.consumer.heartbeat.interval.ms allowed "
        "(group.consumer.max.heartbeat.interval.ms)")
    group_consumer_max_size: int = option(
        2147483647, "most members a consumer group may have (group.consumer.max.size)")
    group_consumer_assignors: tuple[str, ...] = option(
        ("uniform", "range"), "server-side assignors consumer groups may ask for "
        "(group.consumer.assignors; the first is the default)")
    group_consumer_migration_policy: str = option(
        "bidirectional", "conversions between classic and consumer groups: disabled, upgrade, "
        "downgrade or bidirectional (group.consumer.migration.policy)")
    transaction_state_log_num_partitions: int = option(
        50, "partitions of __transaction_state when it is created "
        "(transaction.state.log.num.partitions)")
    transaction_state_log_replication_factor: int = option(
        3, "replication factor of __transaction_state, at most the live log nodes "
        "(transaction.state.log.replication.factor)")
    transaction_state_log_segment_bytes: int = option(
        104857600, "segment.bytes of __transaction_state (transaction.state.log.segment.bytes)")
    transaction_max_timeout_ms: int = option(
        900000, "longest transaction timeout a producer may ask for (transaction.max.timeout.ms)")
    transactional_id_expiration_ms: int = option(
        604800000, "how long a transactional id may stay idle before it is forgotten "
        "(transactional.id.expiration.ms)")
    transaction_marker_takeover_ms: int = option(
        10000, "how long a prepared transaction may go without word from the handler writing "
        "its markers before another handler takes over and finishes it")
    authorizer_enabled: bool = option(
        False, "authorize every request by the cluster's ACLs (authorizer.class.name set); "
        "off: everything is allowed, as on a broker without an authorizer")
    super_users: str = option(
        "", "principals allowed everything, separated by ';' (super.users), e.g. "
        "User:admin;User:ops")
    allow_everyone_if_no_acl_found: bool = option(
        False, "allow an operation on a resource no ACL applies to "
        "(allow.everyone.if.no.acl.found)")
    frontend_identities: tuple[str, ...] = option(
        ("kbroker-frontend",), "certificate common names (comma-separated) of callers whose "
        "kafka-principal metadata is trusted; plaintext callers are trusted only from loopback")
    client_telemetry_metrics: str = option(
        "", "client metrics (KIP-714) every client is asked to push: comma separated name "
        "prefixes, e.g. org.apache.kafka.producer.,org.apache.kafka.consumer.; * for all; "
        "empty for none (a client-metrics resource's metrics)")
    client_telemetry_push_interval_ms: int = option(
        300000, "how often clients push their metrics (a client-metrics resource's "
        "interval.ms)")
    client_telemetry_max_bytes: int = option(
        1048576, "largest metrics push accepted, compressed or not (telemetry.max.bytes)")
    client_telemetry_max_series: int = option(
        10000, "most pushed client metric series a handler keeps and exposes; points of new "
        "series beyond it are dropped")
