"""One client socket as a stream of Kafka frames (Kafka's ``NetworkReceive`` under a
``KafkaChannel``): reads size-prefixed frames with the fewest copies, writes response buffers
with flow control.

Reading is an :class:`asyncio.BufferedProtocol`, so the event loop receives straight into
buffers given by this class:

- small frames (and size prefixes) land in a 64 KiB scratch buffer and are cut out of it as
  ``bytes``; a frame cut short by the end of a read is carried over to the next one;
- a frame larger than the scratch buffer (a produce request of record batches) gets a buffer of
  its own, exactly its size and not zeroed first (services.common.buffers), and the rest of it
  is received in place: no copy from a stream buffer, no buffer growth, no shifting of what
  follows. Such a frame is handed over, as a read-only ``memoryview``, only once it is whole.

The scratch buffer is one per thread (so per event loop), shared by every connection: an idle
connection holds no receive buffer, and 2,000 of them cost no more than a few. Sharing is safe
because a transport calls :meth:`~FrameChannel.get_buffer`, fills the buffer and calls
:meth:`~FrameChannel.buffer_updated` in one step (plain TCP and TLS, asyncio and uvloop), and
``buffer_updated`` copies out everything it keeps (frames, a carried-over start of one, the
first bytes of a large frame) before it returns; nothing refers to the scratch buffer between
reads.

Each frame is stamped with the time its last byte arrived, the start of Kafka's request-queue
time. Complete frames wait in a queue until the connection takes them; past
``_QUEUED_BYTES_LIMIT`` queued bytes the socket stops being read (as a muted Kafka channel), so a
client that pipelines requests cannot make the frontend buffer without bound.

Every frame's size is taken from the frontend's :class:`~.memory_pool.MemoryPool`
(``queued.max.request.bytes``) once its size prefix is read, before its body is received, and
given back when the connection is done with the request (:meth:`FrameChannel.request_done`) or
closes. While the pool is exhausted the socket is not read: the frame waits in the socket
buffers, and the connection in the pool's line.

A size prefix that is negative or above the limit (socket.request.max.bytes) stops reading; the
frames before it are still served, then :meth:`FrameChannel.read_frame` raises
:class:`~.framing.FrameError` and the connection closes. So does a frame cut short by the end of
the stream. Not thread-safe (one event loop).
"""

from __future__ import annotations

import asyncio
import collections
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

from services.common.buffers import unfilled
from services.common.file_records import FileSlice

from .framing import FrameError
from .memory_pool import MemoryPool
from .metrics import SENDFILE_BYTES

_SCRATCH_BYTES = 64 * 1024
# The most one sendfile call sends before the loop serves the other connections.
_SENDFILE_BYTES = 1 << 20
# Bytes of complete frames held before the socket is paused.
_QUEUED_BYTES_LIMIT = 1 << 20

Frame = bytes | memoryview

_thread_scratch = threading.local()


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _shared_scratch() -> memoryview:
    """This thread's scratch buffer, made on first use."""
    scratch: memoryview | None = getattr(_thread_scratch, "buffer", None)
    if scratch is None:
        scratch = _thread_scratch.buffer = memoryview(bytearray(_SCRATCH_BYTES))
    return scratch


class FrameChannel(asyncio.BufferedProtocol):
    """A client connection's frames in, response buffers out. ``on_connect(channel)`` runs as a
    task once the connection is made; its end does not close the socket (call :meth:`close`)."""

    def __init__(self, max_frame_bytes: int,
                 on_connect: Callable[[FrameChannel], Awaitable[None]],
                 memory: MemoryPool | None = None) -> None:
        self._max_frame_bytes = max_frame_bytes
        self._memory = memory if memory is not None else MemoryPool(0)
        self._on_connect = on_connect
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        # Shared with every connection of this thread: valid only within one read.
        self._scratch = _shared_scratch()
        # The start of a small frame (or of a size prefix) that the last read cut short.
        self._carry = bytearray()
        # A large frame being received in place, and how much of it has arrived.
        self._body: memoryview | None = None
        self._body_filled = 0
        self._frames: collections.deque[tuple[Frame, float]] = collections.deque()
        self._queued_bytes = 0
        # Pool bytes held for frames: received or being received, and handed out (the
        # request the connection is working on) but not yet given back.
        self._held_bytes = 0
        self._handed_out_bytes = 0
        # Waiting in the pool's line for memory for the frame at the start of ``_carry``.
        self._waiting_memory = False
        self._reading_paused = False
        self._error: FrameError | None = None
        self._eof = False
        self._lost: BaseException | None = None
        self._closed = False
        self._read_waiter: asyncio.Future[None] | None = None
        self._writing_paused = False
        # Plain TCP keeps the write side open after the client's EOF; TLS cannot (a TLS
        # close is a whole close).
        self._half_close = True
        # The connection writes one answer at a time: at most one drain waits,
        self._drain_waiter: asyncio.Future[None] | None = None
        # or one wait for the socket to take more of a file slice.
        self._writable_waiter: asyncio.Future[None] | None = None
        self._sendfile = False

    # -- asyncio protocol callbacks ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = transport  # type: ignore[assignment]
        self._half_close = transport.get_extra_info("ssl_object") is None
        # File slices go to a plain TCP socket with sendfile.
        self._sendfile = self._half_close and transport.get_extra_info("socket") is not None
        # The server keeps the connection's task (the loop holds tasks only weakly).
        self._loop.create_task(self._on_connect(self))

    def get_buffer(self, sizehint: int) -> memoryview:
        body = self._body
        if body is not None:
            return body[self._body_filled:]
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        now = time.perf_counter()
        body = self._body
        if body is not None:
            self._body_filled += nbytes
            if self._body_filled == len(body):
                self._body = None
                self._deliver(body.toreadonly(), now)
            return
        if self._error is None:
            self._cut_frames(self._scratch[:nbytes], now)

    def eof_received(self) -> bool:
        self._eof = True
        self._check_complete_at_eof()
        self._wake_reader()
        # Keep the write side open: responses to what was read can still go out.
        return self._half_close

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._closed = True
        self._lost = exc if exc is not None else ConnectionResetError("connection lost")
        # Complete frames are still served (an acks=0 Produce sent just before closing); a
        # frame being received or waiting for memory never will be.
        self._drop_incomplete()
        # uvloop's TLS protocol keeps this channel's bound methods after the connection is
        # lost; with the transport held here that makes a cycle the garbage collector does not
        # free (measured: every closed TLS connection, about 30 KB each, stayed for good).
        self._transport = None
        self._wake_reader()
        for waiter in (self._drain_waiter, self._writable_waiter):
            if waiter is not None and not waiter.done():
                waiter.set_exception(ConnectionResetError("connection lost"))

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    # -- frames -----------------------------------------------------------------------------

    def _cut_frames(self, data: memoryview, now: float) -> None:
        if self._waiting_memory:
            # A transport may deliver what it had already read after reading was paused.
            self._carry += data
            return
        if self._carry:
            self._carry += data
            data = memoryview(bytes(self._carry))
            self._carry.clear()
        position, end = 0, len(data)
        while end - position >= 4:
            size = int.from_bytes(data[position:position + 4], "big", signed=True)
            if size < 0 or size > self._max_frame_bytes:
                self._fail(FrameError(f"frame size {size} outside 0..{self._max_frame_bytes}"))
                return
            start = position + 4
            have = end - start
            if have < size <= _SCRATCH_BYTES:
                break  # the rest of a small frame comes with the next read
            if not self._memory.try_allocate(size):
                self._waiting_memory = True
                self._memory.wait(self._memory_available)
                self._carry += data[position:end]
                self._update_reading()
                return
            self._held_bytes += size
            if have >= size:
                self._deliver(bytes(data[start:start + size]), now)
                position = start + size
            else:
                # Filled whole before it is handed on: no zeros written first.
                body = memoryview(unfilled(size))
                body[:have] = data[start:end]
                self._body, self._body_filled = body, have
                return
        if position < end:
            self._carry += data[position:end]

    def _deliver(self, frame: Frame, arrived: float) -> None:
        self._frames.append((frame, arrived))
        self._queued_bytes += len(frame)
        if self._queued_bytes >= _QUEUED_BYTES_LIMIT:
            self._update_reading()
        self._wake_reader()

    def _fail(self, error: FrameError) -> None:
        if self._error is None:
            self._error = error
            self._update_reading()
        self._wake_reader()

    def _check_complete_at_eof(self) -> None:
        """After the client's EOF, a frame still incomplete never will be (frames waiting for
        memory are complete or not once they are cut)."""
        if self._eof and not self._waiting_memory and (self._body is not None or self._carry):
            self._fail(FrameError("connection closed inside a frame"))

    def _memory_available(self) -> None:
        """The pool has memory again: take up the frame that waited for it."""
        self._waiting_memory = False
        if self._closed or self._error is not None:
            return
        self._cut_frames(memoryview(b""), time.perf_counter())
        self._check_complete_at_eof()
        self._update_reading()
        self._wake_reader()

    def _update_reading(self) -> None:
        """Read the socket unless the connection failed, waits for memory, or has enough
        frames queued."""
        transport = self._transport
        if transport is None or self._closed:
            return
        pause = (self._error is not None or self._waiting_memory
                 or self._queued_bytes >= _QUEUED_BYTES_LIMIT)
        if pause and not self._reading_paused:
            self._reading_paused = True
            transport.pause_reading()
        elif not pause and self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()

    def _drop_incomplete(self) -> None:
        if self._waiting_memory:
            self._memory.cancel_wait(self._memory_available)
            self._waiting_memory = False
        self._carry.clear()
        if self._body is not None:
            self._held_bytes -= len(self._body)
            self._memory.release(len(self._body))
            self._body = None

    def _give_back_unread(self) -> None:
        """Return to the pool what frames not yet handed out hold (the connection closes)."""
        self._drop_incomplete()
        unread = self._held_bytes - self._handed_out_bytes
        self._held_bytes = self._handed_out_bytes
        self._frames.clear()
        self._queued_bytes = 0
        self._memory.release(unread)

    def request_done(self) -> None:
        """The request last read is answered: its bytes go back to the pool."""
        done, self._handed_out_bytes = self._handed_out_bytes, 0
        self._held_bytes -= done
        self._memory.release(done)

    def _wake_reader(self) -> None:
        waiter = self._read_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def read_frame(self) -> tuple[Frame, float] | None:
        """The next frame and when its last byte arrived (``time.perf_counter``), or None when
        the client closed the connection between frames.

        Raises :class:`FrameError` (after every frame before the fault was taken) for a size
        out of bounds or a frame cut short."""
        # Asking for the next request means the one before is done (for a reader that does
        # not call request_done, as the SASL exchange).
        self.request_done()
        while not self._frames:
            if self._error is not None:
                raise self._error
            if self._eof and not self._waiting_memory:
                return None
            self._read_waiter = self._loop.create_future()
            try:
                await self._read_waiter
            finally:
                self._read_waiter = None
        frame, arrived = self._frames.popleft()
        self._queued_bytes -= len(frame)
        self._handed_out_bytes = len(frame)
        if self._reading_paused:
            self._update_reading()
        return frame, arrived

    # -- writing ----------------------------------------------------------------------------

    def write(self, buffers: Iterable[bytes | bytearray | memoryview]) -> None:
        """Send one response's buffers (as they are, no joining)."""
        if self._transport is None or self._closed:
            raise ConnectionResetError("connection lost")
        self._transport.writelines(buffers)

    async def send(self, buffers: Sequence[bytes | bytearray | memoryview | FileSlice]) -> None:
        """Send one response's buffers, as :meth:`write` then :meth:`drain`; a
        :class:`FileSlice` among them goes from its file to the socket with ``sendfile`` on
        plain TCP (its bytes never copied through this process), and is read on TLS. Every
        slice is closed once this returns. A slice whose file no longer holds it (cut since)
        raises ConnectionAbortedError: the frame's size is already sent, so the connection
        must close."""
        try:
            start = 0
            for index, piece in enumerate(buffers):
                if type(piece) is FileSlice:
                    if start < index:
                        self.write(buffers[start:index])  # type: ignore[arg-type]
                    await self._send_slice(piece)
                    start = index + 1
            self.write(buffers[start:] if start else buffers)  # type: ignore[arg-type]
            await self.drain()
        finally:
            for piece in buffers:
                if type(piece) is FileSlice:
                    piece.close()

    async def _send_slice(self, piece: FileSlice) -> None:
        transport = self._transport
        if not self._sendfile or transport is None:
            data = piece.read()
            if data is None:
                raise ConnectionAbortedError("a fetched file range was cut while being sent")
            self.write((data,))
            return
        if self._closed or transport.is_closing():
            raise ConnectionResetError("connection lost")
        # A descriptor of our own for the socket: once the transport closes, its number may
        # be another connection's.
        socket_fd = os.dup(transport.get_extra_info("socket").fileno())
        try:
            # The socket takes the slice only once what the transport holds is written.
            while transport.get_write_buffer_size():
                await self._writable(socket_fd)
            position, left = piece.position, piece.size
            while left:
                try:
                    sent = os.sendfile(socket_fd, piece.fd, position, min(left, _SENDFILE_BYTES))
                except BlockingIOError:
                    sent = None
                if sent == 0:
                    raise ConnectionAbortedError("a fetched file range was cut while being sent")
                if sent is not None:
                    position += sent
                    left -= sent
                if left:
                    # The other connections have their turn until the socket has room (a
                    # client reading as fast as it is sent to would otherwise keep one
                    # sendfile going for the whole slice).
                    await self._writable(socket_fd)
        finally:
            os.close(socket_fd)
        SENDFILE_BYTES.inc(piece.size)

    async def _writable(self, socket_fd: int) -> None:
        waiter = self._writable_waiter = self._loop.create_future()
        self._loop.add_writer(socket_fd, _resolve, waiter)
        try:
            await waiter
        finally:
            self._loop.remove_writer(socket_fd)
            self._writable_waiter = None

    async def drain(self) -> None:
        """Wait while the socket's send buffer is over its high-water mark."""
        if self._closed:
            raise ConnectionResetError("connection lost")
        if not self._writing_paused:
            return
        self._drain_waiter = self._loop.create_future()
        await self._drain_waiter

    def extra_info(self, name: str) -> object:
        return self._transport.get_extra_info(name) if self._transport is not None else None

    def close(self) -> None:
        """Close the connection, giving back every byte its frames held."""
        self._give_back_unread()
        self.request_done()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
