"""One Kafka client connection (Kafka's KafkaChannel with its mute/unmute discipline).

Requests on a connection are read, processed and answered strictly one at a time, in order:
the next frame is not read until the previous response is written (or, for Produce with
acks=0, until the request was processed), so pipelined requests wait in the socket buffer and
a client's ordering guarantees hold. Concurrency comes from many connections. A client over
its quotas (:mod:`.quotas`) is muted after its answer: no frame is read for the throttle time.

On a SASL listener the client authenticates first (:mod:`.sasl.authenticator`); afterwards
a SaslHandshake may start a re-authentication, and a request after the session expired
closes the connection.

A malformed frame or request closes this connection only; no exception escapes
:meth:`Connection.serve`.
"""

from __future__ import annotations

import asyncio
import logging
import time

from .dispatcher import Dispatcher, UnanswerableRequestError
from .framing import FrameError
from .metrics import CLOSED_CONNECTIONS, EXPIRED_CONNECTIONS_KILLED, OPEN_CONNECTIONS
from .network_receive import Frame, FrameChannel
from .sasl.authenticator import AuthenticationFailedError, SaslAuthenticator
from .session import ClientSession

log = logging.getLogger(__name__)


class Connection:
    """Serves one client socket until the client leaves, misbehaves or the frontend stops."""

    def __init__(self, channel: FrameChannel, dispatcher: Dispatcher, session: ClientSession,
                 sasl: SaslAuthenticator | None = None) -> None:
        self._channel = channel
        self._dispatcher = dispatcher
        self.session = session
        self._sasl = sasl
        peer = channel.extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        # True while waiting for the next frame: the connection can close without losing work.
        self.idle = True
        self._stopping = False

    def stop_after_current(self) -> None:
        """Finish the request in flight, if any, then close."""
        self._stopping = True

    async def serve(self) -> None:
        OPEN_CONNECTIONS.inc()
        try:
            await self._serve()
        except (FrameError, UnanswerableRequestError, AuthenticationFailedError) as e:
            kind = getattr(e, "kind", "malformed")
            CLOSED_CONNECTIONS.labels(kind).inc()
            log.info("closing connection from %s: %s", self.peer, e)
        except ConnectionError as e:
            log.debug("connection from %s lost: %s", self.peer, e)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("closing connection from %s after an unexpected error", self.peer)
        finally:
            OPEN_CONNECTIONS.dec()
            self._channel.close()

    async def _serve(self) -> None:
        channel, dispatcher, session, sasl = (self._channel, self._dispatcher, self.session,
                                              self._sasl)
        perf_counter = time.perf_counter
        if sasl is not None:
            session.principal = await sasl.authenticate()
        while not self._stopping:
            self.idle = True
            # ``received``: when the frame was complete (request-queue time starts).
            read = await channel.read_frame()
            if read is None:
                return
            frame, received = read
            self.idle = False
            if sasl is not None and await self._sasl_took(sasl, frame):
                continue
            started = perf_counter()
            request = dispatcher.decode(frame)
            chunks = await dispatcher.handle(request, session)
            ready = sending = perf_counter()
            response_bytes = 0
            if chunks is not None:
                response_bytes = sum(map(len, chunks))
                await channel.send(chunks)
            done = perf_counter() if chunks is not None else sending
            channel.request_done()
            request.metrics.observe(len(frame) + 4, response_bytes, received, started,
                                    request.remote_seconds, ready, sending, done)
            if request.charge is not None:
                # A throttled client's channel stays muted (no frame read) for the throttle
                # time after its answer (Kafka's ThrottledChannel, KIP-219).
                self.idle = True
                mute = request.charge.after_send(done - sending)
                if mute > 0:
                    await asyncio.sleep(mute)

    async def _sasl_took(self, sasl: SaslAuthenticator, frame: Frame) -> bool:
        """Whether ``frame`` began a re-authentication (now done); raises when the session
        expired (KIP-368: the connection closes)."""
        now = time.monotonic()
        if sasl.starts_reauthentication(frame, now):
            await sasl.reauthenticate(frame)
            return True
        if sasl.expired(now):
            EXPIRED_CONNECTIONS_KILLED.labels(self.session.listener).inc()
            raise AuthenticationFailedError("SASL session expired without re-authentication",
                                            kind="session_expired")
        return False
