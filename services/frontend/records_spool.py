"""The frontend's spool of produced record batches: files that the leader log nodes on this host
read a large Produce's batches from, so that those bytes cross no gRPC hop
(services.common.file_records).

Two gRPC hops cost about 1.8 s of CPU per GB between the frontend, a handler and a log node
(docs/performance.md, "The floor under the throughput targets"); writing the batches into a
tmpfs file and reading them back costs a fraction of that. A file's space is allocated when it
is made (``posix_fallocate``) and the file is mapped into memory; a request's batches are copied
into the mapping, after the previous request's, until the file is full, and it is then retired.
A copy into the mapped pages skips what the kernel does for each page a ``pwritev`` writes
(finds it, locks it, marks it dirty): 13 µs against 63 for 830 KB (docs/performance.md,
"Produced batches left in a spool file"). The space allocated beforehand keeps a copy from
meeting a full tmpfs, which a write reports as an error but a mapped page answers with SIGBUS.

Once every call that named a retired file has ended, it is written over from its start if each
of those calls was answered with ``file_records_settled`` (every service asked to read its
ranges answered, so none reads them late; writing over pages costs about a fifth of writing
fresh ones, docs/performance.md); otherwise it is removed (unmapped, closed and unlinked), so a
range that may still be read reads as written or not at all. A file left behind by a frontend
that died is removed when the next frontend on the host starts.

Only requests whose batches come to :data:`MIN_BYTES` or more, :data:`MIN_PAYLOAD_BYTES` or
more a partition on average, are spooled: for smaller ones the names and the reads cost more
than carrying the bytes. A file that cannot be made (the tmpfs full, say) carries that request's
batches and turns the spool off for :data:`PAUSE_SECONDS`.

Not thread-safe: used from the frontend's event loop.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from kbroker.handler.v1 import handler_pb2
from services.common.file_records import SPOOL_FILE
from services.common.payloads import SPLICE_MIN_BYTES, SPLICE_MIN_PAYLOAD_BYTES
from services.common.records.record_batch import HEADER_SIZE

log = logging.getLogger(__name__)

# What a spooled request's batches come to at least, in all and per partition on average: as
# for splicing them into a message (services.common.payloads), below which the walk costs more.
MIN_BYTES = SPLICE_MIN_BYTES
MIN_PAYLOAD_BYTES = SPLICE_MIN_PAYLOAD_BYTES
# How large a spool file grows before the next one starts.
FILE_BYTES = 16 * 1024 * 1024
# How long a failed write keeps the spool off.
PAUSE_SECONDS = 60.0
# Retired files kept to be written over; more are removed.
KEEP_FREE = 2

Payload = bytes | bytearray | memoryview


class _File:
    __slots__ = ("fd", "inode", "map", "path", "retired", "tainted", "users", "written")

    def __init__(self, path: str, fd: int, inode: int, mapped: mmap.mmap) -> None:
        self.path = path
        self.fd = fd
        self.inode = inode
        self.map = mapped
        self.written = 0
        self.users = 0
        self.retired = False
        # A call that named it ended unsettled: its ranges may still be read.
        self.tainted = False


@dataclass
class Spooled:
    """A request's batches in a spool file: the ranges, as the call names them, and each
    payload's head (what the request carries in their place: the first batch's header). Give
    it back to :meth:`RecordsSpool.release` once the call ended, saying whether it was
    settled."""

    ranges: list[handler_pb2.RequestFileRecords]
    heads: list[Payload | None]
    size: int
    _file: _File = field(repr=False)


class RecordsSpool:
    """Spool files in ``directory`` (a tmpfs, e.g. /dev/shm)."""

    def __init__(self, directory: str, file_bytes: int = FILE_BYTES) -> None:
        self._directory = os.path.abspath(directory)
        self._file_bytes = file_bytes
        self._current: _File | None = None
        self._free: list[_File] = []
        self._closing = False
        self._paused_until = 0.0
        self._remove_orphans()

    def write(self, payloads: Sequence[Payload | None]) -> Spooled | None:
        """``payloads`` written to the current spool file, or None when they are carried
        instead: too small in all or per partition, larger than half a file, or no file could
        be made for them."""
        size = sum(len(p) for p in payloads if p is not None)
        if (self._closing or size < MIN_BYTES or size < MIN_PAYLOAD_BYTES * len(payloads)
                or size > self._file_bytes // 2 or time.monotonic() < self._paused_until):
            return None
        try:
            spool = self._room_for(size)
        except OSError as exc:
            log.warning("cannot spool produced batches in %s (carrying them for %.0f s): %s",
                        self._directory, PAUSE_SECONDS, exc)
            self._paused_until = time.monotonic() + PAUSE_SECONDS
            if self._current is not None:
                self._retire(self._current)
            return None
        ranges, heads, position = [], [], spool.written
        mapped = spool.map
        for index, payload in enumerate(payloads):
            if not payload:
                heads.append(payload)
                continue
            mapped[position:position + len(payload)] = payload
            ranges.append(handler_pb2.RequestFileRecords(
                payload=index, path=spool.path, inode=spool.inode, position=position,
                size=len(payload)))
            heads.append(payload[:HEADER_SIZE])
            position += len(payload)
        spool.written = position
        spool.users += 1
        return Spooled(ranges, heads, size, spool)

    def release(self, spooled: Spooled, settled: bool) -> None:
        """The call that named ``spooled`` ended: answered with ``file_records_settled``
        (``settled``), or otherwise (an answer without it, a failure, given up)."""
        spool = spooled._file
        spool.users -= 1
        if not settled:
            spool.tainted = True
        if spool.retired and spool.users == 0:
            self._done(spool)

    def close(self) -> None:
        """Remove the files (those still named by a call when its last call ends)."""
        self._closing = True
        if self._current is not None:
            self._retire(self._current)
        while self._free:
            self._remove(self._free.pop())

    def _room_for(self, size: int) -> _File:
        current = self._current
        if current is not None and current.written + size <= self._file_bytes:
            return current
        if current is not None:
            self._retire(current)
        if self._free:
            self._current = self._free.pop()
            self._current.retired = False
            return self._current
        name = f"kbroker-records-{os.getpid()}-{secrets.token_hex(8)}.spool"
        path = os.path.join(self._directory, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600)
        try:
            os.posix_fallocate(fd, 0, self._file_bytes)
            mapped = mmap.mmap(fd, self._file_bytes)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        self._current = _File(path, fd, os.fstat(fd).st_ino, mapped)
        return self._current

    def _retire(self, spool: _File) -> None:
        if self._current is spool:
            self._current = None
        spool.retired = True
        if spool.users == 0:
            self._done(spool)

    def _done(self, spool: _File) -> None:
        """A retired file no call names any more: written over next, or removed."""
        if spool.tainted or self._closing or len(self._free) >= KEEP_FREE:
            self._remove(spool)
        else:
            spool.written = 0
            self._free.append(spool)

    @staticmethod
    def _remove(spool: _File) -> None:
        spool.map.close()
        with contextlib.suppress(OSError):
            os.close(spool.fd)
        with contextlib.suppress(OSError):
            os.unlink(spool.path)

    def _remove_orphans(self) -> None:
        """Remove the spool files of frontends of this host that are gone."""
        try:
            names = os.listdir(self._directory)
        except OSError:
            return
        for name in names:
            if not SPOOL_FILE.fullmatch(name):
                continue
            pid = int(name.split("-")[2])
            try:
                os.kill(pid, 0)
                continue
            except ProcessLookupError:
                pass
            except OSError:
                continue  # alive, another user's
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self._directory, name))
