"""SASL on a connection (Kafka's SaslServerAuthenticator and the re-authentication part of
its SocketServer, KIP-152 and KIP-368).

Before a client on a SASL listener is authenticated, the frontend reads its frames here, not
in the request loop:

    [ApiVersions]  SaslHandshake(mechanism)  (SaslAuthenticate(token))+     handshake v1
    [ApiVersions]  SaslHandshake(mechanism)  (size-prefixed raw token)+     handshake v0

and answers as Kafka does:

- ApiVersions (once, before the handshake) is answered in full;
- any other request before the handshake, or a frame that is not a request, closes the
  connection without an answer;
- a mechanism not enabled: UNSUPPORTED_SASL_MECHANISM with the enabled ones, then close;
- after a v1 handshake, a request other than SaslAuthenticate gets its API's answer with
  ILLEGAL_SASL_STATE, then the connection closes;
- a failed exchange: SASL_AUTHENTICATION_FAILED with a message (the mechanism's own, or
  "Authentication failed during authentication due to invalid credentials with SASL
  mechanism M"), then close; after a v0 handshake the connection just closes.

Every failure is answered and closed only after the failed-authentication delay
(:mod:`.failure_delays`). A client that is not authenticated ``authentication_timeout_ms``
after its connection was set up is disconnected.

Session lifetime (KIP-368): a completed SaslAuthenticate v1+ tells the client how long its
session lasts: ``connections_max_reauth_ms``, or less if its credential (an OAUTHBEARER
token) expires sooner; 0 when neither limits it. Before that, the client sends SaslHandshake
again on the open connection and runs the exchange anew, with the same mechanism and ending
with the same principal (else the connection closes); at most once a second. A request other
than that SaslHandshake once the session has expired closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import Callable
from typing import Any, NoReturn

from kio.schema.errors import ErrorCode

from kbroker.kafka.v1 import kafka_pb2

from .. import headers
from ..api_versions import API_VERSIONS_KEY, SUPPORTED_APIS
from ..dispatcher import Dispatcher, Request, UnanswerableRequestError
from ..metrics import (
    FAILED_AUTHENTICATIONS,
    FAILED_REAUTHENTICATIONS,
    SUCCESSFUL_AUTHENTICATIONS,
    SUCCESSFUL_REAUTHENTICATIONS,
)
from ..network_receive import FrameChannel
from ..principal import user
from .failure_delays import FailedAuthenticationDelays
from .mechanism import SaslAuthenticationError, SaslError, SaslServer

log = logging.getLogger(__name__)

SASL_HANDSHAKE_KEY = 17
SASL_AUTHENTICATE_KEY = 36
_MIN_REAUTH_INTERVAL_SECONDS = 1.0

SaslServerFactory = Callable[[str], SaslServer]


class AuthenticationFailedError(Exception):
    """The connection must close: authentication failed (already answered if due)."""

    def __init__(self, reason: str, *, kind: str = "authentication_failed") -> None:
        super().__init__(reason)
        self.kind = kind


class SaslAuthenticatorConfig:
    """What every SASL connection of one listener shares."""

    def __init__(self, listener: str, mechanisms: tuple[str, ...],
                 server_factory: SaslServerFactory, dispatcher: Dispatcher,
                 delays: FailedAuthenticationDelays, max_reauth_ms: int,
                 timeout_seconds: float) -> None:
        self.listener = listener
        self.mechanisms = list(mechanisms)
        self.server_factory = server_factory
        self.dispatcher = dispatcher
        self.delays = delays
        self.max_reauth_ms = max_reauth_ms
        self.timeout_seconds = timeout_seconds


class SaslAuthenticator:
    """The SASL state of one connection."""

    def __init__(self, config: SaslAuthenticatorConfig, channel: FrameChannel,
                 client_host: str) -> None:
        self._config = config
        self._channel = channel
        self._client_host = client_host
        self.mechanism: str | None = None
        self.principal: str | None = None
        # time.monotonic() when the session expires (None: never).
        self.session_expiry: float | None = None
        self._last_reauth_start = 0.0

    # -- the request loop's questions ------------------------------------------------------

    def starts_reauthentication(self, frame: bytes | memoryview, now: float) -> bool:
        """Whether ``frame`` (read after authentication) begins a re-authentication: a
        SaslHandshake on a session that expires, at most once a second."""
        if self.session_expiry is None or len(frame) < 2:
            return False
        if int.from_bytes(frame[:2], "big") != SASL_HANDSHAKE_KEY:
            return False
        return not (self._last_reauth_start
                    and now - self._last_reauth_start < _MIN_REAUTH_INTERVAL_SECONDS)

    def expired(self, now: float) -> bool:
        return self.session_expiry is not None and now > self.session_expiry

    # -- authentication --------------------------------------------------------------------

    async def authenticate(self) -> str:
        """Run the exchange from the connection's first frame; the principal, or raise
        :class:`AuthenticationFailedError` (the connection must close)."""
        deadline = time.monotonic() + self._config.timeout_seconds
        return await self._exchange(deadline, first=None)

    async def reauthenticate(self, handshake: bytes | memoryview) -> None:
        """Re-authenticate, starting with the SaslHandshake ``handshake``; raises
        :class:`AuthenticationFailedError` if it fails."""
        now = time.monotonic()
        self._last_reauth_start = now
        await self._exchange(now + self._config.timeout_seconds, first=handshake)

    async def _exchange(self, deadline: float, first: bytes | memoryview | None) -> str:
        reauthenticating = first is not None
        previous_mechanism = self.mechanism
        mechanism = previous_mechanism or ""
        try:
            mechanism, server, raw = await self._handshake(deadline, first)
            if reauthenticating and mechanism != previous_mechanism:
                # Kafka answers the handshake, then fails the first token.
                await self._read(deadline)
                raise SaslAuthenticationError(
                    f"SASL mechanism '{mechanism}' requested by client is not supported for "
                    f"re-authentication of mechanism '{previous_mechanism}'")
            principal = await self._tokens(deadline, server, raw, reauthenticating)
        except AuthenticationFailedError as e:
            # A client that leaves (a TCP probe, say) did not fail to authenticate.
            if e.kind != "closed_by_client":
                self._count_failure(mechanism, reauthenticating)
            raise
        self.mechanism, self.principal = mechanism, principal
        (SUCCESSFUL_REAUTHENTICATIONS if reauthenticating else SUCCESSFUL_AUTHENTICATIONS
         ).labels(self._config.listener, mechanism).inc()
        log.debug("%s %s as %s on %s", self._client_host,
                  "re-authenticated" if reauthenticating else "authenticated", principal,
                  self._config.listener)
        return principal

    def _count_failure(self, mechanism: str, reauthenticating: bool) -> None:
        (FAILED_REAUTHENTICATIONS if reauthenticating else FAILED_AUTHENTICATIONS
         ).labels(self._config.listener, mechanism or "none").inc()

    async def _read(self, deadline: float) -> bytes | memoryview:
        remaining = deadline - time.monotonic()
        try:
            read = await asyncio.wait_for(self._channel.read_frame(), max(remaining, 0))
        except TimeoutError:
            raise AuthenticationFailedError(
                f"not authenticated within {self._config.timeout_seconds:g} s",
                kind="authentication_timeout") from None
        if read is None:
            raise AuthenticationFailedError("client closed the connection during "
                                            "authentication", kind="closed_by_client")
        return read[0]

    async def _send(self, chunks: list[Any]) -> None:
        self._channel.write(chunks)
        await self._channel.drain()

    async def _fail(self, reason: str, answer: list[Any] | None = None) -> NoReturn:
        """Wait the failed-authentication delay, send ``answer`` if any, and raise."""
        delay = self._config.delays.failed(self._client_host)
        if delay:
            await asyncio.sleep(delay)
        if answer is not None:
            with contextlib.suppress(ConnectionError):
                await self._send(answer)
        raise AuthenticationFailedError(reason)

    async def _handshake(self, deadline: float, first: bytes | memoryview | None
                         ) -> tuple[str, SaslServer, bool]:
        """Up to and including SaslHandshake: (mechanism, its server, raw tokens?)."""
        dispatcher = self._config.dispatcher
        versions_seen = first is not None  # no ApiVersions during re-authentication
        frame = first
        while True:
            if frame is None:
                frame = await self._read(deadline)
            try:
                api_key, _, _ = headers.peek(frame)
            except struct.error:
                await self._fail("frame too short for a request header")
            if api_key == API_VERSIONS_KEY and not versions_seen:
                request = self._decode(frame)
                await self._send(dispatcher.answer_api_versions(request))
                # A version too new is answered with the ranges and may be asked again.
                versions_seen = request.schema is not None
                frame = None
                continue
            if api_key != SASL_HANDSHAKE_KEY:
                name = SUPPORTED_APIS[api_key].name if api_key in SUPPORTED_APIS \
                    else f"key {api_key}"
                await self._fail(f"Unexpected Kafka request of type {name} during SASL "
                                 f"handshake.")
            request = self._decode(frame)
            mechanism = request.body.mechanism
            answer = kafka_pb2.SaslHandshakeResponse(mechanisms=self._config.mechanisms)
            if mechanism not in self._config.mechanisms:
                answer.error_code = int(ErrorCode.unsupported_sasl_mechanism)
                await self._fail(f"Unsupported SASL mechanism {mechanism}",
                                 dispatcher.encode(request, answer))
            answer.error_code = 0
            await self._send(dispatcher.encode(request, answer))
            return mechanism, self._config.server_factory(mechanism), request.version == 0

    def _decode(self, frame: bytes | memoryview) -> Request:
        try:
            return self._config.dispatcher.decode(frame)
        except UnanswerableRequestError as e:
            raise AuthenticationFailedError(str(e), kind="malformed") from None

    async def _tokens(self, deadline: float, server: SaslServer, raw: bool,
                      reauthenticating: bool) -> str:
        """The token exchange after the handshake, until ``server`` completes."""
        what = "re-authentication" if reauthenticating else "authentication"
        generic = (f"Authentication failed during {what} due to invalid credentials with "
                   f"SASL mechanism {server.mechanism}")
        while True:
            frame = await self._read(deadline)
            if raw:
                try:
                    challenge = await server.evaluate(bytes(frame))
                    principal = self._completed(server, reauthenticating)
                except SaslError as e:
                    log.info("SASL %s from %s failed: %s", what, self._client_host, e)
                    await self._fail(str(e))
                if principal is not None:
                    self._start_session(server)
                await self._send([struct.pack(">i", len(challenge)), challenge])
                if principal is not None:
                    return principal
                continue
            request = await self._authenticate_request(frame)
            answer = kafka_pb2.SaslAuthenticateResponse(error_code=0)
            try:
                challenge = await server.evaluate(bytes(request.body.auth_bytes))
                principal = self._completed(server, reauthenticating)
            except SaslAuthenticationError as e:
                log.info("SASL %s from %s failed: %s", what, self._client_host, e)
                answer.error_code = int(ErrorCode.sasl_authentication_failed)
                answer.error_message = str(e)
                await self._fail(str(e), self._config.dispatcher.encode(request, answer))
            except SaslError as e:
                log.info("SASL %s from %s failed: %s", what, self._client_host, e)
                answer.error_code = int(ErrorCode.sasl_authentication_failed)
                answer.error_message = generic
                await self._fail(str(e), self._config.dispatcher.encode(request, answer))
            answer.auth_bytes = challenge
            if principal is not None:
                answer.session_lifetime_ms = self._start_session(server)
            await self._send(self._config.dispatcher.encode(request, answer))
            if principal is not None:
                return principal

    async def _authenticate_request(self, frame: bytes | memoryview) -> Request:
        try:
            api_key, _, _ = headers.peek(frame)
        except struct.error:
            await self._fail("frame too short for a request header")
        if api_key != SASL_AUTHENTICATE_KEY:
            request = self._decode(frame)
            await self._fail(
                f"Unexpected Kafka request of type {request.api.name} during SASL "
                f"authentication.",
                self._config.dispatcher.error_answer(request, ErrorCode.illegal_sasl_state))
        return self._decode(frame)

    def _completed(self, server: SaslServer, reauthenticating: bool) -> str | None:
        """The principal once ``server`` completed (None before); raises if a
        re-authentication would change it."""
        if not server.complete:
            return None
        principal = user(server.authorization_id)
        if reauthenticating and principal != self.principal:
            old = (self.principal or "").replace(":", ".", 1)
            raise SaslAuthenticationError(
                f"Cannot change principals during re-authentication from {old}: "
                f"{principal.replace(':', '.', 1)}")
        return principal

    def _start_session(self, server: SaslServer) -> int:
        """Set the session's expiry; its lifetime in ms for the client (0: unlimited)."""
        max_reauth = self._config.max_reauth_ms
        expiry_ms = server.credential_expiry_ms
        now_ms = time.time() * 1000
        if expiry_ms is None and max_reauth <= 0:
            self.session_expiry = None
            return 0
        if expiry_ms is None:
            lifetime = max_reauth
        elif max_reauth <= 0:
            lifetime = max(int(expiry_ms - now_ms), 0)
        else:
            lifetime = max(min(int(expiry_ms - now_ms), max_reauth), 0)
        self.session_expiry = time.monotonic() + lifetime / 1000
        return lifetime
