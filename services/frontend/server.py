"""The frontend process's servers: the Kafka listeners (TCP, TLS for SSL and SASL_SSL, one
:class:`Connection` per client) and the frontend's own gRPC port, which serves no API of its
own, only health, reflection and metrics."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
from collections.abc import Sequence

import grpc

from services.common.runtime import FreedMemoryRelease
from services.common.server import create_server
from services.common.tls import InternalTls

from .cluster_view import ClusterView
from .config import FrontendConfig
from .connection import Connection
from .dispatcher import Dispatcher, ListenerAddress
from .fetch_sessions import FetchSessions
from .handler_pool import HandlerPool
from .listeners import ListenerSpec, SecurityProtocol, listener_specs
from .memory_pool import MemoryPool
from .metrics import (
    CLOSED_CONNECTIONS,
    FAILED_AUTHENTICATIONS,
    SUCCESSFUL_AUTHENTICATIONS,
    register_fetch_sessions,
    register_memory_pool,
)
from .network_receive import FrameChannel
from .principal import ssl_principal
from .quotas import ClientQuotas
from .records_spool import RecordsSpool
from .sasl.authenticator import SaslAuthenticator, SaslAuthenticatorConfig
from .sasl.credentials import CredentialStore
from .sasl.failure_delays import FailedAuthenticationDelays
from .sasl.mechanism import SaslServer
from .sasl.oauthbearer import JwksSource, OAuthBearerSaslServer, TokenValidator
from .sasl.plain import PlainSaslServer
from .sasl.scram import ScramMechanism, ScramSaslServer
from .session import ClientSession
from .ssl_context import ReloadingSslContext
from .ssl_principal_mapper import NoMatchingRuleError, SslPrincipalMapper
from .tls_listener import TlsListener

log = logging.getLogger(__name__)

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


class SaslMechanisms:
    """Builds the server side of each enabled mechanism for a new exchange."""

    def __init__(self, config: FrontendConfig, credentials: CredentialStore) -> None:
        unknown = [m for m in config.sasl_enabled_mechanisms if m not in SASL_MECHANISMS]
        if unknown:
            raise ValueError(f"unsupported SASL mechanisms {', '.join(unknown)} (supported: "
                             f"{', '.join(SASL_MECHANISMS)})")
        self.enabled = tuple(config.sasl_enabled_mechanisms)
        self._credentials = credentials
        self._validator: TokenValidator | None = None
        if "OAUTHBEARER" in self.enabled:
            if not config.sasl_oauthbearer_jwks and not config.sasl_oauthbearer_allow_unsecured:
                raise ValueError("OAUTHBEARER needs sasl_oauthbearer_jwks (or, for tests, "
                                 "sasl_oauthbearer_allow_unsecured)")
            jwks = JwksSource(config.sasl_oauthbearer_jwks,
                              config.sasl_oauthbearer_jwks_refresh_ms) \
                if config.sasl_oauthbearer_jwks else None
            audience = tuple(a.strip() for a in
                             config.sasl_oauthbearer_expected_audience.split(",") if a.strip())
            self._validator = TokenValidator(
                jwks, config.sasl_oauthbearer_expected_issuer, audience,
                config.sasl_oauthbearer_allow_unsecured,
                config.sasl_oauthbearer_clock_skew_seconds)

    def server(self, mechanism: str) -> SaslServer:
        if mechanism == "PLAIN":
            return PlainSaslServer(self._credentials.check_password)
        if mechanism == "OAUTHBEARER":
            assert self._validator is not None
            return OAuthBearerSaslServer(self._validator)
        scram = ScramMechanism.named(mechanism)
        assert scram is not None, mechanism
        return ScramSaslServer(scram, self._credentials.scram_credential)


class FrontendService:
    """A running frontend: ``port`` is its gRPC port; ``kafka_port`` and ``advertised`` are
    those of its first listener, ``ports`` and ``advertised_listeners`` every listener's
    (broker 0's port; broker N listens on it + N)."""

    def __init__(self, config: FrontendConfig, pool: HandlerPool, grpc_server: grpc.aio.Server,
                 port: int, cluster_view: ClusterView) -> None:
        self.config = config
        self.port = port
        self.kafka_port = 0
        self.advertised = ""
        self.ports: dict[str, int] = {}
        self.advertised_listeners: dict[str, str] = {}
        self.cluster_view = cluster_view
        self.credentials = CredentialStore(config.sasl_users_file)
        self.ssl: ReloadingSslContext | None = None
        self._pool = pool
        self._grpc_server = grpc_server
        self._servers: list[asyncio.Server | TlsListener] = []
        self._dispatcher: Dispatcher | None = None
        self._sasl: dict[str, SaslAuthenticatorConfig] = {}
        self._mapper = SslPrincipalMapper(config.ssl_principal_mapping_rules)
        self._inherited = inherited_sockets(config.inherited_listeners)
        self._compiling: asyncio.Task[None] | None = None
        self._connections: dict[asyncio.Task[None], Connection] = {}
        self._freed_memory = FreedMemoryRelease()
        # Bytes of requests held, shared by every connection (queued.max.request.bytes).
        self.memory = MemoryPool(config.queued_max_request_bytes)
        register_memory_pool(self.memory)
        self._stopped = False
        # Client quotas: ``quotas.update(cluster_metadata.client_quotas)`` sets them.
        self.quotas = ClientQuotas(samples=config.quota_window_num,
                                   window_seconds=config.quota_window_size_seconds)

    async def _listen(self) -> None:
        """Bind every listener: its bootstrap port and one more per further broker id. Every
        port of a listener serves the same way; distinct ports exist because clients (older
        librdkafka among them) tell brokers apart by host:port, so each broker id needs an
        address of its own."""
        config = self.config
        specs = listener_specs(config.listeners, config.advertised_listeners,
                               config.listen_host, config.listen_port, config.advertised_host,
                               config.advertised_port)
        broker_ports = max(1, config.broker_ports)
        if any(s.protocol.uses_tls for s in specs):
            self.ssl = ReloadingSslContext(config.ssl_certfile, config.ssl_keyfile,
                                           config.ssl_cafile, config.ssl_client_auth)
        mechanisms = SaslMechanisms(config, self.credentials) \
            if any(s.protocol.uses_sasl for s in specs) else None
        self.cluster_view.add_listener(self.credentials.on_metadata)
        addresses: dict[str, ListenerAddress] = {}
        for spec in specs:
            if broker_ports > 1 and spec.bind.port == 0:
                raise ValueError(f"broker_ports > 1 needs an explicit port for listener "
                                 f"{spec.name}")
            first = await self._bind(spec, spec.bind.port)
            port = first.port if isinstance(first, TlsListener) \
                else first.sockets[0].getsockname()[1]
            self._servers.append(first)
            for offset in range(1, broker_ports):
                self._servers.append(await self._bind(spec, port + offset))
            self.ports[spec.name] = port
            self.advertised_listeners[spec.name] = spec.advertised(port)
            addresses[spec.name] = ListenerAddress(spec.advertised(port), port)
        first_spec = specs[0]
        self.kafka_port = self.ports[first_spec.name]
        self.advertised = self.advertised_listeners[first_spec.name]
        self._dispatcher = Dispatcher(
            self._pool, addresses, config.instance, broker_ports, self.quotas,
            FetchSessions(config.max_incremental_fetch_session_cache_slots),
            local_files=config.local_files)
        self.cluster_view.add_listener(self._dispatcher.affinity.on_metadata)
        register_fetch_sessions(self._dispatcher.fetch_sessions)
        if mechanisms is not None:
            delays = FailedAuthenticationDelays(config.connection_failed_authentication_delay_ms)
            for spec in specs:
                if spec.protocol.uses_sasl:
                    self._sasl[spec.name] = SaslAuthenticatorConfig(
                        spec.name, mechanisms.enabled, mechanisms.server, self._dispatcher,
                        delays, config.connections_max_reauth_ms,
                        config.authentication_timeout_ms / 1000)
        for server in self._servers:
            if isinstance(server, TlsListener):
                server.start_serving()
            else:
                await server.start_serving()
        # Serving first: a restarted frontend answers at once, the codecs follow.
        self._compiling = asyncio.get_running_loop().create_task(
            self._dispatcher.compile_schemas(), name="compile-schemas")
        for spec in specs:
            port = self.ports[spec.name]
            log.info("Kafka listener %s on %s:%d-%d, advertised as %s (+broker id)", spec.name,
                     spec.bind.host or "*", port, port + broker_ports - 1,
                     self.advertised_listeners[spec.name])
        log.info("handlers %s", ",".join(self._pool.addresses))

    async def _bind(self, spec: ListenerSpec, port: int) -> asyncio.Server | TlsListener:
        max_frame_bytes = self.config.socket_request_max_bytes
        on_connect = functools.partial(self._on_connect, spec)

        def factory() -> FrameChannel:
            return FrameChannel(max_frame_bytes, on_connect, self.memory)

        inherited = self._inherited.pop(port, None) if port else None
        if inherited is not None:
            if spec.protocol.uses_tls:
                assert self.ssl is not None
                inherited.setblocking(False)
                return TlsListener(inherited, self.ssl.current, factory,
                                   self.config.authentication_timeout_ms / 1000,
                                   FAILED_AUTHENTICATIONS.labels(spec.name, "SSL").inc)
            return await asyncio.get_running_loop().create_server(
                factory, sock=inherited, start_serving=False)
        if spec.protocol.uses_tls:
            assert self.ssl is not None
            return TlsListener.bind(
                spec.bind.host or None, port, self.ssl.current, factory,
                self.config.authentication_timeout_ms / 1000,
                FAILED_AUTHENTICATIONS.labels(spec.name, "SSL").inc)
        return await asyncio.get_running_loop().create_server(
            factory, spec.bind.host or None, port, reuse_address=True, start_serving=False)

    async def _on_connect(self, spec: ListenerSpec, channel: FrameChannel) -> None:
        assert self._dispatcher is not None
        peer = channel.extra_info("peername")
        local = channel.extra_info("sockname")
        session = ClientSession(spec.name, peer[0] if isinstance(peer, tuple) else "",
                                local[1] if isinstance(local, tuple) else 0)
        if spec.protocol is SecurityProtocol.SSL:
            try:
                session.principal = ssl_principal(channel.extra_info("ssl_object"),  # type: ignore[arg-type]
                                                  self._mapper)
            except NoMatchingRuleError as e:
                FAILED_AUTHENTICATIONS.labels(spec.name, "SSL").inc()
                CLOSED_CONNECTIONS.labels("authentication_failed").inc()
                log.info("closing TLS connection from %s: %s", peer, e)
                channel.close()
                return
            SUCCESSFUL_AUTHENTICATIONS.labels(spec.name, "SSL").inc()
        sasl_config = self._sasl.get(spec.name)
        sasl = SaslAuthenticator(sasl_config, channel, session.client_host) \
            if sasl_config is not None else None
        connection = Connection(channel, self._dispatcher, session, sasl)
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = connection
        try:
            await connection.serve()
        finally:
            self._connections.pop(task, None)
            # What the connection held goes back to the kernel, not only to the allocator.
            self._freed_memory.soon()

    async def stop(self, grace: float = 1.0) -> None:
        """Stop accepting; give requests in flight up to ``grace`` seconds, then close every
        connection, the handler channels and the gRPC port. Stopping twice is harmless."""
        if self._stopped:
            return
        self._stopped = True
        if self._compiling is not None:
            self._compiling.cancel()
        for server in self._servers:
            server.close()
        busy = []
        for task, connection in list(self._connections.items()):
            if connection.idle:
                task.cancel()
            else:
                connection.stop_after_current()
                busy.append(task)
        if busy:
            _, pending = await asyncio.wait(busy, timeout=grace)
            for task in pending:
                task.cancel()
        tasks = list(self._connections)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        self._freed_memory.cancel()
        await self.cluster_view.stop()
        await self._pool.close()
        await self._grpc_server.stop(grace)


def inherited_sockets(entries: Sequence[str]) -> dict[int, socket.socket]:
    """``["9092=3", ...]`` -> the listening socket of each port, from the inherited file
    descriptors. Raises ValueError for a malformed entry or a descriptor that is not a
    listening TCP socket."""
    sockets: dict[int, socket.socket] = {}
    for entry in entries:
        port, sep, fd = entry.strip().partition("=")
        if not sep or not port.isdigit() or not fd.isdigit():
            raise ValueError(f"inherited listener {entry!r} is not port=fd")
        try:
            sock = socket.socket(fileno=int(fd))
        except OSError as e:
            raise ValueError(f"inherited listener {entry!r}: {e.strerror or e}") from None
        if sock.type != socket.SOCK_STREAM or not sock.getsockopt(socket.SOL_SOCKET,
                                                                   socket.SO_ACCEPTCONN):
            raise ValueError(f"inherited listener {entry!r} is not a listening TCP socket")
        sockets[int(port)] = sock
    return sockets


def _records_spool(config: FrontendConfig) -> RecordsSpool | None:
    """The spool of large Produce requests' batches, if configured and usable."""
    directory = config.records_spool_dir
    if not (config.local_files and directory):
        return None
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK | os.X_OK):
        log.info("no spool for produced batches: %s is not a writable directory", directory)
        return None
    return RecordsSpool(directory)


async def start(config: FrontendConfig) -> FrontendService:
    """Start the frontend: its gRPC port, the cluster metadata follower, then the Kafka
    listeners."""
    tls = InternalTls.of(config)
    pool = HandlerPool(config.handlers, tls=tls, spool=_records_spool(config))
    await pool.start()
    try:
        grpc_server, port, _health = await create_server(
            "frontend", [], config.grpc_address, config.instance, tls=tls)
    except BaseException:
        await pool.close()
        raise
    view = ClusterView.of_replicator(config.replicator_address, tls)
    service = FrontendService(config, pool, grpc_server, port, view)
    view.add_listener(lambda metadata: service.quotas.update(metadata.client_quotas))
    try:
        await service._listen()
        view.start()
    except BaseException:
        await service.stop(0)
        raise
    return service
