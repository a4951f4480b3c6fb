"""One Kafka client connection (Kafka's KafkaChannel with its mute/unmute discipline).

Requests on a connection are read, processed and answered strictly one at a time, in order:
the next frame is not read until the previous response is written (or, for Produce with
acks=0, until the request was processed), so pipelined requests wait in the socket buffer and
a client's ordering guarantees hold. Concurrency comes from many connections.

A malformed frame or request closes this connection only; no exception escapes
:meth:`Connection.serve`.
"""

from __future__ import annotations

import asyncio
import logging
import time

from .dispatcher import Dispatcher, UnanswerableRequestError
from .framing import FrameError, read_frame
from .metrics import CLOSED_CONNECTIONS, OPEN_CONNECTIONS

log = logging.getLogger(__name__)


class Connection:
    """Serves one client socket until the client leaves, misbehaves or the frontend stops."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 dispatcher: Dispatcher, max_request_bytes: int) -> None:
        self._reader = reader
        self._writer = writer
        self._dispatcher = dispatcher
        self._max_request_bytes = max_request_bytes
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.client_host = peer[0] if isinstance(peer, tuple) else ""
        local = writer.get_extra_info("sockname")
        # Which of the frontend's broker ports the client connected to.
        self.local_port = local[1] if isinstance(local, tuple) else 0
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
        except (FrameError, UnanswerableRequestError) as e:
            kind = getattr(e, "kind", "malformed")
            CLOSED_CONNECTIONS.labels(kind).inc()
            log.info("closing connection from %s: %s", self.peer, e)
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            log.debug("connection from %s lost: %s", self.peer, e)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("closing connection from %s after an unexpected error", self.peer)
        finally:
            OPEN_CONNECTIONS.dec()
            self._writer.close()

    async def _serve(self) -> None:
        reader, writer, dispatcher = self._reader, self._writer, self._dispatcher
        perf_counter = time.perf_counter
        # When each frame was complete in the reader's buffer (request-queue time starts).
        completed_at = getattr(reader, "completed_at", None)
        position = 0
        while not self._stopping:
            self.idle = True
            frame = await read_frame(reader, self._max_request_bytes)
            if frame is None:
                return
            self.idle = False
            started = perf_counter()
            position += len(frame) + 4
            received = completed_at(position) if completed_at is not None else started
            request = dispatcher.decode(frame)
            chunks = await dispatcher.handle(request, self.client_host, self.local_port)
            ready = sending = perf_counter()
            response_bytes = 0
            if chunks is not None:
                writer.writelines(chunks)
                await writer.drain()
                response_bytes = sum(map(len, chunks))
            done = perf_counter() if chunks is not None else sending
            request.metrics.observe(len(frame) + 4, response_bytes, received, started,
                                    request.remote_seconds, ready, sending, done)
