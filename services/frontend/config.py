"""Settings of the frontend: where it listens for Kafka clients and with which security, the
addresses it advertises to them, how clients authenticate (TLS, SASL), where its own gRPC port
(health, reflection, metrics), the handlers and the replicator are."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import option
from services.common.tls import CA_HELP, CERT_HELP, KEY_HELP


@dataclass(frozen=True, slots=True)
class FrontendConfig:
    """The Kafka wire-protocol frontend."""

    listen_host: str = option("127.0.0.1", "interface the Kafka listener binds")
    listen_port: int = option(9092, "Kafka listener port (0 picks a free one)")
    advertised_host: str = option("", "host clients are told to reach this frontend at "
                                      "(default: listen_host)")
    advertised_port: int = option(0, "port clients are told to reach this frontend at "
                                     "(default: the bound listen port)")
    broker_ports: int = option(
        1, "Kafka listener ports, one per broker id: broker N is served on listen_port + N and "
           "advertised at advertised_port + N (clients identify brokers by address)")
    inherited_listeners: tuple[str, ...] = option(
        (), "listening sockets handed down by the process that started the frontend, as "
            "port=fd entries (comma separated): a Kafka port listed here is served on that "
            "socket instead of being bound, so connections made while the frontend restarts "
            "wait in the socket's queue instead of being refused")
    grpc_address: str = option("127.0.0.1:19090", "host:port of the frontend's own gRPC port "
                                                  "(health, reflection, metrics)")
    internal_tls_ca: str = option("", CA_HELP)
    internal_tls_cert: str = option("", CERT_HELP)
    internal_tls_key: str = option("", KEY_HELP)
    metrics_port: int = option(0, "Prometheus HTTP port (0 = disabled)")
    handlers: tuple[str, ...] = option(("127.0.0.1:19100",),
                                       "comma-separated host:port of every handler")
    socket_request_max_bytes: int = option(104857600, "largest request frame accepted; a "
                                                      "larger one closes the connection")
    queued_max_request_bytes: int = option(
        -1, "bytes of requests the frontend holds at once, received or being processed "
            "(queued.max.request.bytes); when they are used up, connections stop being read "
            "until requests are answered; -1: no limit")
    max_incremental_fetch_session_cache_slots: int = option(
        1000, "fetch sessions (KIP-227) this frontend keeps "
              "(max.incremental.fetch.session.cache.slots); 0: consumers send full fetches")
    local_files: bool = option(
        True, "read Fetch answers' record batches from the segment files of log nodes on this "
              "host (same kernel and mount namespace) instead of receiving them through a "
              "handler, and leave large Produce requests' batches in spool files "
              "(records-spool-dir) for them to read")
    records_spool_dir: str = option(
        "/dev/shm", "directory (a tmpfs) of the spool files that large Produce requests' "
                    "batches are left in for log nodes on this host to read (with local-files); "
                    "empty: always carried through a handler")
    instance: str = option("frontend-0", "name of this frontend instance (kafka-frontend-id)")
    quota_window_num: int = option(11, "samples a client quota rate is measured over "
                                       "(quota.window.num)")
    quota_window_size_seconds: int = option(1, "length of each client quota sample "
                                               "(quota.window.size.seconds)")
    replicator_address: str = option(
        "", "host:port of the replicator, whose cluster metadata (SCRAM credentials) the "
            "frontend follows (empty: none; SCRAM users then come from sasl_users_file only)")

    # Listeners (Kafka's listeners and advertised.listeners).
    listeners: str = option(
        "", "comma-separated PROTOCOL://host:port (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL; "
            "the protocol names the listener), e.g. SASL_SSL://0.0.0.0:9093,PLAINTEXT://"
            "127.0.0.1:9092; empty: one PLAINTEXT listener on listen_host:listen_port")
    advertised_listeners: str = option(
        "", "PROTOCOL://host:port clients are told to reach each listener at (default: its "
            "bind host and bound port)")

    # TLS (Kafka's ssl.* settings; PEM files, reloaded when they change).
    ssl_certfile: str = option("", "PEM certificate chain of the SSL and SASL_SSL listeners")
    ssl_keyfile: str = option("", "PEM private key of ssl_certfile")
    ssl_cafile: str = option("", "PEM CA certificates client certificates are checked against")
    ssl_client_auth: str = option(
        "none", "client certificates (ssl.client.auth): none, requested or required")
    ssl_principal_mapping_rules: str = option(
        "DEFAULT", "how a client certificate's subject (RFC 2253) becomes a principal name "
                   "(ssl.principal.mapping.rules), e.g. RULE:^CN=(.*?),.*$/$1/,DEFAULT")

    # SASL.
    sasl_enabled_mechanisms: tuple[str, ...] = option(
        ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
        "SASL mechanisms offered (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER)")
    sasl_users_file: str = option(
        "", "file of SASL users, one user:password per line ('#' comments), for PLAIN and "
            "SCRAM; reread when it changes")
    sasl_oauthbearer_jwks: str = option(
        "", "JSON Web Key Set validating OAUTHBEARER tokens: a file path or an https URL")
    sasl_oauthbearer_jwks_refresh_ms: int = option(
        3600000, "how often the JWKS is fetched again (sasl.oauthbearer.jwks.endpoint.refresh.ms)")
    sasl_oauthbearer_expected_issuer: str = option("", "required iss claim (empty: any)")
    sasl_oauthbearer_expected_audience: str = option(
        "", "comma-separated audiences of which the aud claim must name one (empty: any)")
    sasl_oauthbearer_allow_unsecured: bool = option(
        False, "accept unsigned (alg none) OAUTHBEARER tokens: for tests only")
    sasl_oauthbearer_clock_skew_seconds: int = option(
        30, "leeway on exp and nbf (sasl.oauthbearer.clock.skew.seconds)")
    connections_max_reauth_ms: int = option(
        0, "longest SASL session before the client must re-authenticate (KIP-368; 0: none "
           "beyond a token's expiry)")
    connection_failed_authentication_delay_ms: int = option(
        100, "delay before answering a failed authentication and closing "
             "(connection.failed.authentication.delay.ms); doubles for repeated failures "
             "from one address, up to 5 s, and decays")
    authentication_timeout_ms: int = option(
        10000, "a client must finish the TLS handshake, and then SASL authentication, "
               "within this long or is disconnected")
